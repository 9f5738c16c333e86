"""What every client adapter shares: version gates, the per-client tally, and falling back.

A call we cannot honour (an unknown keyword, an argument kind we do not lower, an error of ours)
goes to the client's own lowering with one warning per cause: interception never fails a program.
"""

from __future__ import annotations

import importlib.metadata
import re
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from kernel_cache.interception import UnsupportedClient
from kernel_cache.warnings_once import warn_once

_tally: Counter = Counter()
_lock = threading.Lock()
__all__ = ["UnsupportedCall", "UnsupportedClient", "check_parameters", "check_version", "fall_back", "served", "tally"]


class UnsupportedCall(ValueError):
    """One call asks for something the adapter does not lower (the client lowers it itself)."""


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:4])


def check_version(client: str, distribution: str, lowest: tuple[int, ...], below: tuple[int, ...]) -> str:
    """The installed version of `distribution`, if within [lowest, below); else UnsupportedClient."""
    try:
        version = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise UnsupportedClient(f"{client} is importable but {distribution} is not installed as a package, so "
                                f"its version is unknown") from None
    if not lowest <= version_tuple(version) < below:
        raise UnsupportedClient(f"{distribution} {version} is not a version kernel-cache knows (it knows "
                                f"{'.'.join(map(str, lowest))} up to, not including, {'.'.join(map(str, below))})")
    return version


def check_parameters(client: str, what: str, found: set[str], known: set[str]) -> None:
    """A capability check beside the version: the function we replace takes what we expect."""
    if found != known:
        extra, missing = sorted(found - known), sorted(known - found)
        raise UnsupportedClient(f"{client}'s {what} takes parameters kernel-cache does not expect "
                                f"(new: {extra or 'none'}, gone: {missing or 'none'})")


def served(client: str) -> None:
    with _lock:
        _tally[(client, "served")] += 1


def fall_back(client: str, cause: str, why: str, own: Callable[[], Any]) -> Any:
    """The client's own lowering for this call, after one warning per `cause`."""
    with _lock:
        _tally[(client, "fallback")] += 1
    warn_once(f"intercept-call:{client}:{cause}",
              f"kernel-cache left a {client} call to {client}'s own compile path: {why}")
    return own()


def tally() -> dict[str, dict[str, int]]:
    """{client: {"served": n, "fallback": m}} for this process."""
    with _lock:
        out: dict[str, dict[str, int]] = {}
        for (client, what), n in _tally.items():
            out.setdefault(client, {"served": 0, "fallback": 0})[what] = n
        return out
