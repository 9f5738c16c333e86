"""Prewarm imports only modules the operator allows: recipes come from cache content, and
rebuilding one imports (runs) the modules it names. No compiles here: recipes either stay
unimported or resolve to a kernel whose entry is already "present"."""

from __future__ import annotations

import copy
import sys
import textwrap

import pytest

from cachectl.warm import recipes as prewarm

MARKER_MODULE = textwrap.dedent("""
    from pathlib import Path

    Path(__file__).with_name("imported.marker").write_text("this module ran")
    from compiler.examples import add_kernel  # a real kernel, re-exported
""")


@pytest.fixture
def marker_module(tmp_path, monkeypatch):
    """(module name, marker path): importing the module creates the marker file."""
    name = f"prewarm_marker_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(MARKER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, tmp_path / "imported.marker"
    sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def add_recipe() -> dict:
    """The recipe of the example add kernel for sm_90, as an entry records it."""
    from compiler import to_recipe
    from compiler.examples import example_specs

    return to_recipe(dict(example_specs("sm_90"))["add"])


def plan(recipes, allowed, has_key=lambda key: True, arches=None):
    outcomes = []
    allowed = allowed if callable(allowed) else prewarm.module_filter(allowed)
    todo = prewarm.plan_recipe_builds(recipes, arches, has_key, outcomes.append, allowed)
    return todo, outcomes


def test_module_filter_globs_dotted_names():
    allowed = prewarm.module_filter(["mylib.*", "compiler.examples"])
    assert allowed("mylib.kernels") and allowed("mylib.a.b") and allowed("compiler.examples")
    assert not allowed("mylib") and not allowed("MyLib.kernels") and not allowed("compiler.examplesX")
    assert not allowed("os") and not prewarm.module_filter([])("anything")


def test_recipe_modules_reads_names_without_importing(add_recipe):
    recipe = copy.deepcopy(add_recipe)
    recipe["constexprs"]["ACT"] = {"seq": [{"v": 1}, {"jit": "other.mod:activation"}], "tuple": True}
    recipe["options"]["hook"] = {"jit": "third:fn"}
    assert prewarm.recipe_modules(recipe)[0] == "compiler.examples"
    assert set(prewarm.recipe_modules(recipe)) == {"compiler.examples", "other.mod", "third"}


@pytest.mark.parametrize("kernel", [
    "os; import evil:k", "../evil:k", "/abs/path:k", "a..b:k", ".rel:k", "mod", "mod:", ":qual", "",
    "1abc:k", "a-b:k", "a.b :k", 42, None, ["mod:k"],
])
def test_malformed_kernel_names_are_skipped(add_recipe, kernel):
    recipe = {**add_recipe, "kernel": kernel}
    todo, outcomes = plan([recipe], allowed=["*"])
    assert todo == [] and [o.status for o in outcomes] == ["skipped"]
    assert outcomes[0].error.startswith("malformed kernel name") and outcomes[0].module == ""


def test_non_object_recipe_is_skipped():
    todo, outcomes = plan(["compiler.examples:add_kernel", 3], allowed=["*"])
    assert todo == [] and [(o.status, o.error) for o in outcomes] == [
        ("skipped", "malformed recipe: not a JSON object")] * 2


def test_recipe_of_a_module_not_allowed_is_never_imported(add_recipe, marker_module):
    name, marker = marker_module
    recipe = {**add_recipe, "kernel": f"{name}:add_kernel"}
    for allowed in ([], ["compiler.examples"], [f"{name}.*"], lambda module: module.startswith("compiler")):
        todo, outcomes = plan([recipe], allowed=allowed, arches=["sm_80", "sm_90"])
        assert todo == [] and [(o.status, o.arch, o.module) for o in outcomes] == [
            ("skipped", "sm_80", name), ("skipped", "sm_90", name)]
        assert f"module '{name}' is not allowed" in outcomes[0].error
        assert f"--allow-module '{name}'" in outcomes[0].error
    assert not marker.exists() and name not in sys.modules


def test_jitted_constexpr_smuggling_a_module_is_caught(add_recipe, marker_module):
    """An allowed kernel module does not let a recipe import another module through a value."""
    name, marker = marker_module
    recipe = copy.deepcopy(add_recipe)
    recipe["constexprs"]["EXTRA"] = {"jit": f"{name}:add_kernel"}
    todo, outcomes = plan([recipe], allowed=["compiler.examples"])
    assert todo == [] and [(o.status, o.module) for o in outcomes] == [("skipped", name)]
    assert not marker.exists() and name not in sys.modules


def test_allowed_module_is_imported_and_planned(add_recipe, marker_module):
    name, marker = marker_module
    recipe = {**add_recipe, "kernel": f"{name}:add_kernel"}
    todo, outcomes = plan([recipe], allowed=[name], has_key=lambda key: True)
    assert marker.exists()  # allowed: imported, and it resolves to the real add kernel
    assert todo == [] and [(o.status, o.arch, o.module) for o in outcomes] == [("present", "sm_90", name)]

    todo, outcomes = plan([recipe], allowed=[name], has_key=lambda key: False, arches=["sm_80"])
    assert outcomes == [] and [(arch, label) for _, arch, label, _ in todo] == [("sm_80", "add_kernel")]


def test_default_allows_nothing(add_recipe):
    todo, outcomes = [], []
    todo = prewarm.plan_recipe_builds([add_recipe], None, lambda key: False, outcomes.append, prewarm.module_filter([]))
    assert todo == [] and [(o.status, o.module) for o in outcomes] == [("skipped", "compiler.examples")]
