"""The HTTP layer: thin handlers per protocol over the services (`proxy.mirror`, `proxy.module_mirror`)."""
