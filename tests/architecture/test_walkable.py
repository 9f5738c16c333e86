"""The house stays walkable: no function in lowering/ takes more than 8 parameters (a call is
one object, `BoundCall`, planned once, `KernelPlan`), except the public `triton_call`, whose keywords
are jax-triton's API, and a value class's `__init__`, which takes its fields (as a dataclass's would)."""

from __future__ import annotations

import ast

from conftest import ROOT

MAX_PARAMETERS = 8
PUBLIC_APIS = {("lowering/frontend/api.py", "triton_call")}


VALUE_CLASSES = {"Value", "FrozenValue"}  # kernel_cache.value_class: the __init__ takes the fields, as a dataclass's


def _value_class_inits(tree: ast.AST) -> set[ast.AST]:
    """The `__init__` of each value class (its fields written out, where `@dataclass` generated them)."""
    return {item for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
            and any(isinstance(b, ast.Name) and b.id in VALUE_CLASSES for b in node.bases)
            for item in node.body if isinstance(item, ast.FunctionDef) and item.name == "__init__"}


def test_no_function_in_lowering_takes_more_than_eight_parameters():
    found = []
    for path in sorted((ROOT / "lowering").rglob("*.py")):
        relative = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text())
        inits = _value_class_inits(tree)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node in inits:
                continue
            a = node.args
            count = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
            count -= bool(a.args) and a.args[0].arg in ("self", "cls")
            if count > MAX_PARAMETERS and (relative, node.name) not in PUBLIC_APIS:
                found.append(f"{relative}:{node.lineno} {node.name} ({count})")
    assert found == []
