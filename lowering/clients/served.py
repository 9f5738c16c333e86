"""What every client adapter shares: version and configuration gates, lowering a call or falling
back, the tally.

A call we cannot honour (an unknown keyword, an argument kind we do not lower, an error of ours)
goes to the client's own lowering with one warning per cause: interception never fails a program.
"""

from __future__ import annotations

import importlib.metadata
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

import kernel_cache
from kernel_cache.errors import KernelCacheError
from kernel_cache.interception import UnsupportedClient
from kernel_cache.telemetry.warnings_once import warn_once

from ..frontend import rule
from ..planning.configs import kernel_name

_tally: dict[str, dict[str, int]] = {}  # client -> {"served": calls, "fallback": calls}
_lock = threading.Lock()
__all__ = ["UnsupportedCall", "UnsupportedClient", "check_configuration", "check_version", "serve", "tally"]


class UnsupportedCall(KernelCacheError, ValueError):
    """One call asks for something the adapter does not lower (the client lowers it itself)."""


def check_version(client: str, distribution: str, lowest: tuple[int, ...], below: tuple[int, ...]) -> None:
    """UnsupportedClient unless the installed version of `distribution` is within [lowest, below)."""
    try:
        version = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise UnsupportedClient(f"{client} is importable but {distribution} is not installed as a package, so "
                                f"its version is unknown") from None
    if not lowest <= tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0])[:4]) < below:
        raise UnsupportedClient(f"{distribution} {version} is not a version kernel-cache knows (it knows "
                                f"{'.'.join(map(str, lowest))} up to, not including, {'.'.join(map(str, below))})")


def check_configuration() -> None:
    """A malformed setting declines the client once, instead of sending each call to the client with a
    warning of its own."""
    try:
        kernel_cache.current_config()
    except kernel_cache.ConfigError as exc:
        raise UnsupportedClient(f"a malformed setting: {exc}; correct it or unset it") from None


def serve(client: str, kernel: Any, platform: str, ctx: Any, operands: tuple[Any, ...], translate: Callable[[], dict[str, Any]],
          own: Callable[[], Any], noted: Mapping[str, Any] | None = None) -> Any:
    """Lower one client call through `rule.lower_call` with the parameters `translate()` gives; the
    client's own lowering (`own()`), after one warning per cause, when `translate` raises
    UnsupportedCall or our lowering fails."""
    try:
        params = translate()
    except UnsupportedCall as exc:
        return _fall_back(client, str(exc), str(exc), own)
    try:
        out = rule.lower_call(platform, ctx, operands, params, noted=noted)
    except Exception as exc:  # never fail the program for it
        name = kernel_name(kernel)
        return _fall_back(client, f"{type(exc).__name__}:{name}",
                          f"lowering kernel '{name}' failed here: {type(exc).__name__}: {exc}", own)
    _count(client, "served")
    return out


def _fall_back(client: str, cause: str, why: str, own: Callable[[], Any]) -> Any:
    _count(client, "fallback")
    warn_once(f"intercept-call:{client}:{cause}",
              f"kernel-cache left a {client} call to {client}'s own compile path: {why}")
    return own()


def _count(client: str, what: str) -> None:
    with _lock:
        _tally.setdefault(client, {"served": 0, "fallback": 0})[what] += 1


def tally() -> dict[str, dict[str, int]]:
    """{client: {"served": n, "fallback": m}} for this process."""
    with _lock:
        return {client: dict(counts) for client, counts in _tally.items()}
