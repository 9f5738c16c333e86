"""After an upgrade a program's first miss compiles, at once, what it compiled last time: the
warm set its first call's lineage names (another toolchain's) lists its kernels, and each whose
kernel this process already imported is compiled before the jit that calls it is traced. A kernel
whose module is not imported is never imported to find out. The upgrade is simulated as the tests
do it everywhere: an environment variable Triton counts as changing compiled output
(`TRITON_DISABLE_LINE_INFO`), so every key and signature is new while the lineage is the same.
Cross-lowered for sm_90 on a CPU host."""

from __future__ import annotations

import json

from conftest import run_python

UPGRADE = {"TRITON_DISABLE_LINE_INFO": "1"}

# Lowers the programs named in LABELS, one jit each, in order; EXTRA=1 also lowers a program whose
# kernel lives in a module of its own (ext_kernels, on the path in tmp). Reports which thread
# compiled which kernel, and which kernels the lowering of the last program compiled itself.
CHILD = """
import json, os, sys, threading, time
sys.path.insert(0, os.environ["EXT_DIR"])
import jax, jax.numpy as jnp
import compiler.cache_or_compile, kernel_cache, lowering as jt
from lowering.examples import programs

compiled = []
real = compiler.cache_or_compile.compile_spec
def recorded(spec):
    compiled.append([spec.name, threading.current_thread().name, time.perf_counter()])
    return real(spec)
compiler.cache_or_compile.compile_spec = recorded

chosen = {label: (fn, args) for label, fn, args in programs(compute_capability=90)}
labels = os.environ["LABELS"].split(",")
marks = {}
for label in labels:
    if label == "ext":
        import ext_kernels
        x = jnp.ones(1024, jnp.float32)
        fn, args = ext_kernels.program, (x,)
    else:
        fn, args = chosen[label]
    if os.environ.get("SETTLE"):  # the first program's miss predicted the rest: let the workers finish
        time.sleep(float(os.environ["SETTLE"])) if label != labels[0] else None
    marks[label] = time.perf_counter()
    jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
print(json.dumps({"compiled": compiled, "marks": marks, "ext_imported": "ext_kernels" in sys.modules,
                  "stats": kernel_cache.default_store().stats.session()}))
"""

EXT = '''
import jax, triton, triton.language as tl
import lowering as jt

@triton.jit
def negate(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + i, -tl.load(x_ptr + i, mask=i < n), mask=i < n)

def program(x):
    return jt.triton_call(x, x.size, kernel=negate, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          grid=(x.size // 256,), BLOCK=256, compute_capability=90)
'''


def _run(tmp_path, labels: list[str], **env: str) -> dict:
    (tmp_path / "ext").mkdir(exist_ok=True)
    (tmp_path / "ext" / "ext_kernels.py").write_text(EXT)
    base = {"KERNEL_CACHE_DIR": str(tmp_path / "cache"), "KERNEL_CACHE_COMPILE_WORKERS": "2",
            "KERNEL_CACHE_TARGET_ARCH": "sm_90", "JAX_PLATFORMS": "cpu", "EXT_DIR": str(tmp_path / "ext"),
            "LABELS": ",".join(labels)}
    out = run_python(CHILD, env={**base, **env}, timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_an_upgraded_process_compiles_the_later_jits_kernels_at_its_first_miss(tmp_path):
    first = _run(tmp_path, ["add[BLOCK=256]", "softmax", "ext"])
    assert {name for name, _, _ in first["compiled"]} >= {"add_kernel", "softmax_kernel", "negate"}

    upgraded = _run(tmp_path, ["add[BLOCK=256]", "softmax"], SETTLE="3", **UPGRADE)
    by_name = {name: (thread, when) for name, thread, when in upgraded["compiled"]}
    # softmax_kernel compiled on a compile worker, before its jit was traced: predicted at add's miss
    thread, when = by_name["softmax_kernel"]
    assert thread.startswith("kernel-cache-compile") and when < upgraded["marks"]["softmax"], upgraded
    assert upgraded["stats"]["compiles"] == 2  # add and softmax, each once; nothing else
    # the kernel of a module this process never imported was neither imported nor compiled
    assert upgraded["ext_imported"] is False and "negate" not in by_name


def test_a_process_that_finds_its_own_warm_set_predicts_nothing(tmp_path):
    _run(tmp_path, ["add[BLOCK=256]", "softmax"])
    again = _run(tmp_path, ["add[BLOCK=512]"])  # a new shape: a miss, but the program's own set is there
    assert [name for name, _, _ in again["compiled"]] == ["add_kernel"]
