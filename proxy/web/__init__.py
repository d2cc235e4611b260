"""The HTTP layer: thin handlers per protocol over `proxy.mirror.Mirror`."""
