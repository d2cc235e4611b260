# This file is maintained automatically by "terraform init".
# Manual edits may be lost in future updates.

provider "münchen.de/acme/cloud" {
  version     = "1.2.3"
  constraints = "1.2.3"
  hashes = [
    "h1:7/WX1tFjIf5vqvMeMidUEeA8FazndHZN7APLjiSi41w=",
  ]
}
