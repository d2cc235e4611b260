"""The module service: `modules.v1` passed through with module sources cached by the proxy, git
sources fetched with a locked-down git, and deterministic module tarballs."""
