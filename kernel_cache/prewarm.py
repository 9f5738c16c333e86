"""Fill a cache ahead of a job, on any node (no GPU needed), in worker processes.

Two sources of work:
- recipes: every entry records how it was built; rebuild those whose key is missing for the
  installed toolchain (after a Triton upgrade) or for other GPU generations (`arches`).
  Rebuilding a recipe imports the modules it names (its kernel's, and those of any jitted
  function passed as a constexpr), and whoever can write the cache wrote the recipe. So only
  modules the operator allows (`allowed`, from `cachectl prewarm --allow-module PATTERN`) are
  imported; the names are checked before any import, and other recipes are reported "skipped".
- a program: `MODULE:FUNCTION` names a user function that describes a JAX program; it is lowered
  for `cuda` on this host (cross-platform lowering), which compiles every Triton kernel the GPU
  job will need into the cache.

The program contract (documented for users in the README):
    def my_programs(arch: str):           # `arch` is optional; cachectl passes it if accepted
        return [(fn, (jax.ShapeDtypeStruct((4096,), jnp.float32), ...)), ...]
Each item is `(fn, args)`, `(fn, args, kwargs)` or `(label, fn, args)` and is lowered with
`jax.jit(fn).trace(*args, **kwargs).lower(lowering_platforms=("cuda",))`. A function that does its
own lowering returns None. While it runs, KERNEL_CACHE_TARGET_ARCH names the GPU target to compile
for (lowering.triton_call reads it when no compute_capability is passed) and the process-wide
store is this cache.

This module imports the compiler (and so Triton) and JAX only inside functions: cachectl's other
commands must start fast.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import importlib
import inspect
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from .config import Config

TARGET_ENV = "KERNEL_CACHE_TARGET_ARCH"  # read by lowering.target_arch on GPU-less hosts


class PrewarmError(RuntimeError):
    """The prewarm cannot start at all (program not importable, bad target name)."""


@dataclass
class Outcome:
    """What happened to one kernel (or one program lowering) during a prewarm."""

    label: str
    arch: str
    status: str  # "built", "present", "failed", "skipped" (module not allowed, malformed recipe)
    key: str = ""
    seconds: float = 0.0
    error: str = ""
    module: str = ""  # recipes: the module the kernel comes from (for a skip: the one not allowed)

    def to_json(self) -> dict:
        return dict(self.__dict__)


Report = Callable[[Outcome], None]


# Recipes -----------------------------------------------------------------------------------
ALLOW_HINT = "--allow-module PATTERN"


class MalformedRecipe(ValueError):
    """A recipe whose kernel names are not MODULE:QUALNAME with a dotted Python module path."""


def module_filter(patterns: Iterable[str]) -> Callable[[str], bool]:
    """allowed(module): True when a glob of `patterns` (fnmatch, case-sensitive) matches the dotted
    module name, e.g. 'mylib.*' (any module below mylib, not mylib itself) or 'scripts.kernels'."""
    patterns = tuple(patterns)
    return lambda module: any(fnmatch.fnmatchcase(module, p) for p in patterns)


def _module_of(path) -> str:
    if not isinstance(path, str):
        raise MalformedRecipe(f"malformed kernel name {_shown(repr(path))}: expected a 'MODULE:QUALNAME' string")
    module, sep, qualname = path.partition(":")
    if not sep or not qualname or not module or not all(p.isidentifier() for p in module.split(".")):
        raise MalformedRecipe(f"malformed kernel name {_shown(repr(path))}: expected MODULE:QUALNAME with a "
                              f"dotted Python module name")
    return module


def recipe_modules(recipe: dict) -> list[str]:
    """Every module rebuilding `recipe` would import, without importing anything: the kernel's, then
    those of jitted functions among its values ({"jit": "MODULE:QUALNAME"}, at any depth)."""
    if not isinstance(recipe, dict):
        raise MalformedRecipe("malformed recipe: not a JSON object")
    modules = [_module_of(recipe.get("kernel"))]
    stack = [v for k, v in recipe.items() if k != "kernel"]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            if "jit" in value:
                modules.append(_module_of(value["jit"]))
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return list(dict.fromkeys(modules))


def _not_allowed(module: str) -> str:
    return (f"module '{module}' is not allowed: rebuilding this recipe would import (run) it, and prewarm "
            f"imports only modules matched by {ALLOW_HINT}; if you trust it, pass --allow-module '{module}'"
            + (f" (or '{module.partition('.')[0]}.*')" if "." in module else ""))


def _shown(text: str, limit: int = 120) -> str:
    """Cache content fit to print: control characters escaped, long text cut."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return out + ("…" if len(text) > limit else "")


