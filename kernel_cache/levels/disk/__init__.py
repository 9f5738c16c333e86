"""The disk level whole: the level, its layout, our own SQLite index of its value files, the index's
rebuild and repair, and the upgrade of a directory an older kernel-cache indexed with diskcache."""
