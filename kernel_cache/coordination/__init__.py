"""File locks, what processes on one node or many agree on (atomic publication is `trust.safefs`'s;
the store's single flight adds per-key thread locks and the budget of waiting)."""

LOCK_MODES = ("auto", "flock", "soft")  # KERNEL_CACHE_LOCK: the shared level's lock kinds (`locks`)
