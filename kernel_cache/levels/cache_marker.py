"""Which directories are kernel-cache's: a `CACHEDIR.TAG` marker (the Cache Directory Tagging
Specification, https://bford.info/cachedir/, so backup tools skip the cache too) names the kind.

Without it, a mistyped `KERNEL_CACHE_DIR=$HOME` would fill a home directory with `entries/`,
`locks/` and `stats/`. So a directory becomes a cache only when it is new, empty, or holds nothing
but names kernel-cache itself makes; a local cache is never taken for a shared one or the other way
round. The marker is written without fsync (two fsyncs would slow a fresh node on a slow disk):
after a power cut it may be missing or cut short, which reads as no marker, and it is written again.
"""

from __future__ import annotations

import contextlib

from kernel_cache.errors import LevelUnavailable
from kernel_cache.settings.cache_settings import SETTINGS_FILE
from kernel_cache.settings.config import TOOLCHAIN_MEMO, XLA_SUBDIR
from kernel_cache.trust.safefs import Owners, Tree, UnsafeFile, is_temp

MARKER = "CACHEDIR.TAG"
SIGNATURE = "Signature: 8a477f597d28d172789f06886806bc55"  # the specification's fixed first line
_MAX_MARKER_BYTES = 4096
_OURS = "# kernel-cache "
LOCAL, SHARED = "local", "shared"
ENTRIES_DIR, LOCKS_DIR, STATS_DIR, QUARANTINE_DIR = "entries", "locks", "stats", "quarantine"  # the layout's folders
KINDS = (LOCAL, SHARED)
# What kernel-cache itself puts in a local cache directory (one written before the marker existed is
# recognised by holding nothing else), and the mark scripts/demo.py leaves in the directory it creates.
DEMO_MARKER = ".kernel-cache-demo"
LOCAL_NAMES = frozenset({ENTRIES_DIR, LOCKS_DIR, STATS_DIR, XLA_SUBDIR, TOOLCHAIN_MEMO, SETTINGS_FILE, MARKER,
                         DEMO_MARKER})


class NotACacheDirectory(LevelUnavailable):
    """A directory kernel-cache will not use as a cache (holds other files, or is the other kind)."""


def marker_text(kind: str) -> bytes:
    return (f"{SIGNATURE}\n{_OURS}{kind} cache directory: made and used by kernel-cache; backup tools may "
            f"skip it (https://bford.info/cachedir/).\n").encode()


def kind_of(tree: Tree) -> str | None:
    """'local' or 'shared' where the directory carries our marker; None: no marker; '': another tool's."""
    try:
        found = tree.read(MARKER, max_bytes=_MAX_MARKER_BYTES)
    except (UnsafeFile, OSError):
        return ""
    if found is None:
        return None
    if any(len(found[0]) < len(ours) and ours.startswith(found[0]) for ours in map(marker_text, KINDS)):
        return None  # empty, or ours cut short by a power cut (it is written without fsync): no marker yet
    lines = found[0].decode("utf-8", "replace").splitlines()
    if len(lines) < 2 or lines[0].strip() != SIGNATURE or not lines[1].startswith(_OURS):
        return ""
    kind = lines[1][len(_OURS):].split(" ", 1)[0]
    return kind if kind in KINDS else ""


def check(tree: Tree, kind: str, own_names: frozenset[str], *, write: bool) -> str | None:
    """Accept `tree` as a `kind` cache directory, writing the marker when `write` and it has none;
    NotACacheDirectory otherwise. Returns `kind`, or None where it had no marker."""
    found = kind_of(tree)
    if found == kind:
        return found
    where = tree.path
    if found in KINDS:
        other = "--shared-dir / KERNEL_CACHE_SHARED_DIR" if found == SHARED else "--dir / KERNEL_CACHE_DIR"
        raise NotACacheDirectory(f"{where} is a kernel-cache {found} cache directory, not a {kind} one (name "
                                 f"it with {other})")
    foreign = sorted(name for name, _ in tree.listdir() if name not in own_names and not is_temp(name))
    refusal = "not turning it into a cache; pick an empty or new directory"
    if found == "":
        raise NotACacheDirectory(f"{where} is not a kernel-cache directory and holds a {MARKER} that is not "
                                 f"kernel-cache's: {refusal}")
    if foreign:
        shown = ", ".join(repr(n)[1:-1] for n in foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise NotACacheDirectory(f"{where} is not a kernel-cache directory and holds other files ({shown}): "
                                 f"{refusal}")
    if write:
        with contextlib.suppress(OSError):  # a read-only cache stays usable; the marker comes with a write
            tree.publish(MARKER, data=marker_text(kind), durable=False)
    return None


def claim_directory(path: str) -> bool:
    """Create `path` if missing and accept it as a local cache directory (marking it); False where it is not one."""
    try:
        tree = Tree(path, Owners.current(), create=True)
    except OSError:
        return False
    try:
        check(tree, LOCAL, LOCAL_NAMES, write=True)
        return True
    except NotACacheDirectory:
        return False
    finally:
        tree.close()
