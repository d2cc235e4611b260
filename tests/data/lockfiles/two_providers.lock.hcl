# This file is maintained automatically by "terraform init".
# Manual edits may be lost in future updates.

provider "registry.opentofu.org/integrations/github" {
  version     = "6.2.1"
  constraints = ">= 6.0.0, < 7.0.0"
  hashes = [
    "h1:uzp5owknZ1dpDhNJtpa7+0a3mYN/l0AXiY0H7QdHyzo=",
  ]
}

provider "registry.terraform.io/hashicorp/random" {
  version = "3.6.0"
  hashes = [
    "h1:7+3+Tkx2O8Jeuorc1bfvz8PbHm6r+BGZq+J2cBQz+3c=",
  ]
}
