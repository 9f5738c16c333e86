"""The toolchain fingerprint: which Triton build and which ptxas produced a binary.

Triton's own `triton_key()` hashes all of libtriton and `backend.hash()` runs `ptxas --version` (a
subprocess). A warm process must pay neither, so both are memoized in a small JSON file keyed by the
identity (path, size, mtime_ns) of the files they depend on: a reinstall or another ptxas recomputes.

A fresh node need not hash libtriton either: the sha256 its installer recorded in the RECORD
(`InstalledHashes`) gives the very text `triton_key()` returns; a file the RECORD cannot vouch for is
hashed. (Like the memo, this misses an in-place edit that keeps the size and sets the mtime back.)
Before deriving anything, a node without the memo asks the cluster's levels (`_shared_memoized`).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kernel_cache
from kernel_cache.entries import memo_entry
from kernel_cache.entries.canonical import digest
from kernel_cache.levels import cache_marker
from kernel_cache.settings.config import TOOLCHAIN_MEMO
from kernel_cache.trust import safefs

from . import triton_compat as tc
from .target import Target

MAX_MEMO_BYTES = 1 << 20
_lock = threading.Lock()
_process_memo: dict[str, str] = {}
_per_target: dict[tuple[Any, ...], dict[str, Any]] = {}
_primed = False
generation = 0  # advanced whenever the installed tools are to be read anew (`clear_process_memo`)


def _identity(path: str | None) -> list[Any]:
    if not path:
        return [None]
    try:
        st = os.stat(path)
    except OSError:
        return [path, None]
    return [path, st.st_size, st.st_mtime_ns]


def _triton_identity() -> list[Any]:
    pkg = tc.TRITON_DIR
    files = [tc.LIBTRITON, os.path.join(pkg, "__init__.py"),
             os.path.join(pkg, "compiler", "compiler.py"), os.path.join(pkg, "runtime", "cache.py")]
    return [tc.TRITON_VERSION] + [_identity(f) for f in files]


def _backend_identity(target: Target) -> list[Any]:
    backend = os.path.join(tc.TRITON_DIR, "backends", tc.BACKEND_DIRS[target.backend], "compiler.py")
    return [target.backend, str(target.arch), _identity(backend)] + [_identity(p) for p in tc.ptxas_candidates(target)]


MAX_RECORD_BYTES = 64 << 20


class InstalledHashes:
    """The sha256 of a package's files from the RECORDs beside it where they can be trusted (`recorded`),
    else from the bytes (listed in `hashed`)."""

    def __init__(self, package_dir: str):
        self.hashed: list[str] = []
        self._recorded: dict[str, tuple[str, int, int] | None] = {}  # path -> (base64, size, RECORD mtime_ns)
        site = os.path.dirname(os.path.abspath(package_dir))
        try:
            infos = [e.path for e in os.scandir(site) if e.name.endswith(".dist-info") and e.is_dir()]
        except OSError:
            infos = []
        for info in sorted(infos):
            self._read_record(site, os.path.join(info, "RECORD"), os.path.basename(package_dir.rstrip(os.sep)))

    def _read_record(self, site: str, record: str, top: str) -> None:
        try:
            with open(record, "rb") as f:
                st = os.fstat(f.fileno())
                raw = f.read(MAX_RECORD_BYTES + 1) if st.st_size <= MAX_RECORD_BYTES else b""
        except OSError:
            return
        needle = f"{top}/".encode()
        if len(raw) > MAX_RECORD_BYTES or needle not in raw:
            return
        lines = [line.decode("utf-8", "replace") for line in raw.splitlines() if needle in line]
        for row in csv.reader(lines):
            if len(row) != 3 or f"{top}/" not in row[0]:
                continue  # a file outside the package (RECORD's paths are relative, with "/")
            path = os.path.normpath(os.path.join(site, row[0]))
            algorithm, _, value = row[1].partition("=")
            found = (value, int(row[2])) if algorithm == "sha256" and value and row[2].isdigit() else None
            if path not in self._recorded:
                self._recorded[path] = None if found is None else (*found, st.st_mtime_ns)
            elif (known := self._recorded[path]) is not None and found is not None and known[:2] == found:
                self._recorded[path] = (known[0], known[1], max(known[2], st.st_mtime_ns))
            else:
                self._recorded[path] = None  # listed twice, differently: trust neither

    def recorded(self, path: str) -> str | None:
        """The recorded sha256 of `path` where it is a regular file of the recorded size, not changed
    since the RECORD was written, and every RECORD listing it agrees; else None."""
        found = self._recorded.get(os.path.normpath(os.path.abspath(path)))
        if found is None:
            return None
        try:
            st = os.lstat(path)  # a link put in the file's place is not the file installed there
            digest = base64.urlsafe_b64decode(found[0] + "=" * (-len(found[0]) % 4))
        except (OSError, ValueError):
            return None
        unchanged = stat.S_ISREG(st.st_mode) and st.st_size == found[1] and st.st_mtime_ns <= found[2]
        return digest.hex() if unchanged and len(digest) == 32 else None

    def sha256(self, path: str) -> str:
        found = self.recorded(path)
        if found is not None:
            return found
        self.hashed.append(path)
        with open(path, "rb") as f:  # as Triton hashes libtriton, read in chunks
            return hashlib.file_digest(f, "sha256").hexdigest()


def triton_build_key() -> str:
    """Triton's build key, each file's hash taken from Triton's RECORD where it can be trusted."""
    hashes = InstalledHashes(tc.TRITON_DIR)
    return tc.triton_build_key(lambda paths: [hashes.sha256(path) for path in paths])


