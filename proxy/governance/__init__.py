"""What may enter and what is held: the policy and its gatekeeper, the audit trail, the inventory
of what the proxy caches and the catalog with its purge."""
