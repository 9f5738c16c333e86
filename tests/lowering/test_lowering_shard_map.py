"""Inside shard_map a Triton call lowers per device, with the shard's shapes; outside, several
devices are refused (tests in test_lowering.py)."""

import json
import textwrap

from conftest import run_python

SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    try:
        from jax import shard_map
    except ImportError:
        from jax.experimental.shard_map import shard_map
    sys.path.insert(0, "tests")  # the repo root is the working directory
    import inspect_call
    from lowering import examples as ep

    assert len(jax.devices()) == 2, jax.devices()
    mesh = Mesh(np.array(jax.devices()), ("x",))
    f = jax.jit(shard_map(lambda x, y: ep.add_program(x, y, block=256), mesh=mesh,
                          in_specs=(P("x"), P("x")), out_specs=P("x")))
    s = jax.ShapeDtypeStruct((4096,), jnp.float32)
    calls = inspect_call.custom_calls(f.trace(s, s).lower(lowering_platforms=("cuda",)))
    print(json.dumps([{"target": c["target"], "grid": c["kernel_call"]["grid"],
                       "params": c["kernel_call"]["parameters"]} for c in calls]))
""")


def test_call_inside_shard_map_lowers_with_per_device_shapes(tmp_path):
    out = run_python(SCRIPT, {"XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu",
                              "KERNEL_CACHE_TARGET_ARCH": "sm_90", "KERNEL_CACHE_DIR": str(tmp_path)})
    calls = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(calls) == 1
    call = calls[0]
    assert call["grid"] == [2048 // 256, 1, 1]  # each device adds its 2048-element shard
    assert {"i32": 2048} in call["params"]
