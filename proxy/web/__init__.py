"""The HTTP layer: thin handlers per protocol over the services (`proxy.providers.mirror`, `proxy.modules.mirror`)."""
