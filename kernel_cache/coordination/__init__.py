"""What processes and threads agree on: file locks and per-key locks (atomic publication is
`trust.safefs`'s, the budget of waiting for them the store's)."""

LOCK_MODES = ("auto", "flock", "soft")  # KERNEL_CACHE_LOCK: the shared level's lock kinds (`locks`)
