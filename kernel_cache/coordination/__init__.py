"""What processes and threads agree on: file locks, per-key locks, atomic publication, wait budgets."""

LOCK_MODES = ("auto", "flock", "soft")  # KERNEL_CACHE_LOCK: the shared level's lock kinds (`locks`)
