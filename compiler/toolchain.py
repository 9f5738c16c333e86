"""The toolchain fingerprint: which Triton build and which ptxas produced a binary.

Triton's own `triton_key()` hashes libtriton (~0.4 s) and `backend.hash()` runs `ptxas --version`
(~20 ms). A warm process must pay neither, so both are memoized in a small JSON file keyed by the
identity (path, size, mtime_ns) of the files they depend on. Reinstalling Triton or swapping ptxas
changes the identity, which forces a recompute.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kernel_cache
from kernel_cache import cache_marker, safefs
from kernel_cache.config import TOOLCHAIN_MEMO
from kernel_cache.digest import digest

from . import triton_compat as tc
from .target import Target

MEMO_FILE = TOOLCHAIN_MEMO
MAX_MEMO_BYTES = 1 << 20
_lock = threading.Lock()
_process_memo: dict[str, str] = {}
_per_target: dict[tuple[Any, ...], dict[str, Any]] = {}
_primed = False


def default_memo_dir() -> Path | None:
    """Where the memo lives: the process configuration's (kernel_cache.Config.memo_dir: the cache
    directory, else the user's cache home; None when caching is disabled or there is no home)."""
    return kernel_cache.current_config().memo_dir


def _identity(path: str | None) -> list[Any]:
    if not path:
        return [None]
    try:
        st = os.stat(path)
    except OSError:
        return [path, None]
    return [path, st.st_size, st.st_mtime_ns]


def _triton_identity() -> list[Any]:
    pkg = tc.triton_package_dir()
    files = [tc.libtriton_path(), os.path.join(pkg, "__init__.py"),
             os.path.join(pkg, "compiler", "compiler.py"), os.path.join(pkg, "runtime", "cache.py")]
    return [tc.TRITON_VERSION] + [_identity(f) for f in files]


def _backend_identity(target: Target) -> list[Any]:
    pkg = tc.triton_package_dir()
    backend_dir = "nvidia" if target.backend == "cuda" else "amd"
    return [target.backend, str(target.arch), _identity(os.path.join(pkg, "backends", backend_dir, "compiler.py"))] \
        + [_identity(p) for p in tc.ptxas_candidates(target)]


class _Memo:
    """A JSON dict on disk; unreadable or unwritable files just mean recomputing."""

    def __init__(self, directory: Path | None):
        self.path = Path(directory) / MEMO_FILE if directory is not None else None

    def load(self) -> dict[str, Any]:
        if self.path is None:
            return {}
        try:
            raw = safefs.read_file(self.path, MAX_MEMO_BYTES)
            data = json.loads(raw) if raw else {}
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def store(self, key: str, value: str) -> None:
        if self.path is None:
            return
        try:
            if not cache_marker.claim_directory(str(self.path.parent)):
                return  # not a kernel-cache directory: never written into (recomputed next time)
            data = self.load()
            data[key] = value
            with safefs.atomic_file(self.path) as f:
                f.write(json.dumps(data, sort_keys=True).encode())
        except OSError:
            pass  # unwritable: recomputed next time


def _memoized(name: str, identity: list[Any], compute: Callable[[], str], memo_dir: Path | None) -> str:
    ident = json.dumps([name, identity], sort_keys=True)
    with _lock:
        if ident in _process_memo:
            return _process_memo[ident]
        memo = _Memo(memo_dir if memo_dir is not None else default_memo_dir())
        value = memo.load().get(ident)
        if not isinstance(value, str):
            value = compute()
            memo.store(ident, value)
        _process_memo[ident] = value
        return value


def memoized_for_file(name: str, path: str, compute: Callable[[], str]) -> str:
    """A text derived from one file (a schema read out of a plugin binary, ...), kept in the same
    memo as the toolchain fingerprint and recomputed when the file's size or mtime changes."""
    return _memoized(name, _identity(path), compute, None)


def prime_in_background() -> None:
    """Start Triton's build key (the bulk of the fingerprint: hashing libtriton, 0.3-0.5 s where the
    memo is missing or stale) on a daemon thread, so that a cold process pays for it while it imports
    and builds its model, not at its first lowering; where the memo is fresh this reads one small file.
    (Pure hashing, no Triton C++: a daemon thread may be left at exit.)"""
    global _primed
    with _lock:
        if _primed:
            return
        _primed = True
    threading.Thread(target=lambda: _memoized("triton_key", _triton_identity(), tc.triton_build_key, None),
                     name="kernel-cache-toolchain", daemon=True).start()


def toolchain_fingerprint(target: Target, memo_dir: Path | None = None) -> dict[str, Any]:
    """What identifies the tools that turn a spec into a binary for `target`.

    The installed files are checked once per process and target (a Triton upgrade takes a new
    process anyway); Triton's cache-invalidating environment variables are read on every call.
    """
    return {**_installed_tools(target, memo_dir), "env": tc.cache_invalidating_env()}


def installed_tools(target: Target, memo_dir: Path | None = None) -> dict[str, Any]:
    """The toolchain fingerprint without Triton's environment (which callers read per use)."""
    return dict(_installed_tools(target, memo_dir))


def _installed_tools(target: Target, memo_dir: Path | None) -> dict[str, Any]:
    slot = (target, str(memo_dir))
    with _lock:
        cached = _per_target.get(slot)
    if cached is None:
        cached = {
            "triton_version": tc.TRITON_VERSION,
            "triton_build": _memoized("triton_key", _triton_identity(), tc.triton_build_key, memo_dir),
            "backend": _memoized("backend_hash", _backend_identity(target),
                                 lambda: tc.backend_toolchain_hash(target), memo_dir),
        }
        with _lock:
            _per_target[slot] = cached
    return cached


def toolchain_summary(target: Target, memo_dir: Path | None = None) -> str:
    """A short identity of the installed tools (not the environment), stored in entries so
    `cachectl --stale` can tell entries built by another Triton/ptxas. Triton's cache-invalidating
    environment variables are part of every content key instead: a cachectl run without the job's
    TRITON_* settings must not call the job's entries stale."""
    tools = _installed_tools(target, memo_dir)
    return f"triton-{tools['triton_version']}+{digest(tools)[:12]}"


def clear_process_memo() -> None:
    with _lock:
        _process_memo.clear()
        _per_target.clear()
