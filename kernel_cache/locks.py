"""Cross-node per-key locks for the shared tier: which kind to use, and soft-lock expiry.

flock is only a cross-node lock where the filesystem forwards it to a lock manager (local disks,
NFS with NLM/v4 locking, Lustre mounted with -o flock, GPFS, CephFS). FUSE filesystems such as
sshfs and NFS mounted with local_lock= accept flock() but lock only on the calling node, so two
nodes would both "hold" it: `auto` reads the filesystem type from /proc/self/mountinfo and uses a
soft lock (an O_EXCL marker file) there. A soft lock cannot be released by the kernel when its
holder dies, so its holder refreshes the marker's mtime (heartbeat) and waiters take over a
marker that has not been refreshed for `stale_after` seconds; one left by a dead process on this
host is taken over at once.

Locks only prevent duplicate compiles; correctness comes from the atomic publish, so a rare
double holder after an expiry costs a compile, never a wrong kernel.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import filelock

LOCK_MODES = ("auto", "flock", "soft")
DEFAULT_STALE_AFTER = 120.0  # > NFS attribute-cache lifetime (acregmax 60 s) plus clock skew
POLL_INTERVAL = 0.05  # first re-check of a busy lock; grows to MAX_POLL_INTERVAL
MAX_POLL_INTERVAL = 0.5  # a waiter notices a published entry within this
STALE_CHECK_INTERVAL = 1.0
_BUSY_ERRNOS = (errno.EEXIST, errno.EAGAIN, errno.EACCES, errno.EPERM)

# Filesystems on which flock() is coherent across every process that can see the directory.
_FLOCK_COHERENT = {
    "ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "ramfs", "zfs", "f2fs", "overlay", "bcachefs",
    "jfs", "reiserfs", "nilfs2", "gpfs", "ceph", "ocfs2", "gfs2",
}


def filesystem_of(path: Path) -> tuple[str, set[str]]:
    """(fs type, mount + super options) of the mount holding `path`, from /proc/self/mountinfo."""
    target = os.path.realpath(path)
    best, best_len = ("unknown", set()), -1
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return best
    for line in lines:
        pre, _, post = line.partition(" - ")
        fields, tail = pre.split(), post.split()
        if len(fields) < 6 or len(tail) < 3:
            continue
        mount_point = fields[4].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= best_len:  # later lines win: they are mounted on top
            options = set(fields[5].split(",")) | set(tail[2].split(","))
            best, best_len = (tail[0], options), len(mount_point)
    return best


def flock_is_coherent(fs_type: str, options: set[str]) -> bool:
    """Whether flock() on this filesystem excludes processes on other nodes too."""
    if fs_type in ("nfs", "nfs4"):
        return not ({"local_lock=flock", "local_lock=all", "nolock"} & options)
    if fs_type == "lustre":
        return "flock" in options
    return fs_type in _FLOCK_COHERENT


def _flock_works(directory: Path) -> bool:
    """Probe: can we flock a file here at all (some filesystems answer ENOLCK/ENOSYS/EOPNOTSUPP)?"""
    probe = directory / f".flock-probe.{os.getpid()}"
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)


def choose_lock_kind(directory: Path, mode: str = "auto") -> str:
    """'flock' or 'soft' for the lock directory, honouring KERNEL_CACHE_LOCK=auto|flock|soft."""
    if mode not in LOCK_MODES:
        raise ValueError(f"lock mode {mode!r}: expected one of {', '.join(LOCK_MODES)}")
    if mode != "auto":
        return mode
    fs_type, options = filesystem_of(directory)
    if flock_is_coherent(fs_type, options) and _flock_works(directory):
        return "flock"
    return "soft"


class _Heartbeat:
    """Refreshes a held soft lock's mtime so waiters can tell a live holder from a dead one."""

    def __init__(self, path: Path, interval: float):
        self._path, self._interval = path, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kernel-cache-lock-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            with contextlib.suppress(OSError):
                os.utime(self._path)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _new_lock(path: Path, kind: str):
    return filelock.FileLock(str(path)) if kind == "flock" else filelock.SoftFileLock(str(path))


