"""The shared level: plain files in a directory many hosts mount."""
