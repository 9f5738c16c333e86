"""Whether a cache and its host are sound: verify, verify --rebuild, doctor."""
