"""One error family: every exception class kernel-cache defines derives from
KernelCacheError, keeping its builtin base, so `except KernelCacheError` catches what we raise and an
`except OSError` / `except ValueError` still matches."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import kernel_cache
from kernel_cache import KernelCacheError

PACKAGES = ("kernel_cache", "compiler", "lowering", "cachectl")


def _our_exceptions():
    found = {}
    for package in PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
            if info.name.endswith("__main__"):
                continue  # running it is its only job
            module = importlib.import_module(info.name)
            for name, value in vars(module).items():
                # errors, not control flow (Terminated is a KeyboardInterrupt: no `except Exception` may stop it)
                if (inspect.isclass(value) and issubclass(value, Exception) and not issubclass(value, Warning)
                        and value.__module__ == info.name and not name.startswith("_")):
                    found[f"{info.name}.{name}"] = value
    return found


def test_every_exception_we_define_is_a_kernel_cache_error():
    found = _our_exceptions()
    assert len(found) >= 25, sorted(found)
    strays = sorted(name for name, cls in found.items() if not issubclass(cls, KernelCacheError))
    assert strays == []


@pytest.mark.parametrize("name, builtin", [("LevelUnavailable", OSError), ("CorruptEntry", ValueError),
                                           ("ConfigError", ValueError), ("ReentrantBuild", RuntimeError)])
def test_each_keeps_its_builtin_base(name, builtin):
    import kernel_cache.entries.entry
    import kernel_cache.errors

    cls = getattr(kernel_cache.errors, name, None) or getattr(kernel_cache.entries.entry, name, None) \
        or getattr(kernel_cache, name)
    assert issubclass(cls, KernelCacheError) and issubclass(cls, builtin)


def test_the_base_is_exported():
    assert "KernelCacheError" in kernel_cache.__all__
