"""Filling a cache ahead of a job: prewarm from recipes or programs, and tune."""
