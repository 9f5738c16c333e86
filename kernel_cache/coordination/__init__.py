"""What processes and threads agree on: file locks, per-key locks, atomic publication, wait budgets."""
