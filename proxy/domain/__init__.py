"""The Terraform ecosystem's values: addresses, versions and constraints, hashes, lock files, module
sources, upstream credentials, the unsigned-providers rule. Pure: values in, values out, no I/O."""
