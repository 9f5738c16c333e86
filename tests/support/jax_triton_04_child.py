"""Child process for tests/clients/test_clients_jax_triton_04.py: cross-lower scripts/jax_triton_04_programs.py
through jax-triton 0.4 for sm_90 and report the decoded calls as JSON.

    python tests/support/jax_triton_04_child.py OUT.json [--own]

The environment decides interception (KERNEL_CACHE_INTERCEPT, read by the .pth hook at start-up).
`--own` runs jax-triton's own path, with its DCE rule adapted to this JAX (jax-triton 0.4.1's fails
on JAX 0.12; test scaffolding, as interception does it for users).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    import jax
    import jax_triton
    import jax_triton.triton_lib as jtl

    if "--own" in argv:
        from lowering.jax_compat import adapt_foreign_dce_rule
        adapt_foreign_dce_rule(jtl.triton_kernel_call_p)
    import inspect_call
    from client_child import _digest, write_report

    from scripts import jax_triton_04_programs

    report: dict = {"programs": {}}
    from lowering import tensor_descriptor
    for label, fn, args, _ in jax_triton_04_programs.programs(jax_triton, compute_capability=90,
                                                              tma=tensor_descriptor.supported()):
        try:
            lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
        except Exception as exc:
            report["programs"][label] = {"error": f"{type(exc).__name__}: {exc}"[:800]}
            continue
        text = lowered.as_text()
        report["programs"][label] = {"calls": [_digest(c) for c in inspect_call.custom_calls(lowered)],
                                     "cost_estimate_json": "cost_estimate_json" in text}
    write_report(report, out)


if __name__ == "__main__":
    main(sys.argv[1:])
