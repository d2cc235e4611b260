"""Everything that talks to upstreams: the HTTP client and its SSRF guard, git, and the discovery,
`providers.v1` and `modules.v1` protocols."""
