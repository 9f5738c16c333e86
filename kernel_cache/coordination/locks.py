"""Cross-node per-key locks for the shared level: which kind to use, and soft-lock expiry.

flock is a cross-node lock only where the filesystem forwards it to a lock manager; sshfs and NFS
mounted with local_lock= lock on the calling node alone, so `auto` uses a soft lock (an O_EXCL marker
file) there. Its holder refreshes the marker's mtime; waiters take over one not refreshed for
`stale_after` seconds (or left by a dead process on this host). Locks only prevent duplicate
compiles (correctness comes from the atomic publish), so a rare double holder costs a compile,
never a wrong kernel. Every wait is polled against a deadline: nothing here blocks in the kernel.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from kernel_cache.coordination import LOCK_MODES
from kernel_cache.sanitize import echo
from kernel_cache.trust.safefs import Tree, UnsafeFile

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
    """(fs type, mount + super options) of the mount holding `path`."""
    target = os.path.realpath(path)
    best: tuple[str, set[str]] = ("unknown", set())
    best_len = -1
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
    if fs_type in ("nfs", "nfs4"):
        return not ({"local_lock=flock", "local_lock=all", "nolock"} & options)
    if fs_type == "lustre":
        return "flock" in options
    return fs_type in _FLOCK_COHERENT


def _flock_works(tree: Tree, parts: tuple[str, ...]) -> bool:
    """Whether flock works here at all (some filesystems answer ENOLCK/ENOSYS/EOPNOTSUPP)."""
    probe = (*parts, f".flock-probe.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        with tree.open_lock_file(*probe) as fd:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return True
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            tree.unlink(*probe)


def choose_lock_kind(tree: Tree, parts: tuple[str, ...], mode: str = "auto") -> str:
    if mode not in LOCK_MODES:
        raise ValueError(f"lock mode {echo(mode)}: expected one of {', '.join(LOCK_MODES)}")
    if mode != "auto":
        return mode
    fs_type, options = filesystem_of(Path(tree.path, *parts))
    if flock_is_coherent(fs_type, options) and _flock_works(tree, parts):
        return "flock"
    return "soft"


def _heartbeat(tree: Tree, parts: tuple[str, ...], interval: float, stop: threading.Event) -> None:
    """Refresh a held soft lock's mtime: waiters tell a live holder from a dead one."""
    while not stop.wait(interval):
        with contextlib.suppress(OSError):
            tree.touch(*parts)


def _holder_is_dead(content: str) -> bool:
    """A marker ('pid\nhost\n...') written on this host by a process that no longer exists."""
    lines = content.splitlines()
    if len(lines) < 2 or not lines[0].isdigit() or lines[1] != socket.gethostname():
        return False
    try:
        os.kill(int(lines[0]), 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):
        return False
    return False


def break_if_stale(tree: Tree, parts: tuple[str, ...], stale_after: float) -> bool:
    """Remove a soft marker whose holder is gone (not refreshed for `stale_after` seconds, or a dead
    pid on this host). A rename (NFS and sshfs have it) moves it aside; a peer's marker renamed in
    between is put back with link(), which never overwrites."""
    seen = tree.lstat(*parts)
    if seen is None:
        return False
    content = ""
    with contextlib.suppress(OSError):  # the safe layer refuses a link, FIFO or foreign file: no holder named
        found = tree.read(*parts, max_bytes=4096)
        content = found[0].decode("utf-8", "replace") if found else ""
    if time.time() - seen.st_mtime <= stale_after and not _holder_is_dead(content):
        return False
    name = parts[-1]
    aside = f"{name}.stale.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        with tree.directory(*parts[:-1]) as dfd:
            try:
                os.rename(name, aside, src_dir_fd=dfd, dst_dir_fd=dfd)
            except OSError:
                return False
            try:
                moved = os.stat(aside, dir_fd=dfd, follow_symlinks=False)
                if (moved.st_ino, moved.st_mtime_ns) != (seen.st_ino, seen.st_mtime_ns):
                    with contextlib.suppress(OSError):  # a live peer's fresh marker: restore it
                        os.link(aside, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
                    return False
                return True
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(aside, dir_fd=dfd)
    except OSError:
        return False


def hold(tree: Tree, parts: tuple[str, ...], kind: str, timeout: float, stale_after: float = DEFAULT_STALE_AFTER,
         done: Callable[[], bool] = lambda: False) -> contextlib.AbstractContextManager[bool]:
    """Hold the lock at root/parts: True if acquired, False if `done()` (published) or `timeout` came first."""
    return _hold_flock(tree, parts, timeout, done) if kind == "flock" else _hold_soft(tree, parts, timeout, stale_after, done)


def _tries(timeout: float, done: Callable[[], bool]) -> Iterator[None]:
    """One step per try, sleeping between them, until `done()` (published) or out of time."""
    deadline, poll = time.monotonic() + max(0.0, timeout), POLL_INTERVAL
    while True:
        yield
        if done() or time.monotonic() >= deadline:
            return
        time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
        poll = min(poll * 1.5, MAX_POLL_INTERVAL)  # fewer stats on the file server as a wait drags on


@contextlib.contextmanager
def _hold_flock(tree: Tree, parts: tuple[str, ...], timeout: float, done: Callable[[], bool]) -> Iterator[bool]:
    with tree.open_lock_file(*parts) as fd:
        for _ in _tries(timeout, done):
            with contextlib.suppress(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
        else:
            yield False
            return
        try:
            yield True
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)


@contextlib.contextmanager
def _hold_soft(tree: Tree, parts: tuple[str, ...], timeout: float, stale_after: float,
               done: Callable[[], bool]) -> Iterator[bool]:
    unexplained, next_stale_check, mine = 0, 0.0, None
    for _ in _tries(timeout, done):
        if time.monotonic() >= next_stale_check:
            break_if_stale(tree, parts, stale_after)
            next_stale_check = time.monotonic() + STALE_CHECK_INTERVAL
        try:
            mine = tree.write_new(*parts, data=f"{os.getpid()}\n{socket.gethostname()}\n".encode())
            break
        except FileExistsError:
            pass
        except UnsafeFile:
            raise
        except OSError as exc:
            # sshfs reports a failed O_EXCL create as EPERM (SFTP v3 has no EEXIST): busy if the
            # marker is there; a real permission problem keeps failing and is raised.
            if exc.errno not in _BUSY_ERRNOS:
                raise
            if tree.lstat(*parts) is None:
                unexplained += 1
                if unexplained >= 3:
                    raise
    else:
        yield False
        return
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(tree, parts, max(0.05, stale_after / 6), stop),
                            name="kernel-cache-lock-heartbeat", daemon=True)
    beat.start()
    try:
        yield True
    finally:
        stop.set()
        beat.join()
        with contextlib.suppress(OSError):
            tree.unlink(*parts, expect_ino=mine.st_ino)


def remove_if_free(tree: Tree, parts: tuple[str, ...], kind: str, stale_after: float) -> bool:
    """Delete the lock file if nobody holds it (flock: unlinked while we hold it; soft: stale)."""
    if kind == "soft":
        return break_if_stale(tree, parts, stale_after)
    st = tree.lstat(*parts)
    if st is None:
        return False
    if not stat.S_ISREG(st.st_mode):  # a planted link or FIFO: remove the name itself
        return tree.unlink(*parts)
    try:
        with tree.directory(*parts[:-1]) as dfd:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.unlink(parts[-1], dir_fd=dfd)
                return True
            finally:
                os.close(fd)
    except OSError:
        return False
