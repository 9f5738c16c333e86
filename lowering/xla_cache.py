"""XLA executables beside the kernels: with KERNEL_CACHE_XLA=1 (and KERNEL_CACHE_DIR), JAX's own
persistent compilation cache is pointed at `<KERNEL_CACHE_DIR>/xla` with thresholds that keep
small programs too, so a warm process skips XLA compilation as well as Triton's.

JAX runs what it finds there as code, unchecked, so the directory is handed over only under a rule
stricter than the store's, a trusted group excluded (`private_xla_dir`; docs/trust.md states it);
otherwise with one warning naming why. A directory the user gave JAX is left alone. The executables
are specific to the node's GPU model and driver: node-local, never in the shared level.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

import jax

from kernel_cache.errors import KernelCacheError
from kernel_cache.sanitize import escaped
from kernel_cache.settings.config import XLA_SUBDIR
from kernel_cache.store import Store
from kernel_cache.telemetry.warnings_once import warn_once
from kernel_cache.trust.safefs import Owners

from . import jax_compat


def apply(store: Store) -> Path | None:
    """Point JAX's persistent cache at the store's `xla/` when it may be trusted; returns it (None:
    not enabled, JAX already has a directory of the user's, or refused with a warning)."""
    wanted = store.config.xla_dir
    if wanted is None:
        return None
    current = jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined, unused-ignore]  # jax < 0.12: set at run time (0.12 types it)
    if current and Path(current) != wanted and os.path.realpath(current) != os.path.realpath(wanted):
        return None  # the user's own setting wins
    try:
        directory = private_xla_dir(store)
    except (XlaDirRefused, OSError) as exc:
        if current:  # an earlier apply() in this process handed it over: take it back
            jax.config.update("jax_compilation_cache_dir", None)  # type: ignore[no-untyped-call]  # unannotated in jax
        warn_once(f"xla-refused:{wanted}",
                  f"KERNEL_CACHE_XLA=1: JAX's compilation cache is not pointed at {wanted}: {exc}. JAX runs "
                  f"the executables it finds there as code, so kernel-cache hands it only a directory nobody "
                  f"else can write (README: 'Trust model'); XLA compiles as usual")
        return None
    jax.config.update("jax_compilation_cache_dir", str(directory))  # type: ignore[no-untyped-call]  # unannotated in jax
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # type: ignore[no-untyped-call]  # (as above)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)  # type: ignore[no-untyped-call]  # (as above)
    if current != str(directory):
        jax_compat.redecide_persistent_cache()
    return directory


MAX_CHECKED = 100_000  # names in an existing xla/ looked at before tightening it; more: refused
_OTHERS = stat.S_IRWXG | stat.S_IRWXO
_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


class XlaDirRefused(KernelCacheError):
    """Why `<dir>/xla` is not handed to JAX (the message is the reason, ready for a warning)."""


def private_xla_dir(store: Store) -> Path:
    """`<dir>/xla`, created 0700 if missing, under the rule of docs/trust.md; XlaDirRefused naming the first problem."""
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
