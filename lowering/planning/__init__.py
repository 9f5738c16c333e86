"""Planning a call: its target, configs (autotune, heuristics), argument types, launches and output
order, before anything is read from the store."""
