"""Prewarm from recipes: every entry records how it was built; rebuild those whose key is missing
for the installed toolchain (after a Triton upgrade) or for other GPU generations (`arches`).

Rebuilding a recipe imports the modules it names (its kernel's, and those of any jitted function
passed as a constexpr), and whoever can write the cache wrote the recipe. So only modules the
operator allows (`cachectl prewarm --allow-module PATTERN`) are imported; the names are checked
before any import, and other recipes are reported "skipped".
"""

from __future__ import annotations

import fnmatch
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, wait
from typing import Any

from cachectl.render import shown
from cachectl.warm.progress import Outcome, Report
from compiler import RecipeError, Target, compile_processes, content_key, from_recipe, parse_target
from kernel_cache.errors import KernelCacheError
from kernel_cache.settings.config import Config
from kernel_cache.store import Store

# Recipes -----------------------------------------------------------------------------------
ALLOW_HINT = "--allow-module PATTERN"
SCRIPT_MODULE = "__main__"  # the module of whatever a script (`python train.py`) defines
NO_IMPORT = "which no import finds again"  # in every reason a recipe cannot be rebuilt for where its kernel lives
Recipe = dict[str, Any]  # an entry's recorded recipe: JSON, as whoever wrote the cache wrote it
Build = tuple[Recipe, str, str, str]  # a planned build: (recipe, arch, label, key)


class MalformedRecipe(KernelCacheError, ValueError):
    """A recipe whose kernel names are not MODULE:QUALNAME with a dotted Python module path."""


def module_filter(patterns: Iterable[str]) -> Callable[[str], bool]:
    """allowed(module): True when a glob of `patterns` (fnmatch, case-sensitive) matches the dotted
    module name, e.g. 'mylib.*' (any module below mylib, not mylib itself) or 'scripts.kernels'."""
    patterns = tuple(patterns)
    return lambda module: any(fnmatch.fnmatchcase(module, p) for p in patterns)


def _module_of(path: object) -> str:
    if not isinstance(path, str):
        raise MalformedRecipe(f"malformed kernel name {shown(repr(path))}: expected a 'MODULE:QUALNAME' string")
    module, sep, qualname = path.partition(":")
    if not sep or not qualname or not module or not all(p.isidentifier() for p in module.split(".")):
        raise MalformedRecipe(f"malformed kernel name {shown(repr(path))}: expected MODULE:QUALNAME with a "
                              f"dotted Python module name")
    return module


def recipe_modules(recipe: Recipe) -> list[str]:
    """Every module rebuilding `recipe` would import, without importing anything: the kernel's, then
    those of jitted functions among its values ({"jit": "MODULE:QUALNAME"}, at any depth)."""
    return list(dict.fromkeys(_module_of(path) for path in _kernel_paths(recipe)))


def _kernel_paths(recipe: Recipe) -> list[object]:
    """The kernel's name, then those of jitted functions among the recipe's values, as written."""
    if not isinstance(recipe, dict):
        raise MalformedRecipe("malformed recipe: not a JSON object")
    paths = [recipe.get("kernel")]
    stack = [v for k, v in recipe.items() if k != "kernel"]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            if "jit" in value:
                paths.append(value["jit"])
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return paths


def not_importable(recipe: Recipe) -> str | None:
    """Why no import finds a function `recipe` names again (defined in a script, or inside another
    function), or None. No --allow-module makes such a recipe rebuildable, so none is suggested: the
    reason says where the kernel must live instead."""
    try:
        paths = [p for p in _kernel_paths(recipe) if isinstance(p, str)]
    except MalformedRecipe:
        return None
    for path in paths:
        module, _, qualname = path.partition(":")
        if module == SCRIPT_MODULE:
            return (f"{shown(path)} is defined in a script, {NO_IMPORT}: only kernels defined in an importable "
                    f"module (installed, or on PYTHONPATH) can be prewarmed or rebuilt; move it into one and "
                    f"import it from the script")
        if "<locals>" in qualname:
            return (f"{shown(path)} is defined inside a function, {NO_IMPORT}: only kernels at the top level of "
                    f"an importable module can be prewarmed or rebuilt")
    return None


def refusal(recipe: Recipe, allowed: Callable[[str], bool], command: str = "prewarm") -> tuple[str, str] | None:
    """(why, the module not allowed or "") when `recipe` is not to be rebuilt here, None when it may be:
    its kernel is not importable, or it names a module `allowed` refuses. Raises MalformedRecipe."""
    modules = recipe_modules(recipe)
    unreachable = not_importable(recipe)  # no --allow-module imports a script's kernel
    if unreachable is not None:
        return unreachable, ""
    module = next((m for m in modules if not allowed(m)), None)
    if module is None:
        return None
    return (f"module '{module}' is not allowed: rebuilding this recipe would import (run) it, and {command} "
            f"imports only modules matched by {ALLOW_HINT}; if you trust it, pass --allow-module '{module}'"
            + (f" (or '{module.partition('.')[0]}.*')" if "." in module else ""), module)


def _label(recipe: object) -> str:
    kernel = recipe.get("kernel") if isinstance(recipe, dict) else None
    return shown(kernel.rpartition(":")[2]) if isinstance(kernel, str) else "?"


