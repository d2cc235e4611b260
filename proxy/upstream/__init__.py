"""Everything that talks to upstream registries: the HTTP client, discovery, providers.v1."""
