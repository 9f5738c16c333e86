"""What the store tells: counters, listeners, lookup lines, once-per-process warnings."""
