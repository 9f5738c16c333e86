"""Store benchmark, all measured side by side in one run on this machine.

Prints: memory-tier hit (µs), disk-tier hit for a 100 KB entry (ms, p50/p95), a cold Triton compile
of the example add kernel (s), and the toolchain fingerprint cost cold (Triton's triton_key +
ptxas --version) vs warm (our on-disk memo), with the ratios.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernel_cache import Config, Entry, Store  # noqa: E402


def percentile(samples, q):
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


def time_calls(fn, n):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="kc-bench-"))
    os.environ["KERNEL_CACHE_DIR"] = str(tmp / "memo")
    payload = {"cubin": os.urandom(100_000), "ptx": b"x" * 1000}
    store = Store(Config(dir=tmp / "store"))
    keys = [f"{i:032x}" for i in range(200)]
    for k in keys:
        store.put(Entry(key=k, meta={"name": "bench"}, blobs=payload))

    mem = time_calls(lambda: store.memory.get(keys[0]), 20000)
    mem_store = time_calls(lambda: store.get(keys[0]), 20000)
    fresh = Store(Config(dir=tmp / "store", memory_items=0))  # every get goes to disk
    it = iter(keys * 5)
    disk = time_calls(lambda: fresh.get(next(it)), 1000)
    assert fresh.get(keys[0])[1] == "disk"

    from compiler import compile_spec, content_key, toolchain
    from scripts.example_kernels import example_specs

    spec = dict(example_specs("sm_90"))["add"]
    t = time.perf_counter()
    toolchain.toolchain_fingerprint(spec.target)
    tc_cold = time.perf_counter() - t
    toolchain.clear_process_memo()
    t = time.perf_counter()
    toolchain.toolchain_fingerprint(spec.target)
    tc_warm = time.perf_counter() - t
    assert toolchain.expensive_calls == {"triton_key": 1, "backend_hash": 1}
    keyt = statistics.median(time_calls(lambda: content_key(spec), 200))
    compile_s = min(time_calls(lambda: compile_spec(spec), 3))

    print("kernel-cache store benchmark (this host)")
    print(f"  memory tier hit           p50 {statistics.median(mem) * 1e6:8.2f} µs   "
          f"p95 {percentile(mem, .95) * 1e6:8.2f} µs")
    print(f"  Store.get (memory)        p50 {statistics.median(mem_store) * 1e6:8.2f} µs   "
          f"p95 {percentile(mem_store, .95) * 1e6:8.2f} µs")
    print(f"  disk tier hit, 100 KB     p50 {statistics.median(disk) * 1e3:8.3f} ms   "
          f"p95 {percentile(disk, .95) * 1e3:8.3f} ms")
    print(f"  content key (add kernel)  p50 {keyt * 1e3:8.3f} ms")
    print(f"  cold compile (add, sm_90)     {compile_s:8.3f} s")
    print(f"  toolchain fingerprint: cold {tc_cold * 1e3:.1f} ms (triton_key + ptxas), "
          f"warm {tc_warm * 1e3:.3f} ms (memo) -> {tc_cold / tc_warm:.0f}x")
    print(f"  ratios: compile / disk hit = {compile_s / statistics.median(disk):.0f}x, "
          f"compile / memory hit = {compile_s / statistics.median(mem):.0f}x")


if __name__ == "__main__":
    main()
