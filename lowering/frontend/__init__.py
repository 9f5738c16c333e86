"""The JAX front end: `triton_call`, its primitive, the lowering rule JAX calls, the call's parameters
as one value, and the device checks."""
