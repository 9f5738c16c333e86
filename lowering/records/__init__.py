"""Lowered-call records and autotune winners: what a lowering remembers of a whole call, and the tuning
that picks one config among many."""
