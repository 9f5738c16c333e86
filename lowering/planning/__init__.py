"""Planning a call before anything is read from the store: its parameters as one value, its target,
configs, argument types, launches and output order."""
