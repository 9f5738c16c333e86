"""Zero-code adoption: another library's Triton calls served from the store, its source untouched.

`KERNEL_CACHE_INTERCEPT=jax_triton,ejkernel` (or `all`), or `kernel_cache.intercept("jax_triton")`
from code. The core knows each client only by the module whose loading arms it; the adapters live
in the lowering floor (the `kernel_cache.clients` entry-point group), loaded once the client's module
has loaded (it has imported JAX by then, so the core never does). An adapter takes over the client
where every binding reaches (its lowering rule), so `from jax_triton import triton_call` made
before or after makes no difference. Whatever goes wrong here warns once and leaves the client on
its own path: interception never fails a program.

An adapter also carries the client's fixes for this JAX (jax-triton 0.4.1's DCE rule fails on JAX
0.12 without it) and applies them before anything that can decline: a malformed setting, even a
misspelt client in this variable, leaves the client on its own path, mended, with one warning. So a
list that names an unknown client still arms the clients it names (all of them where it names none).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from kernel_cache.errors import KernelCacheError
from kernel_cache.sanitize import echo
from kernel_cache.telemetry.warnings_once import warn_once

ENV = "KERNEL_CACHE_INTERCEPT"
ENTRY_POINT_GROUP = "kernel_cache.clients"
# client name -> the module whose loading installs the adapter (it defines what the adapter replaces)
CLIENT_MODULES = {
    "jax_triton": "jax_triton.triton_lib",
    "ejkernel": "ejkernel.callib._triton_call",
    "transformer_engine": "transformer_engine.jax.triton_extensions.utils",
}
ALL = "all"

_lock = threading.RLock()
_state: dict[str, str] = {}  # client -> "armed" | "installed" | "declined: why"
_watched: dict[str, str] = {}  # module not loaded yet -> the client its loading arms


class InterceptError(KernelCacheError, ValueError):
    """An unknown client name (the message lists the known ones)."""


class UnsupportedClient(KernelCacheError, RuntimeError):
    """An adapter's refusal (an unknown client version, a malformed configuration): the client keeps its path."""


def parse_clients(text: str, what: str = ENV) -> tuple[str, ...]:
    """'jax_triton, ejkernel' / 'all' / '' -> client names, checked; '0'/'off' mean none."""
    names = _words(text)
    if not names or names in (["0"], ["off"], ["no"], ["false"]):
        return ()
    if ALL in names or names in (["1"], ["on"], ["yes"], ["true"]):
        return tuple(CLIENT_MODULES)
    unknown = [n for n in names if n not in CLIENT_MODULES]
    if unknown:
        named = ", ".join(echo(n, 24) for n in unknown[:4]) + (f" and {len(unknown) - 4} more" if len(unknown) > 4 else "")
        raise InterceptError(f"{what}={echo(text)}: unknown client {named}; expected a comma-separated "
                             f"list of {', '.join(CLIENT_MODULES)} (or {ALL})")
    return tuple(dict.fromkeys(names))


def intercept(*clients: str) -> dict[str, str]:
    """Serve `clients`' Triton calls from the store, now or as soon as the client is imported; each
    client's state ("installed", "armed", or "declined: reason")."""
    names = parse_clients(",".join(clients), "intercept()") if clients else tuple(CLIENT_MODULES)
    for name in names:
        _arm_or_install(name)
    return {name: _state.get(name, "armed") for name in names}


def _arm_or_install(name: str) -> None:
    module = sys.modules.get(CLIENT_MODULES[name])
    spec = getattr(module, "__spec__", None)
    if module is not None and spec is not None and not getattr(spec, "_initializing", False):
        _install(name, module)
    else:
        _arm(name)


def status() -> dict[str, str]:
    with _lock:
        return dict(_state)


def install_from_environment() -> None:
    """Called by the `.pth` file at interpreter start when KERNEL_CACHE_INTERCEPT is set; never raises.
    A malformed list warns only when a client it arms loads, so a program that imports none hears nothing."""
    text = os.environ.get(ENV, "")
    try:
        try:
            names = parse_clients(text)
        except InterceptError:
            names = tuple(dict.fromkeys(n for n in _words(text) if n in CLIENT_MODULES)) or tuple(CLIENT_MODULES)
        for name in names:
            _arm_or_install(name)
    except Exception as exc:  # a bad variable must not stop every Python program on the machine
        warn_once(f"intercept-env:{exc}", f"{ENV} ignored: {exc}")


def _words(text: str) -> list[str]:
    return [n.strip().lower().replace("-", "_") for n in text.replace(",", " ").split()]


def _install(name: str, module: ModuleType) -> None:
    with _lock:
        if _state.get(name) == "installed" or str(_state.get(name, "")).startswith("declined"):
            return
        adapter = _adapter(name)
        if adapter is None:
            return
        try:
            adapter(module)
        except UnsupportedClient as exc:
            _decline(name, str(exc))
            return
        except Exception as exc:
            _decline(name, f"its adapter failed: {type(exc).__name__}: {exc}")
            return
        _state[name] = "installed"


def _adapter(name: str) -> Callable[[ModuleType], None] | None:
    found = [ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        _decline(name, f"no adapter registered in the '{ENTRY_POINT_GROUP}' entry points (is kernel-cache "
                       f"installed with pip, not only on PYTHONPATH?)")
        return None
    try:
        loaded: Callable[[ModuleType], None] = found[0].load()
        return loaded
    except Exception as exc:
        _decline(name, f"its adapter {found[0].value} failed to load: {type(exc).__name__}: {exc}")
        return None


def _decline(name: str, why: str) -> None:
    _state[name] = f"declined: {why}"
    warn_once(f"intercept:{name}", f"kernel-cache does not intercept {name} ({why}); {name} keeps its own "
                                   f"compile path")


def _arm(name: str) -> None:
    with _lock:
        if name in _state:
            return
        _state[name] = "armed"
        _watched[CLIENT_MODULES[name]] = name
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


class _InstallAfterLoad(importlib.abc.Loader):
    """Runs the client module's own loader, then installs the adapter on the finished module."""

    def __init__(self, loader: Any, client: str) -> None:
        self._loader, self._client = loader, client

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create: Any = getattr(self._loader, "create_module", None)
        return None if create is None else create(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        if module.__spec__ is not None and module.__spec__.loader is self:
            module.__spec__.loader = self._loader  # the module looks as if we were never there
        module.__loader__ = self._loader
        _install(self._client, module)

    def __getattr__(self, attr: str) -> Any:  # get_source, is_package, … as the real loader has them
        return getattr(self._loader, attr)


class _ClientFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched module, asks the finders behind it and wraps the loader."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        client = _watched.get(fullname)
        if client is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    del _watched[fullname]
                    spec.loader = _InstallAfterLoad(spec.loader, client)
                return spec
        return None


_finder = _ClientFinder()
