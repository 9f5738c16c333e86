"""The JAX front end: `triton_call`, its primitive, the lowering rule JAX calls, the custom call it
emits, and the device checks."""
