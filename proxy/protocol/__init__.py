"""The registry and HTTP protocols' shapes: discovery, `providers.v1` and `modules.v1` answers, the
proxy's own URLs, ranges, `Cache-Control`, forwarding headers, JSON from outside. Pure, no I/O."""