_claimed: set[str] = set()  # memo directories whose marker this process checked or wrote: asked once each


def _read_memo(path: Path) -> dict[str, Any]:
    try:
        raw = safefs.read_file(path, MAX_MEMO_BYTES)
        data = json.loads(raw) if raw else {}
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}  # unreadable: recomputed


def _save_memo(path: Path, new: dict[str, str], held: dict[str, Any] | None = None) -> None:
    """`new` merged over the file as read (`held`; else read now): a racing writer's value may be lost
    (it is recomputed once); never into a directory that is not kernel-cache's."""
    try:
        directory = str(path.parent)
        if directory not in _claimed:
            if not cache_marker.claim_directory(directory):
                return
            _claimed.add(directory)
        data = {**(_read_memo(path) if held is None else held), **new}
        safefs.write_file(path, json.dumps(data, sort_keys=True).encode(), durable=False)  # no fsync: a torn memo is recomputed
    except OSError:
        pass  # unwritable: recomputed next time


def _memoized(wanted: dict[str, tuple[list[Any], Callable[[], str]]], memo_dir: Path | None = None) -> dict[str, str]:
    """Per name, `compute()`'s text for its identity: from this process, the memo file in `memo_dir`
    (default: the session's, then its cluster's levels), or computed; the file read and written once."""
    store: kernel_cache.Store | None = None
    if memo_dir is None:
        session = kernel_cache.current_session()
        memo_dir, store = session.config.memo_dir, session.store
    path = None if memo_dir is None else Path(memo_dir) / TOOLCHAIN_MEMO
    on_disk: dict[str, Any] | None = None
    new: dict[str, str] = {}
    texts: dict[str, str] = {}
    try:
        for name, (identity, compute) in wanted.items():
            ident = json.dumps([name, identity], sort_keys=True)
            with _lock:
                if ident not in _process_memo:
                    if on_disk is None:
                        on_disk = {} if path is None else _read_memo(path)
                    value = on_disk.get(ident)
                    if not isinstance(value, str):
                        value = new[ident] = _shared_memoized(store, name, identity, compute) \
                            if store and store.cluster_levels else compute()
                    _process_memo[ident] = value
                texts[name] = _process_memo[ident]
    finally:
        if path is not None and new:
            _save_memo(path, new, on_disk)
    return texts


