"""Who a client is: client tokens and their scopes, signed archive URLs, OIDC issuers and workload
tokens."""
