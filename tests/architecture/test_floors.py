"""The house's floors, imports only downward:

    kernel_cache (core)  <-  compiler  <-  lowering  <-  cachectl (the operator's floor)

Checked twice: by importing each floor in a fresh interpreter and looking at sys.modules, and by
reading every import statement of every module (inside functions too), so a lazy import cannot
hide an upward edge or a cycle. The one sanctioned deferral of our own code, `kernel_cache.lazy.later("module")`
(a module a warm process does not run: a backend not configured, the compiler's machinery on a miss),
is read as an import of that module and must point down like any other; its argument must be a
string literal naming the module absolutely, so that this test can read it.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest
from conftest import ROOT, run_python

CORE, COMPILER, LOWERING, OPERATOR = "kernel_cache", "compiler", "lowering", "cachectl"
# What each floor must never import (third-party names included: the core knows no Triton or JAX).
FORBIDDEN = {
    CORE: ("compiler", "lowering", "triton", "jax", "jaxlib", OPERATOR),
    COMPILER: ("lowering", "jax", "jaxlib", OPERATOR),
    LOWERING: (OPERATOR,),
    OPERATOR: (),
}


def floor_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    module = ".".join(rel.parts)
    if module.startswith(OPERATOR) or module == "kernel_cache.__main__":  # `python -m kernel_cache` is cachectl
        return OPERATOR
    return rel.parts[0]


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


LATER = "later"  # kernel_cache.lazy.later: the sanctioned deferred import of our own code


def _later_target(call: ast.Call) -> str | None:
    """The module a `later(...)` call names; '<not a literal>' when it names none readably."""
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if name != LATER:
        return None
    if len(call.args) == 1 and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
        return call.args[0].value
    return "<not a literal>"


def imports_of(path: Path) -> list[tuple[str, bool]]:
    """(absolute module imported, whether the import sits inside a function) for every import,
    `later("module")` included (as an import at module level: the sanctioned deferral)."""
    tree = ast.parse(path.read_text())
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                found.extend((alias.name, inside) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")
                    anchor = anchor[:len(anchor) - (child.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                found.append((base, inside))
                found.extend((f"{base}.{alias.name}", inside) for alias in child.names)
            elif isinstance(child, ast.Call) and (target := _later_target(child)) is not None:
                found.append((target, False))
            visit(child, inside)

    visit(tree, False)
    return found


def test_later_names_a_module_by_a_literal():
    """`later(...)` takes one string literal, an absolute module name that exists: the floor check
    above reads it, and a typo would fail at the rare path's first use, not here."""
    for path in project_modules():
        for name, _ in imports_of(path):
            if name == "<not a literal>":
                raise AssertionError(f"{path.relative_to(ROOT)}: later() needs a string literal module name")
    named = {name for path in project_modules() for name, _ in _later_calls(path)}
    assert named, "no later() call found: the reader above would not see one"
    for name in named:
        assert importlib.util.find_spec(name) is not None, f"later({name!r}) names no module"


def _later_calls(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text())
    return [(target, node.lineno) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and (target := _later_target(node)) is not None]


def project_modules() -> list[Path]:
    return sorted(p for pkg in (CORE, COMPILER, LOWERING, OPERATOR) for p in (ROOT / pkg).rglob("*.py"))


def _reaches(name: str, target: str) -> bool:
    return name == target or name.startswith(target + ".")


@pytest.mark.parametrize("path", project_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_import_points_down(path):
    floor = floor_of(path)
    bad = [name for name, _ in imports_of(path) for banned in FORBIDDEN[floor] if _reaches(name, banned)]
    assert not bad, f"{path.relative_to(ROOT)} ({floor} floor) imports {sorted(set(bad))}"


@pytest.mark.parametrize("path", [p for p in project_modules() if floor_of(p) != OPERATOR],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_project_import_hides_inside_a_function(path):
    """Below the operator's floor an import of our own code sits at module level: a function-level
    import is how a cycle gets hidden. (cachectl loads command modules on demand so that `list`
    starts without Triton; it is the top floor, nothing can cycle through it.)"""
    ours = (CORE, COMPILER, LOWERING, "scripts")
    hidden = [name for name, inside in imports_of(path) if inside and any(_reaches(name, p) for p in ours)]
    assert not hidden, f"{path.relative_to(ROOT)} imports {sorted(set(hidden))} inside a function"


FRESH = """
import json, sys
import {module}
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("compiler", "lowering", "triton", "jax", "jaxlib")
                        or m.startswith("cachectl"))))
"""


@pytest.mark.parametrize("module, banned", [
    ("kernel_cache", ("compiler", "lowering", "triton", "jax", "jaxlib", "cachectl")),
    ("compiler", ("lowering", "jax", "jaxlib", "cachectl")),
    ("lowering", ("cachectl",)),
])
def test_importing_a_floor_loads_nothing_above_it(module, banned):
    loaded = json.loads(run_python(FRESH.format(module=module)).stdout.strip().splitlines()[-1])
    above = [m for m in loaded if any(_reaches(m, b) for b in banned)]
    assert not above, f"importing {module} loaded {above}"


def test_cachectl_list_starts_without_triton_or_jax(tmp_path):
    code = ("import sys, json; from cachectl import main; main(['config']); "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('triton', 'jax', 'compiler'))))")
    loaded = json.loads(run_python(code).stdout.strip().splitlines()[-1])
    assert loaded == []


def test_no_module_is_long_without_saying_why():
    for path in project_modules():
        lines = path.read_text().count("\n")
        if lines > 300:
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            assert "long because" in doc, f"{path.relative_to(ROOT)} has {lines} lines and its docstring says not why"


def test_the_tree_shows_the_floors():
    """The folders are the floors: the operator's floor beside the packages it drives, it and the core
    of at most twelve modules each with the rest grouped by job, at most ten test files outside the floors'
    folders, and the tests' scaffolding in tests/support/, none of it among the user's scripts."""
    assert (ROOT / OPERATOR / "__init__.py").is_file() and not (ROOT / CORE / "cachectl").exists()
    core = sorted(p.name for p in (ROOT / CORE).glob("*.py"))
    assert len(core) <= 12, core
    operator = sorted(p.name for p in (ROOT / OPERATOR).glob("*.py"))
    assert len(operator) <= 12, operator
    loose_tests = sorted(p.name for p in (ROOT / "tests").glob("test_*.py"))
    assert len(loose_tests) <= 10, loose_tests
    support = {p.name for p in (ROOT / "tests" / "support").iterdir() if p.suffix in (".py", ".sh")}
    assert support and not support & {p.name for p in (ROOT / "scripts").iterdir()}
    children = {p.name for p in (ROOT / "tests").rglob("*_child.py")}
    assert children <= support, children - support
