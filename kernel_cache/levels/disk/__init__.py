"""The disk level whole: the level, its diskcache index, the SQL it owns and the index's repair."""
