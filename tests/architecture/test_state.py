"""State with an owner: every per-process memo lives in the session
(`kernel_cache.Session.memo`, dropped by `configure()`), unless it remembers a fact of the installed
software or the devices, or a pure function of its key (`kernel_cache/session.py`). This test reads
every module of the core, the compiler and the lowering (the operator's floor, `cachectl/`,
runs one command per process) and finds its module-level mutable state (a dict, list, set or LRU bound
at module level, a weak set or dictionary, a `threading.local`, a `BoundedMemo`, a
`functools.cache`/`lru_cache`d function, a `global` rebound in a function): each
must be listed here with why it may stay module-level, so a new memo is a decision, not an accident.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

# "module:name" -> why it is not the session's
FACT = "a fact of the installed software or the devices, true under any configuration"
PURE = "a pure function of its key"
CONSTANT = "a constant"
PROCESS = "the process's own (not a memo): the same whatever the configuration"
MODULE_STATE = {
    "compiler/triton_compat.py:make_backend": f"{PURE} (the target) under the installed Triton",
    "compiler/triton_compat.py:_params": f"{PURE} (a JITFunction's parameters' flags and constexpr defaults)",
    "compiler/triton_compat.py:specialize": f"{PURE} (a value's Triton type and specialization)",
    "compiler/triton_compat.py:BACKEND_DIRS": CONSTANT,
    "compiler/triton_compat.py:triton_env": f"{PURE} (the C environment, as its array of strings)",
    "lowering/frontend/custom_call.py:_row_major": f"{PURE} (a rank -> its row-major layout)",
    "compiler/portable.py:_memo": f"{FACT}: installed files, keyed by their identity (path and stat)",
    "compiler/toolchain.py:_process_memo": f"{FACT}: the fingerprint, keyed by the identity of the files it hashes",
    "compiler/toolchain.py:_per_target": f"{FACT}: the fingerprint per target, keyed by those files' identity",
    "compiler/toolchain.py:_claimed": f"{FACT}: the memo directories claimed as kernel-cache's",
    "compiler/toolchain.py:_primed": f"{PROCESS}: whether the fingerprint's head start began",
    "compiler/toolchain.py:generation": f"{PROCESS}: how often the installed tools were to be read anew",
    "compiler/triton_compat.py:_readers": f"{PURE} (a JITFunction's source: the reads Triton's key misses)",
    "compiler/inputs.py:_known_inputs": f"{FACT}: compile inputs per environment and installed tools",
    "compiler/__init__.py:_LATER": f"{CONSTANT} (the names imported at their first use, by module)",
    "compiler/examples.py:MATMUL_CONFIGS": f"{CONSTANT} (the example kernel's autotune configs)",
    "compiler/artifact.py:LAUNCHED_FROM": f"{CONSTANT} (per backend, the blob a launcher is built from)",
    "lowering/clients/primitive_client.py:_TARGETS": CONSTANT,
    "lowering/clients/served.py:_tally": f"{PROCESS}: how many client calls were served or left to the client",
    "lowering/clients/transformer_engine.py:_OPTIONAL": CONSTANT,
    "lowering/clients/transformer_engine.py:_REQUIRED": CONSTANT,
    "lowering/clients/transformer_engine.py:_TE_DEFAULTS": CONSTANT,
    "lowering/compile_ahead/ahead.py:_noted": f"{PROCESS}: the calls it traced and has not lowered",
    "lowering/payload/deflate.py:_runs": f"{PURE} (a raw part's digest -> its compressed run)",
    "lowering/payload/jaxlib_compat.py:_takes_scratch": f"{FACT}: jaxlib's TritonKernel constructor per class",
    "lowering/payload/jaxlib_compat.py:_layout_in_plugin": f"{FACT}: the plugin's schema, read once per process",
    "lowering/payload/jaxlib_compat.py:ffi_target_registered": f"{FACT}: jaxlib's registered FFI targets",
    "lowering/payload/jaxlib_compat.py:plugin_installed": f"{FACT}: whether jaxlib's own plugin is installed",
    "lowering/payload/jaxlib_compat.py:triton_module": f"{FACT}: the plugin's extension module",
    "lowering/payload/proto.py:_FILE_FIELDS": CONSTANT,
    "lowering/planning/kernels.py:pointer_type": f"{PURE} (a dtype -> its pointer type)",
    "lowering/planning/kernels.py:_TRITON_DTYPES": CONSTANT,
    "lowering/planning/plan.py:dtype_info": f"{PURE} (a dtype -> its name and item size)",
    "lowering/planning/plan.py:target_of": f"{FACT}: the target of (platform, call's arch, configured arch)",
    "lowering/planning/plan.py:first_device": f"{FACT}: the visible device",
    "lowering/records/call_key.py:code_identity": f"{FACT}: the compiler's and lowering's sources",
    "lowering/records/call_key.py:_static": f"{FACT}: the key's text of the code, target, tools and kernel function",
    "lowering/records/call_key.py:_inputs": f"{FACT}: a call's compile inputs per environment and installed tools",
    "lowering/records/call_key.py:_module_part": f"{PURE} (Triton's environment and jaxlib's capabilities -> their text)",
    "lowering/records/winners.py:_SHORT": CONSTANT,
    "lowering/records/winners.py:_device_kind": f"{FACT}: the visible GPU's model",
    "kernel_cache/__init__.py:_default": "the session itself: replaced whole by configure()",
    "kernel_cache/entries/canonical.py:_OPEN": CONSTANT,
    "kernel_cache/settings/config.py:_SECONDS": CONSTANT,
    "kernel_cache/settings/config.py:_UNITS": CONSTANT,
    "kernel_cache/sanitize.py:_NAMED": CONSTANT,
    "kernel_cache/interception.py:CLIENT_MODULES": CONSTANT,
    "kernel_cache/interception.py:_state": f"{PROCESS}: the import hooks installed in it",
    "kernel_cache/interception.py:_watched": f"{PROCESS}: the client modules its import hook waits for",
    "kernel_cache/front_level.py:_open_sets": f"{PROCESS}: the sessions' warm sets still to save at exit (weakly held)",
    "kernel_cache/levels/remote/redis_guard.py:_current": f"{PROCESS}: each thread's budget for the call under way",
    "compiler/compile_processes.py:_pool": f"{PROCESS}: its compile worker processes (closed when idle and at exit)",
    "compiler/compile_processes.py:_threads": f"{PROCESS}: its compile threads (what is queued cancelled at exit)",
    "kernel_cache/at_exit.py:_steps": f"{PROCESS}: the package's one exit sequence, a function per step",
    "kernel_cache/levels/entry_files.py:LOCK_SUFFIXES": CONSTANT,
    "kernel_cache/levels/entry_files.py:_FANOUT_CHARS": CONSTANT,
    "kernel_cache/coordination/locks.py:_FLOCK_COHERENT": CONSTANT,
    "kernel_cache/trust/safefs.py:_fault_hook": f"{PROCESS}: the one fault-injection hook (tests)",
    "kernel_cache/telemetry/stats.py:DURATION_NAMES": CONSTANT,
    "kernel_cache/telemetry/stats.py:EVENT_NAMES": CONSTANT,
    "kernel_cache/telemetry/stats.py:_listeners": f"{PROCESS}: the telemetry listeners a program registered",
    "kernel_cache/telemetry/stats.py:_recorders": f"{PROCESS}: the telemetry recorders (jax.monitoring's)",
    "kernel_cache/entries/summary.py:USUAL_OPTIONS": CONSTANT,
    "kernel_cache/telemetry/warnings_once.py:_seen": f"{PROCESS}: each warning said once per process",
}
_MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "Counter", "deque", "SizedLRU", "of_bytes", "EnvironMemo",
                  "WeakSet", "WeakKeyDictionary", "WeakValueDictionary", "local", "BoundedMemo"}
_MEMO_DECORATORS = {"cache", "lru_cache", "cached_property"}


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _mutable(value: ast.AST | None) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and _name(value.func.value) in _MUTABLE_CALLS:
        return True  # made by a class method of a memo type (`BoundedMemo.of(n)`)
    return isinstance(value, ast.Call) and _name(value) in _MUTABLE_CALLS


def module_state(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in tree.body:
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign) and _mutable(node.value):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign) and _mutable(node.value):
            targets = [node.target]
        found.update(t.id for t in targets if isinstance(t, ast.Name) and not t.id.startswith("__"))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                _name(d) in _MEMO_DECORATORS for d in node.decorator_list):
            found.add(node.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found.update(node.names)
    return found


def test_every_module_level_state_has_an_owner():
    found = set()
    for floor in ("kernel_cache", "compiler", "lowering"):
        for path in sorted((ROOT / floor).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not rel.startswith("cachectl/"):
                found.update(f"{rel}:{name}" for name in module_state(path))
    assert found == set(MODULE_STATE)


def test_the_content_key_takes_its_memo():
    """compiler/key.py keeps no memo of its own and looks no session up: its caller passes the
    session's memo (`compiler.session_keys`)."""
    source = (ROOT / "compiler" / "key.py").read_text()
    assert "current_session" not in source and "current_config" not in source
    assert module_state(ROOT / "compiler" / "key.py") == set()


def test_one_exit_sequence():
    """Exit has one order, the package's (`kernel_cache/at_exit.py`): one `atexit.register` in the
    product, none elsewhere."""
    found = [path.relative_to(ROOT).as_posix() for floor in ("kernel_cache", "compiler", "lowering", "cachectl")
             for path in sorted((ROOT / floor).rglob("*.py"))
             for line in path.read_text().splitlines() if "atexit.register" in line]
    assert found == ["kernel_cache/at_exit.py"], found
