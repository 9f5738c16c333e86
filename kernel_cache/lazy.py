"""The one way our own code defers importing our own code: `later("kernel_cache.levels.remote.level")`.

A warm process should load only what it runs: no Redis client without a remote, none of the
compiler's machinery without a miss. A module that needs such a module on a rare path holds
`later(name)`, a stand-in that imports `name` at its first attribute access and then puts the real
module where it stood (each global of the caller still bound to it), so every later use is a plain
attribute read; a reference kept elsewhere (a table row) hands each access on.

The floor test reads every `later("...")` call as an import (a string literal, absolute, on the same
floor or a lower one); an `import` inside a function stays refused.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any


class Later(ModuleType):
    """A module named but not yet imported: the first attribute read imports it."""

    def __init__(self, name: str, holder: dict[str, Any] | None = None) -> None:
        super().__init__(name)
        self._module: ModuleType | None = None
        self._holder = holder  # the globals of the module that called `later`

    def __getattr__(self, attr: str) -> Any:  # only for names the stand-in does not have itself
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self.__name__)
            holder, self._holder = self._holder, None
            if holder is not None:
                for name in [n for n, value in list(holder.items()) if value is self]:
                    holder[name] = module
        return getattr(module, attr)


def later(name: str) -> Any:
    """A stand-in for the module `name`, imported at its first use. Typed `Any`: declare the
    real module under `TYPE_CHECKING` beside it, so that mypy checks every use."""
    return Later(name, sys._getframe(1).f_globals)