def _this_host() -> str:
    """The host name filelock writes into soft markers (with its pid-namespace suffix)."""
    try:
        from filelock._identity import host_name  # filelock >= 3.2x; private but stable in format

        return host_name()
    except ImportError:
        return socket.gethostname()


def _holder_is_dead(content: str) -> bool:
    """A marker ('pid\nhost\n...') written on this host by a process that no longer exists."""
    lines = content.splitlines()
    if len(lines) < 2 or not lines[0].isdigit() or lines[1] != _this_host():
        return False
    try:
        os.kill(int(lines[0]), 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):
        return False
    return False


def break_if_stale(path: Path, stale_after: float) -> bool:
    """Remove a soft marker whose holder is gone: not refreshed for `stale_after` seconds (any
    host), or written by a dead pid on this host. Uses a plain rename, which NFS and sshfs support
    (filelock's own takeover needs renameat2(RENAME_EXCHANGE), which they refuse). If a peer
    replaced the marker in between, it is put back with link(), which never overwrites."""
    try:
        seen = os.stat(path)
        with open(path, encoding="utf-8", errors="replace") as f:
            content = f.read(1024)
    except OSError:
        return False
    if time.time() - seen.st_mtime <= stale_after and not _holder_is_dead(content):
        return False
    aside = path.with_name(f"{path.name}.stale.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        os.rename(path, aside)
    except OSError:
        return False
    try:
        moved = os.stat(aside)
        if (moved.st_ino, moved.st_mtime_ns) != (seen.st_ino, seen.st_mtime_ns):
            with contextlib.suppress(OSError):
                os.link(aside, path)  # a live peer's fresh marker: restore it unless re-taken
            return False
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(aside)


@contextlib.contextmanager
def hold(path: Path, kind: str, timeout: float, stale_after: float = DEFAULT_STALE_AFTER,
         done: Callable[[], bool] = lambda: False, poll: float = POLL_INTERVAL) -> Iterator[bool]:
    """Hold the lock at `path`; yields True if acquired, False if `done()` became true while waiting
    (the result was published by the holder) or `timeout` seconds passed."""
    lock = _new_lock(path, kind)
    deadline = time.monotonic() + max(0.0, timeout)
    acquired, unexplained, next_stale_check = False, 0, 0.0
    while True:
        if kind == "soft" and time.monotonic() >= next_stale_check:
            break_if_stale(path, stale_after)
            next_stale_check = time.monotonic() + STALE_CHECK_INTERVAL
        try:
            lock.acquire(timeout=0)
            acquired = True
            break
        except filelock.Timeout:
            pass
        except OSError as exc:
            # sshfs reports a failed O_EXCL create as EPERM (SFTP v3 has no EEXIST): busy if the
            # marker is there; a real permission problem keeps failing and is raised.
            if kind != "soft" or exc.errno not in _BUSY_ERRNOS:
                raise
            if not path.exists():
                unexplained += 1
                if unexplained >= 3:
                    raise
        if done() or time.monotonic() >= deadline:
            break
        time.sleep(poll)
        poll = min(poll * 1.5, MAX_POLL_INTERVAL)  # fewer stats on the file server as a wait drags on
    if not acquired:
        yield False
        return
    heartbeat = _Heartbeat(path, max(0.05, stale_after / 6)) if kind == "soft" else None
    try:
        yield True
    finally:
        if heartbeat is not None:
            heartbeat.stop()
        with contextlib.suppress(OSError):
            lock.release()


def remove_if_free(path: Path, kind: str, stale_after: float) -> bool:
    """Debris removal: delete the lock file if nobody holds it (flock: a non-blocking flock
    succeeds, and the file is unlinked while we hold it; soft: the marker has not been refreshed
    for `stale_after` seconds). Returns whether it was removed."""
    if kind == "soft":
        return break_if_stale(path, stale_after)
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.unlink(path)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
