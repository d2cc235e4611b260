"""Runtime support every layer above may use: logging, metrics, time budgets, memos, one fetch per
key, upstream slots, security events."""
