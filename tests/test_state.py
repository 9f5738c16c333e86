"""State with an owner (issue 30), the compiler's floor: every per-process memo lives in the session
(`kernel_cache.Session.memo`, dropped by `configure()`), unless it remembers a fact of the installed
software or a pure function of its key (`kernel_cache/session.py`). This test reads every compiler
module and finds its module-level mutable state (a dict, list or set bound at module level, a
`functools.cache`/`lru_cache`d function, a `global` rebound in a function): each must be listed here
with why it may stay module-level, so a new memo is a decision, not an accident.

compiler/toolchain.py is not read: it is being rewritten (issue 30), and its memo is the toolchain
fingerprint keyed by the identity of the files it hashes (a fact of the installed software).
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

# "module:name" -> why it is not the session's
MODULE_STATE = {
    "compiler/triton_compat.py:make_backend": "a pure function of its key (the target) under the installed Triton",
    "compiler/triton_compat.py:_flags": "a pure function of its key (a JITFunction's parameters)",
    "compiler/triton_compat.py:_PARSED": "a pure function of its key (target and options) under the installed Triton",
    "compiler/portable.py:_memo": "a fact of the installed files, keyed by their identity (path and stat)",
    "compiler/examples.py:MATMUL_CONFIGS": "a constant (the example kernel's autotune configs)",
    "compiler/artifact.py:LAUNCHED_FROM": "a constant (per backend, the blob a launcher is built from)",
}
NOT_READ = {"compiler/toolchain.py"}
_MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "Counter", "deque"}
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


def test_every_module_level_state_of_the_compiler_has_an_owner():
    found = set()
    for path in sorted((ROOT / "compiler").glob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel not in NOT_READ:
            found.update(f"{rel}:{name}" for name in module_state(path))
    assert found == set(MODULE_STATE)


def test_the_content_key_takes_its_memo():
    """compiler/key.py keeps no memo of its own and looks no session up: its caller passes the
    session's memo (`compiler.session_keys`)."""
    source = (ROOT / "compiler" / "key.py").read_text()
    assert "current_session" not in source and "current_config" not in source
    assert module_state(ROOT / "compiler" / "key.py") == set()
