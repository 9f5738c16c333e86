"""Whom to trust: signing, the safe file layer, the cache directory's marker, XLA's directory."""