def _recipe_identity(recipe: dict) -> str:
    return json.dumps({k: v for k, v in recipe.items() if k != "target"}, sort_keys=True)


def _label(recipe) -> str:
    kernel = recipe.get("kernel") if isinstance(recipe, dict) else None
    return _shown(kernel.rpartition(":")[2]) if isinstance(kernel, str) else "?"


def plan_recipe_builds(recipes: Iterable[dict], arches: list[str] | None, has_key: Callable[[str], bool],
                       report: Report, allowed: Callable[[str], bool] | Iterable[str] = ()
                       ) -> list[tuple[dict, str, str, str]]:
    """[(recipe, arch, label, key)] still to build. Entries already present and recipes that
    cannot be rebuilt (kernel not importable) are reported here and not returned.

    `allowed` (a predicate on dotted module names, or fnmatch patterns) says which modules may be
    imported; the default allows none. Recipes naming any other module, or malformed names, are
    reported "skipped" without importing anything.
    """
    from compiler import RecipeError, content_key, from_recipe, parse_target

    if not callable(allowed):
        allowed = module_filter(allowed)
    targets = [parse_target(a) for a in arches] if arches else None
    todo, seen = [], set()
    for recipe in recipes:
        label = _label(recipe)
        try:
            modules = recipe_modules(recipe)
        except MalformedRecipe as exc:
            report(Outcome(label, "?", "skipped", error=str(exc)))
            continue
        denied = next((m for m in modules if not allowed(m)), None)
        identity = _recipe_identity(recipe)
        own = recipe.get("target") if isinstance(recipe.get("target"), dict) else {}
        for target in targets or [None]:
            if target is not None and target.backend != own.get("backend"):
                continue  # a CUDA recipe has no meaning for a ROCm arch and vice versa
            arch_name = target.name if target is not None else _target_name(own)
            if (identity, arch_name) in seen:
                continue
            seen.add((identity, arch_name))
            if denied is not None:
                report(Outcome(label, arch_name, "skipped", error=_not_allowed(denied), module=denied))
                continue
            try:
                spec = from_recipe(recipe, target=target)
                key = content_key(spec)
            except RecipeError as exc:
                report(Outcome(label, arch_name, "failed", error=str(exc), module=modules[0]))
                continue
            except Exception as exc:  # a recipe that no longer matches the kernel's signature
                report(Outcome(label, arch_name, "failed", error=f"{type(exc).__name__}: {exc}", module=modules[0]))
                continue
            if has_key(key):
                report(Outcome(label, arch_name, "present", key=key, module=modules[0]))
            else:
                todo.append((recipe, arch_name, label, key))
    return todo


def _target_name(target_json: dict) -> str:
    if target_json.get("backend") == "cuda":
        return _shown(f"sm_{target_json.get('arch')}")
    return _shown(str(target_json.get("arch", "?")))


_worker_store = None


def _open_worker_store(config_fields: dict) -> None:
    """Pool initializer: one store per worker process, on the same directories as the parent."""
    global _worker_store
    from .store import Store

    _worker_store = Store(_config_from_fields(config_fields))


