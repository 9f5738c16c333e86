"""What bounds a cache: prune, clear, and the stored size bound (`config`)."""
