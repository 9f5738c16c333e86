"""Compile-ahead: a cold process hands every call traced so far to compile workers at its first miss."""