def _config_fields(config: Config) -> dict:
    """The parent's whole Config, JSON-able, so workers lock and bound exactly as the parent does."""
    fields = dataclasses.asdict(config)
    return {k: str(v) if isinstance(v, Path) else v for k, v in fields.items()}


def _config_from_fields(fields: dict) -> Config:
    paths = {k: Path(fields[k]) if fields.get(k) else None for k in ("dir", "shared_dir")}
    return Config(**{**fields, **paths})


def build_recipe(recipe: dict, arch: str, label: str, store=None) -> Outcome:
    """Compile one recipe for `arch` into the store (the worker's own unless given)."""
    from compiler import from_recipe, get_or_compile

    start = time.perf_counter()
    try:
        spec = from_recipe(recipe, target=arch)
        _, key = get_or_compile(spec, store if store is not None else _worker_store)
    except Exception as exc:
        return Outcome(label, arch, "failed", seconds=time.perf_counter() - start,
                       error=f"{type(exc).__name__}: {exc}".splitlines()[0],
                       module=str(recipe.get("kernel", "")).partition(":")[0])
    return Outcome(label, arch, "built", key=key, seconds=time.perf_counter() - start,
                   module=str(recipe.get("kernel", "")).partition(":")[0])


def run_recipe_builds(todo: list[tuple[dict, str, str, str]], config: Config, jobs: int,
                      report: Report, store=None) -> None:
    """Build every planned recipe in `jobs` worker processes (in this process when jobs == 1)."""
    if not todo:
        return
    if jobs <= 1 or len(todo) == 1:
        for recipe, arch, label, _ in todo:
            report(build_recipe(recipe, arch, label, store))
        return
    if store is not None:
        store.stats.flush()
    _run_in_pool(build_recipe, [(r, a, lbl) for r, a, lbl, _ in todo], [lbl for _, _, lbl, _ in todo],
                 jobs, report, _pool_context(), initializer=_open_worker_store,
                 initargs=(_config_fields(config),))


def _pool_context():
    """fork is cheapest (Triton already imported), but not once JAX has started its threads."""
    if sys.platform.startswith("linux") and "jax" not in sys.modules:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _run_in_pool(fn, tasks: list[tuple], labels: list[str], jobs: int, report: Report, context,
                 initializer=None, initargs=()) -> None:
    """Run fn(*task) per task (task[1] is the arch); report each result as it completes."""
    with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=context,
                             initializer=initializer, initargs=initargs) as pool:
        futures = {pool.submit(fn, *task): (task[1], label) for task, label in zip(tasks, labels)}
        for future in as_completed(futures):
            arch, label = futures[future]
            try:
                outcome = future.result()
            except BrokenProcessPool:
                outcome = Outcome(label, arch, "failed", error="the worker process died (crash or out of memory)")
            except Exception as exc:
                outcome = Outcome(label, arch, "failed", error=f"{type(exc).__name__}: {exc}")
            if isinstance(outcome, list):
                for item in outcome:
                    report(item)
            else:
                report(outcome)


