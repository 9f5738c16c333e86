"""Read-only views: list, show, stats (and its Prometheus format)."""
