"""What XLA is handed, below the custom call that carries it (`frontend/custom_call`): jaxlib's Triton
module image and its proto, the fixed runs of deflate, and every jaxlib difference (`jaxlib_compat`)."""
