"""The payload handed to XLA: the custom call, jaxlib's Triton module image and its proto, and every
jaxlib difference (`jaxlib_compat`)."""
