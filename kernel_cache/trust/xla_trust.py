"""Whether kernel-cache may hand `<KERNEL_CACHE_DIR>/xla` to JAX's persistent compilation cache.

JAX loads the files there as executables and runs them with no check of who wrote them: a file
someone else places there is code run as you, on the host. Kernel entries can afford a trusted
group (each is decoded and checked, and a kernel only runs on the GPU inside our launch); this
directory cannot, so its rule is stricter than the store's:
- the store accepted KERNEL_CACHE_DIR under its own rule (its local level is open);
- KERNEL_CACHE_DIR and `xla/` are real directories (no symlink) owned by you (or root) that no one
  else may write, a trusted group included;
- `xla/` is private (0700), so no one else can reach a file in it whatever its mode: kernel-cache
  creates it so, and tightens an older one only after checking every name in it is your file;
- every directory above KERNEL_CACHE_DIR is owned by you or root and, where others may write it,
  sticky (as /tmp is), so no one can move the cache away and put one of theirs in its place.
Knows nothing of JAX: `lowering.xla_cache` asks here, then configures JAX.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from kernel_cache.errors import KernelCacheError
from kernel_cache.sanitize import escaped
from kernel_cache.settings.config import XLA_SUBDIR
from kernel_cache.store import Store
from kernel_cache.trust.safefs import Owners

MAX_CHECKED = 100_000  # names in an existing xla/ looked at before tightening it; more: refused
_OTHERS = stat.S_IRWXG | stat.S_IRWXO
_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


class XlaDirRefused(KernelCacheError):
    """Why `<dir>/xla` is not handed to JAX (the message is the reason, ready for a warning)."""


def private_xla_dir(store: Store) -> Path:
    """`<dir>/xla`, created 0700 if missing, after checking the whole rule above; XlaDirRefused
    naming the first problem otherwise."""
    config = store.config
    if config.dir is None:
        raise XlaDirRefused("no KERNEL_CACHE_DIR")
    if store.disk is None:
        why = store.unavailable.get("disk")
        raise XlaDirRefused(f"the kernel cache refused {escaped(config.dir)}" + (f" ({why})" if why else ""))
    top = Path(os.path.realpath(config.dir))
    me = Owners.current(None)  # no trusted group here: executables are trusted to you alone
    _check_ancestors(top)
    _check_own(top, os.lstat(top), me, "KERNEL_CACHE_DIR")
    xla = top / XLA_SUBDIR
    with contextlib.suppress(FileExistsError):
        os.mkdir(xla, 0o700)
    fd = os.open(xla, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        _check_own(xla, st, me, "its xla/")
        if st.st_mode & _OTHERS:
            _check_contents(xla, fd, me)
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~_OTHERS)
    finally:
        os.close(fd)
    return xla


def _check_own(path: Path, st: os.stat_result, me: Owners, what: str) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise XlaDirRefused(f"{what} {escaped(path)} is not a directory")
    if st.st_mode & _WRITABLE_BY_OTHERS:
        raise XlaDirRefused(f"{what} {escaped(path)} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}); "
                            f"a trusted group is trusted with kernels, not with executables JAX runs unchecked")
    problem = me.problem(st)
    if problem:
        raise XlaDirRefused(f"{what} {escaped(path)} {problem}")


def _check_ancestors(top: Path) -> None:
    """No one but you and root can rename a directory on the way to the cache."""
    me = os.geteuid()
    for parent in top.parents:
        st = os.lstat(parent)
        if st.st_uid not in (me, 0):
            raise XlaDirRefused(f"{escaped(parent)}, above the cache, belongs to uid {st.st_uid}, who could "
                                f"replace the cache directory")
        if st.st_mode & _WRITABLE_BY_OTHERS and not st.st_mode & stat.S_ISVTX:
            raise XlaDirRefused(f"{escaped(parent)}, above the cache, is writable by others and not sticky "
                                f"(mode {stat.S_IMODE(st.st_mode):04o}): they could replace the cache directory")


def _check_contents(xla: Path, fd: int, me: Owners) -> None:
    """Before an older, non-private xla/ is made private: every name in it is a regular file of
    yours that no one else may write (JAX's cache is flat)."""
    with os.scandir(fd) as names:
        for count, item in enumerate(names):
            if count >= MAX_CHECKED:
                raise XlaDirRefused(f"{escaped(xla)} holds over {MAX_CHECKED} names to check; empty it or "
                                    f"chmod 700 it yourself")
            st = item.stat(follow_symlinks=False)
            where = escaped(os.path.join(xla, item.name))
            if not stat.S_ISREG(st.st_mode):
                raise XlaDirRefused(f"{where} is not a regular file (JAX writes only files there)")
            problem = me.problem(st)
            if problem:
                raise XlaDirRefused(f"{where} {problem}")