def node_identity(identity: Any) -> Any:
    """`identity` with each file's inode and ctime_ns added, which no copy, reinstall or edit keeps:
    one host's pods or a site's shared installation share a memo, another host's image copy does not."""
    if not isinstance(identity, list):
        return identity
    if (len(identity) == 3 and isinstance(identity[0], str) and os.path.isabs(identity[0])
            and all(type(part) is int for part in identity[1:])):
        try:
            st = os.stat(identity[0])
        except OSError:
            return [*identity, None]
        return [*identity, st.st_ino, st.st_ctime_ns]
    return [node_identity(part) for part in identity]


def _shared_memoized(store: kernel_cache.Store, name: str, identity: list[Any], compute: Callable[[], str]) -> str:
    """Memo `name` from `store`'s cluster levels where a node seeing these very files derived it, else
    `compute()`d and published. Never weaker than the node's own memo: the record repeats name and
    identity (`memo_entry.text_for`) and is signed and verified where a signing key is configured."""
    node = node_identity(identity)
    key = memo_entry.memo_key(name, node)
    entry = store.get_shared(key)
    text = None if entry is None else memo_entry.text_for(entry, name, node)
    if text is None:
        text = compute()
        if len(text.encode()) <= memo_entry.MAX_TEXT_BYTES:
            store.put_shared(memo_entry.to_entry(name, node, text))
    return text


def memoized_for_file(name: str, path: str, compute: Callable[[], str]) -> str:
    """A text derived from one file (a plugin binary's schema), memoized with the toolchain."""
    return _memoized({name: (_identity(path), compute)})[name]


def prime_in_background(on_cold: Callable[[], object] | None = None) -> None:
    """Derive Triton's build key on a daemon thread while the process builds its model, not at its
    first lowering. `on_cold`: called first where no memo holds the key (a process about to compile)."""
    global _primed
    with _lock:
        if _primed:
            return
        _primed = True

    def computed() -> str:
        if on_cold is not None:
            on_cold()
        return triton_build_key()

    threading.Thread(target=lambda: _memoized({"triton_key": (_triton_identity(), computed)}),
                     name="kernel-cache-toolchain", daemon=True).start()


def toolchain_fingerprint(target: Target, memo_dir: Path | None = None) -> dict[str, Any]:
    """What identifies the tools that turn a spec into a binary for `target`: the installed files
    (once per process), Triton's cache-invalidating environment (again when it changes)."""
    return {**installed_tools(target, memo_dir), "env": dict(tc.triton_env.get())}


def installed_tools(target: Target, memo_dir: Path | None = None) -> dict[str, Any]:
    """The toolchain fingerprint without the environment, once per target and memo directory (shared)."""
    slot = (target, str(memo_dir))
    with _lock:
        cached = _per_target.get(slot)
    if cached is None:
        found = _memoized({"triton_key": (_triton_identity(), triton_build_key),
                           "backend_hash": (_backend_identity(target), lambda: tc.backend_toolchain_hash(target))},
                          memo_dir)  # one write for both
        cached = {"triton_version": tc.TRITON_VERSION, "triton_build": found["triton_key"],
                  "backend": found["backend_hash"]}
        with _lock:
            _per_target[slot] = cached
    return cached


def toolchain_summary(target: Target, memo_dir: Path | None = None) -> str:
    """A short identity of the installed tools for `cachectl --stale`; not the environment, so a cachectl
    run without the job's TRITON_* settings does not call the job's entries stale."""
    tools = installed_tools(target, memo_dir)
    return f"triton-{tools['triton_version']}+{digest(tools)[:12]}"


def clear_process_memo() -> None:
    """Read the installed tools anew; memos derived from them compare `generation`, advanced here."""
    global generation
    with _lock:
        generation += 1
        _process_memo.clear()
        _per_target.clear()
