"""Keys that do not depend on where files live: a path in a key document stands for its content.

Triton's parsed options name files by absolute path (libdevice and other extern libs), and its
cache-invalidating environment may too (TRITON_LIBDEVICE_PATH, TRITON_PTXAS_PATH). Two nodes that
install the same Triton at different paths (another venv, a copied site-packages) must compute the
same keys, or a shared cache silently stops sharing. Digests are memoized per path by (device, inode,
size, mtime): true under any configuration, so module-level rather than the session's.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from typing import Any

import xxhash

MAX_DIRECTORY_FILES = 10_000  # a directory with more files keeps its path (correct, just not portable)
_memo: dict[str, tuple[tuple[int, ...], str]] = {}
_lock = threading.Lock()


def portable(value: Any) -> Any:
    """`value` (JSON-like: dicts, lists, tuples, scalars) with every absolute path to an existing file
    or directory replaced by {"file": digest} / {"directory": digest}; everything else unchanged."""
    if isinstance(value, str):
        return _path_part(value) if value.startswith(os.sep) else value
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(portable(v) for v in value)
    return value


def _path_part(text: str) -> Any:
    try:
        st = os.stat(text)
    except (OSError, ValueError):
        return text  # not a path of anything here: kept as written
    if stat.S_ISREG(st.st_mode):
        return {"file": _file_digest(text, st)}
    if stat.S_ISDIR(st.st_mode):
        found = _directory_digest(text)
        return text if found is None else {"directory": found}
    return text


def _file_digest(path: str, st: os.stat_result) -> str:
    identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    with _lock:
        found = _memo.get(path)
    if found is not None and found[0] == identity:
        return found[1]
    with open(path, "rb") as f:
        result = str(hashlib.file_digest(f, xxhash.xxh3_128).hexdigest())
    with _lock:
        _memo[path] = (identity, result)
    return result


def _directory_digest(top: str) -> str | None:
    """Digest of the regular files below `top` (relative names and contents), walked iteratively
    without following links; None past MAX_DIRECTORY_FILES."""
    files: list[tuple[str, str]] = []
    pending = [""]
    while pending:
        rel = pending.pop()
        try:
            with os.scandir(os.path.join(top, rel)) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            name = os.path.join(rel, entry.name)
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                pending.append(name)
            elif stat.S_ISREG(st.st_mode):
                if len(files) >= MAX_DIRECTORY_FILES:
                    return None
                files.append((name, _file_digest(os.path.join(top, name), st)))
    h = xxhash.xxh3_128()
    for name, digest in sorted(files):
        h.update(f"{name}\0{digest}\n".encode())
    return str(h.hexdigest())
