"""Child process for tests/clients/test_clients_te_real.py: cross-lower scripts/te_programs.py for sm_90 through
TE's real triton_call_lowering, report the decoded calls as JSON.

    python tests/support/te_child.py OUT.json [--own] [--labels a,b]

The environment decides interception (KERNEL_CACHE_INTERCEPT, read by the .pth hook at start-up).
`--own`: TE asks the GPU for its compute capability; answered with 90 here (test scaffolding).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    import jax

    from scripts import te_programs

    te = te_programs.load()
    if "--own" in argv:
        from client_child import _Capability90

        te.utils.gpu_triton = _Capability90(te.utils.gpu_triton)
    report: dict = {"te_version": te.version, "te_files": str(te.package_dir), "programs": {},
                    "te_modules": sorted(n for n in sys.modules if n.startswith("transformer_engine")),
                    "served_by": getattr(te.utils.triton_call_lowering, "__kernel_cache_client__", "te")}
    import inspect_call
    from client_child import _digest, write_report

    labels = set(argv[argv.index("--labels") + 1].split(",")) if "--labels" in argv else None
    for label, fn, args in te_programs.programs(concrete=False, labels=labels):
        lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
        report["programs"][label] = [_digest(c) for c in inspect_call.custom_calls(lowered)]
    write_report(report, out)


if __name__ == "__main__":
    main(sys.argv[1:])
