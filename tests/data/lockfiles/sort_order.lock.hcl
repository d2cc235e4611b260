# This file is maintained automatically by "terraform init".
# Manual edits may be lost in future updates.

provider "example.com/acme/thing" {
  version = "1.0.0"
  hashes = [
    "h1:oJZ0IBrn0bVRHFQ2JXMYGUS6Llfdjo8HphwzxfNo+0E=",
  ]
}

provider "example.com/acme/thing-x" {
  version = "1.0.0"
  hashes = [
    "h1:8d7hVP75dqbWEc1PPPrj3BnkKvROYyQvahf8C4eKgJc=",
  ]
}

provider "example.com/acme-x/thing" {
  version = "1.0.0"
  hashes = [
    "h1:+dfmjn3qdzsN/oIS1RRbi88h2CIx6EzOnmfob4UjR5I=",
  ]
}

provider "example.com.au/acme/thing" {
  version = "1.0.0"
  hashes = [
    "h1:ni56YgO80u9/yTDdA+MutjxvBnyzSHDgliKTskbKVIU=",
  ]
}

provider "registry.terraform.io/hashicorp/aws" {
  version     = "5.40.0"
  constraints = "5.40.0"
  hashes = [
    "h1:plfqEaldQaPUoF12PdEjn9pFPuvB1haQg6CSzg2Vuok=",
  ]
}

provider "münchen.de/acme/cloud" {
  version = "1.2.3"
  hashes = [
    "h1:7/WX1tFjIf5vqvMeMidUEeA8FazndHZN7APLjiSi41w=",
  ]
}
