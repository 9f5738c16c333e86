"""Planning a call: the call's parameters as one value (`bound_call`, `frozen_items`), its target,
configs (autotune, heuristics), argument types, launches and output order, before anything is read
from the store."""