# Programs ----------------------------------------------------------------------------------
def load_program(path: str):
    """Import `MODULE:FUNCTION` (the current directory is importable, as with `python -m`)."""
    module_name, sep, func_name = path.partition(":")
    if not sep or not module_name or not func_name:
        raise PrewarmError(f"expected MODULE:FUNCTION, got {path!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise PrewarmError(f"cannot import module '{module_name}': {type(exc).__name__}: {exc}") from exc
    obj = module
    for part in func_name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise PrewarmError(f"module '{module_name}' has no attribute '{func_name}'")
    if not callable(obj):
        raise PrewarmError(f"{path} is not callable")
    return obj


@contextlib.contextmanager
def _compile_target(arch: str):
    old = os.environ.get(TARGET_ENV)
    os.environ[TARGET_ENV] = arch
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(TARGET_ENV, None)
        else:
            os.environ[TARGET_ENV] = old


def lower_program(path: str, arch: str, config_fields: dict) -> list[Outcome]:
    """Run the program function for `arch` with this cache as the process store; one Outcome per
    kernel that landed in the cache, or one "failed" Outcome for the program."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # lower for cuda without touching a GPU
    import kernel_cache

    store = kernel_cache.configure(_config_from_fields(config_fields))
    before = _known_keys(store)
    start = time.perf_counter()
    try:
        fn = load_program(path)
        with _compile_target(arch):
            kwargs = {"arch": arch} if _accepts_arch(fn) else {}
            programs = fn(**kwargs)
    except Exception as exc:
        store.stats.flush()
        return [Outcome(path, arch, "failed", seconds=time.perf_counter() - start,
                        error=f"{type(exc).__name__}: {exc}".splitlines()[0])]
    failures = []
    if programs is not None:
        import jax

        with _compile_target(arch):
            for index, item in enumerate(programs):
                label, item_start = f"{path}[{index}]", time.perf_counter()
                try:
                    label, f, args, kw = _program_item(item, label)
                    jax.jit(f).trace(*args, **kw).lower(lowering_platforms=("cuda",))
                except Exception as exc:  # one bad program must not stop the others
                    failures.append(Outcome(label, arch, "failed", seconds=time.perf_counter() - item_start,
                                            error=f"{type(exc).__name__}: {exc}".splitlines()[0]))
    store.stats.flush()
    return _new_entries(store, before, arch) + failures


def _program_item(item, default_label: str):
    """(label, fn, args, kwargs) from (fn, args), (fn, args, kwargs) or (label, fn, args)."""
    item = tuple(item)
    if item and isinstance(item[0], str):
        label, item = item[0], item[1:]
    else:
        label = (getattr(item[0], "__name__", None) if item else None) or default_label
    if len(item) == 2:
        return label, item[0], tuple(item[1]), {}
    if len(item) == 3:
        return label, item[0], tuple(item[1]), dict(item[2])
    raise TypeError(f"{default_label}: expected (fn, args), (fn, args, kwargs) or (label, fn, args)")


def _accepts_arch(fn) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "arch" in params  # not via **kwargs: those often go on to triton_call


def _known_keys(store) -> set[str]:
    return set().union(*(_known_keys_of(tier) for tier in store.persistent_tiers))


def _new_entries(store, before: set[str], arch: str) -> list[Outcome]:
    from .entry import peek_meta
    from .maintenance import read_raw

    out = []
    for tier in store.persistent_tiers:
        for key in sorted(_known_keys_of(tier) - before):
            raw = read_raw(tier, key)
            meta = peek_meta(raw) if raw else {}
            if meta.get("arch", arch) != arch:
                continue  # built meanwhile by a worker lowering for another arch
            out.append(Outcome(str(meta.get("name", "?")), str(meta.get("arch", arch)), "built", key=key,
                               seconds=float(meta.get("compile_seconds", 0.0))))
        before = before | _known_keys_of(tier)
    return out


def _known_keys_of(tier) -> set[str]:
    return {r["key"] for r in tier.records()}


def run_program(path: str, arches: list[str], config: Config, jobs: int, report: Report) -> None:
    """Lower the program once per arch: in this process, or one spawned worker per arch."""
    from compiler import parse_target

    try:
        names = [parse_target(a).name for a in arches]
    except (ValueError, TypeError) as exc:
        raise PrewarmError(str(exc)) from None
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # lower for cuda without touching a GPU
    load_program(path)  # fail fast, in this process, on a typo
    fields = _config_fields(config)
    if jobs <= 1 or len(names) == 1:
        for arch in names:
            for outcome in lower_program(path, arch, fields):
                report(outcome)
        return
    _run_in_pool(lower_program, [(path, arch, fields) for arch in names], [path] * len(names), jobs, report,
                 multiprocessing.get_context("spawn"))
