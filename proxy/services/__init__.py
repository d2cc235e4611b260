"""The shared services under the provider and module services: cached upstream documents, one fetch
per key in the fleet, verified downloads into the store, downloads followed as they grow, relays, readiness."""
