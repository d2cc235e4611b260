"""registry-proxy: a caching, verifying pull-through proxy for OpenTofu and Terraform."""

__version__ = "0.9.0"
