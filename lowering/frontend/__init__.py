"""The JAX front end: `triton_call`, its primitive, the lowering rule JAX calls, and the device checks."""
