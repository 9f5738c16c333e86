"""Child process for tests/clients/test_clients.py: cross-lower the client programs for sm_90, report as JSON.

    python tests/support/client_child.py OUT.json [--own] [--labels a,b] [--intercept-in-code jax_triton]

The environment decides interception (KERNEL_CACHE_INTERCEPT, read by the .pth hook at start-up).
`--own` makes the clients' own paths cross-lowerable on a CPU host: they read the compute capability
from the GPU, so it is answered with 90 here (test scaffolding; the product never does this).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]


class _Capability90:
    """jaxlib's gpu_triton module with get_compute_capability answering 90 (no GPU here)."""

    def __init__(self, real):
        self._real = real

    def get_compute_capability(self, device=0):
        return 90

    def __getattr__(self, name):
        return getattr(self._real, name)


def _own_paths_without_gpu() -> None:
    import ejkernel.callib._triton_call as ejk
    import jax_triton.triton_lib as jtl

    jtl.triton_kernel_call_lib = _Capability90(jtl.triton_kernel_call_lib)
    ejk._get_cuda_compute_capability = lambda device: 90


def _digest(call: dict) -> dict:
    """The decoded call with bulky text replaced by digests (what the kernels are stays comparable)."""
    def kernel_calls(c):
        if "kernel_call" in c:
            yield c["kernel_call"]
        for config in c.get("autotuned", {}).get("configs", []):
            yield config["kernel_call"]

    for kc in kernel_calls(call):
        k = kc["kernel"]
        k["ptx"] = hashlib.sha256(k["ptx"].encode()).hexdigest()[:16]
        k["ttir"] = bool(k["ttir"])
        k.pop("module_image", None)
    call["metadata"] = repr(call["metadata"])
    return call


def _rules() -> dict:
    """client -> the module whose function lowers its primitive on cuda now."""
    import ejkernel.callib._triton_call as ejk
    import jax_triton.triton_lib as jtl
    from jax._src.interpreters import mlir

    found = {}
    for client, module in (("jax_triton", jtl), ("ejkernel", ejk)):
        rule = mlir._platform_specific_lowerings["cuda"][module.triton_kernel_call_p].rule
        found[client] = getattr(rule, "func", rule).__module__
    return found


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    imported_before = "kernel_cache" in sys.modules  # the .pth hook imports it only when asked to
    import jax

    if "--intercept-in-code" in argv:
        from jax_triton import triton_call  # noqa: F401  (bound before interception starts)

        import kernel_cache
        kernel_cache.intercept(argv[argv.index("--intercept-in-code") + 1])
    if "--own" in argv:
        _own_paths_without_gpu()
    from scripts import client_programs

    programs = client_programs.programs()
    report: dict = {"kernel_cache_at_start": imported_before, "programs": {},
                    "kernel_cache_with_clients": "kernel_cache" in sys.modules, "rules": _rules()}
    import inspect_call  # imports lowering (and kernel_cache) itself: after the checks above

    labels = set(argv[argv.index("--labels") + 1].split(",")) if "--labels" in argv else None
    for client, label, fn, args in programs:
        if labels is not None and label not in labels:
            continue
        try:
            lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
        except Exception as exc:  # a client's own path may fail where ours does not (jax-triton's binding)
            report["programs"][label] = {"client": client, "error": f"{type(exc).__name__}: {exc}"[:500]}
            continue
        report["programs"][label] = {"client": client,
                                     "calls": [_digest(c) for c in inspect_call.custom_calls(lowered)]}
    write_report(report, out)


def write_report(report: dict, out: Path) -> None:
    """`report` with what interception did in this process (served and fallen-back calls per client,
    the store's counters, each client's state), written to `out` as JSON."""
    import kernel_cache
    from lowering.clients import tally

    report["tally"] = tally()
    report["stats"] = kernel_cache.default_store().stats.session()
    report["intercept"] = kernel_cache.interception.status()
    out.write_text(json.dumps(report, default=repr))


if __name__ == "__main__":
    main(sys.argv[1:])
