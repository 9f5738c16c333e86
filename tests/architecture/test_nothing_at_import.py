"""Importing does nothing: `import lowering` (and `kernel_cache`, `compiler`) opens no store,
creates no directory, starts no thread and leaves JAX's settings as they were, even with every
setting that would do something at first use (a cache directory, JAX's cache beside it, compile
workers). The first Triton call does that work instead."""

from __future__ import annotations

import json

from conftest import run_python

PROBE = """
import json, os, sys, threading
import jax
names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
         "jax_persistent_cache_min_entry_size_bytes")
before = {n: getattr(jax.config, n) for n in names}
threads = {t.name for t in threading.enumerate()}
import kernel_cache, compiler, lowering
report = {"created": os.path.exists(os.environ["KERNEL_CACHE_DIR"]),
          "new_threads": sorted({t.name for t in threading.enumerate()} - threads),
          "jax_changed": {n: [before[n], getattr(jax.config, n)] for n in names if getattr(jax.config, n) != before[n]},
          "session": kernel_cache._default is not None}
if sys.argv[-1] == "bind":
    import functools
    import jax.numpy as jnp
    from lowering import examples
    s = jax.ShapeDtypeStruct((256,), jnp.float32)
    jax.jit(functools.partial(examples.add_program, block=256)).trace(s, s)
    report["after_bind"] = {"created": os.path.exists(os.environ["KERNEL_CACHE_DIR"]),
                            "jax_dir": jax.config.jax_compilation_cache_dir,
                            "threads": sorted({t.name for t in threading.enumerate()} - threads)}
print(json.dumps(report))
"""


def probe(tmp_path, mode: str) -> dict:
    cache = tmp_path / "new" / "cache"
    env = {"KERNEL_CACHE_DIR": str(cache), "KERNEL_CACHE_XLA": "1", "KERNEL_CACHE_COMPILE_WORKERS": "4",
           "XDG_CACHE_HOME": str(tmp_path / "home")}
    proc = run_python(PROBE.replace("sys.argv[-1]", repr(mode)), env)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_creates_nothing_starts_nothing_and_leaves_jax_alone(tmp_path):
    report = probe(tmp_path, "import")
    assert report == {"created": False, "new_threads": [], "jax_changed": {}, "session": False}
    assert not (tmp_path / "new").exists() and not (tmp_path / "home").exists()


def test_the_first_bound_call_opens_the_session(tmp_path):
    after = probe(tmp_path, "bind")["after_bind"]
    assert after["created"] and after["jax_dir"] == str(tmp_path / "new" / "cache" / "xla")
    assert set(after["threads"]) <= {"kernel-cache-toolchain"}  # the fingerprint's head start, if not done yet
