"""The house stays walkable (issue 21): no function in lowering/ takes more than 8 parameters (a call is
one object, `BoundCall`, planned once, `KernelPlan`), except the public `triton_call`, whose keywords
are jax-triton's API."""

from __future__ import annotations

import ast

from conftest import ROOT

MAX_PARAMETERS = 8
PUBLIC_APIS = {("lowering/frontend/api.py", "triton_call")}


def test_no_function_in_lowering_takes_more_than_eight_parameters():
    found = []
    for path in sorted((ROOT / "lowering").rglob("*.py")):
        relative = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            a = node.args
            count = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
            count -= bool(a.args) and a.args[0].arg in ("self", "cls")
            if count > MAX_PARAMETERS and (relative, node.name) not in PUBLIC_APIS:
                found.append(f"{relative}:{node.lineno} {node.name} ({count})")
    assert found == []