def plan_recipe_builds(recipes: Iterable[Recipe], arches: list[str] | None, has_key: Callable[[str], bool],
                       report: Report, allowed: Callable[[str], bool]) -> list[Build]:
    """[(recipe, arch, label, key)] still to build. Entries already present and recipes that
    cannot be rebuilt (kernel not importable) are reported here and not returned. Recipes naming a
    module `allowed` refuses, or malformed names, are reported "skipped" without importing anything.
    """
    targets: list[Target | None] = [parse_target(a) for a in arches] if arches else [None]
    todo: list[Build] = []
    seen: set[tuple[str, str]] = set()
    for recipe in recipes:
        label = _label(recipe)
        try:
            modules, refused = recipe_modules(recipe), refusal(recipe, allowed)
        except MalformedRecipe as exc:
            report(Outcome(label, "?", "skipped", error=str(exc)))
            continue
        identity = json.dumps({k: v for k, v in recipe.items() if k != "target"}, sort_keys=True)
        recorded = recipe.get("target")
        own: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
        for target in targets:
            if target is not None and target.backend != own.get("backend"):
                continue  # a CUDA recipe has no meaning for a ROCm arch and vice versa
            arch_name = target.name if target is not None else _target_name(own)
            if (identity, arch_name) in seen:
                continue
            seen.add((identity, arch_name))
            if refused is not None:
                report(Outcome(label, arch_name, "skipped", error=refused[0], module=refused[1]))
                continue
            try:
                spec = from_recipe(recipe, target=target)
                key = content_key(spec)
            except RecipeError as exc:
                report(Outcome(label, arch_name, "failed", error=str(exc) + import_hint(exc), module=modules[0]))
                continue
            except Exception as exc:  # a recipe that no longer matches the kernel's signature
                report(Outcome(label, arch_name, "failed", error=f"{type(exc).__name__}: {exc}", module=modules[0]))
                continue
            if has_key(key):
                report(Outcome(label, arch_name, "present", key=key, module=modules[0]))
            else:
                todo.append((recipe, arch_name, label, key))
    return todo


def import_hint(exc: BaseException) -> str:
    """For a kernel module that is not found, how to make it importable: a module beside the user
    is not, for the `cachectl` command (the current directory is not on its import path)."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, ModuleNotFoundError):
        cause = cause.__cause__
    if cause is None or not cause.name:
        return ""
    top = cause.name.partition(".")[0]
    here = os.getcwd()
    beside = os.path.isfile(os.path.join(here, f"{top}.py")) or os.path.isdir(os.path.join(here, top))
    if not beside:
        return (f" (is '{shown(top)}' installed, or on PYTHONPATH? PYTHONPATH=. makes a module in the current "
                f"directory importable)")
    if "" in sys.path or any(os.path.abspath(p) == here for p in sys.path):
        return ""  # importable from here, yet not found: its own error says why
    return (f" ('{shown(top)}' is in the current directory, which cachectl does not import from: run it "
            f"with PYTHONPATH=.)")


def _target_name(target_json: dict[str, Any]) -> str:
    if target_json.get("backend") == "cuda":
        return shown(f"sm_{target_json.get('arch')}")
    return shown(str(target_json.get("arch", "?")))


def build_recipe(recipe: Recipe, arch: str, label: str, store: Store) -> Outcome:
    """Compile one recipe for `arch` into `store` (on a worker process where one is idle)."""
    start = time.perf_counter()
    module = str(recipe.get("kernel", "")).partition(":")[0]
    try:
        _, key = compile_processes.get_or_compile(from_recipe(recipe, target=arch), store)
    except Exception as exc:
        return Outcome(label, arch, "failed", seconds=time.perf_counter() - start, module=module,
                       error=f"{type(exc).__name__}: {exc}".splitlines()[0] + import_hint(exc))
    return Outcome(label, arch, "built", key=key, seconds=time.perf_counter() - start, module=module)


def run_recipe_builds(todo: list[Build], config: Config, jobs: int, report: Report, store: Store) -> None:
    """Build every planned recipe, `jobs` at once on the compile threads, each handed to one of
    `jobs` worker processes where one is idle (`compile_processes`); one after another in this
    thread with jobs == 1. Reported as each ends; an interrupt cancels the rest."""
    if jobs <= 1 or len(todo) <= 1:
        for recipe, arch, label, _ in todo:
            report(build_recipe(recipe, arch, label, store))
        return
    config = config.with_(compile_workers=jobs)
    compile_processes.override(min(jobs, len(todo)))
    compile_processes.expect(config, len(todo), parse_target(todo[0][1]))
    pending = {compile_processes.submit(config, build_recipe, r, a, lbl, store) for r, a, lbl, _ in todo}
    while pending:  # woken often: a signal another thread took is handled here within 0.1 s
        done, pending = wait(pending, 0.1, FIRST_COMPLETED)
        for build in done:
            report(build.result())


def landed(todo: list[Build], reported: set[str], has_key: Callable[[str], bool]) -> list[Outcome]:
    """After an interrupt: the planned builds whose entry is in the cache though their outcome was
    never reported (the worker was stopped between its write and its word), as "built"."""
    return [Outcome(label, arch, "built", key=key, module=str(recipe.get("kernel", "")).partition(":")[0])
            for recipe, arch, label, key in todo if key not in reported and has_key(key)]
