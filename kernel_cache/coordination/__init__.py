"""What processes and threads agree on: file locks, per-key locks, wait budgets (atomic
publication is `trust.safefs`'s)."""

LOCK_MODES = ("auto", "flock", "soft")  # KERNEL_CACHE_LOCK: the shared level's lock kinds (`locks`)
