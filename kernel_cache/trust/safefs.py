"""The one way kernel-cache touches files under a cache directory that other users may write.

A cache directory is hostile ground: any name in it may be a symlink, a FIFO (a reader blocks
forever), a huge sparse file, or a file planted by an untrusted user. So a `Tree` walks below its
root one `openat(O_DIRECTORY|O_NOFOLLOW)` at a time, checking each level's owner and mode (`Owners`);
opens files O_NOFOLLOW|O_NONBLOCK and reads only regular files of a trusted owner, never past a cap;
creates only with O_EXCL; and deletes by name relative to a checked directory descriptor.

This module is long because every filesystem operation the store performs on ground other users
can write is here, on purpose in one place to review.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from typing import BinaryIO

from kernel_cache.errors import KernelCacheError
from kernel_cache.value_class import FrozenValue

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
READ_CHUNK = 1 << 20
WALK_MAX_DEPTH = 32  # levels a walk under a cache directory descends (our layouts use 3)
WALK_MAX_NAMES = 200_000  # names a walk lists before it stops and says so
_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH
TEMP_SUFFIX = ".tmp"
_fault_hook: Callable[[str, str], None] | None = None


def set_fault_hook(hook: Callable[[str, str], None] | None) -> Callable[[str, str], None] | None:
    """Install `hook(point, path)`, called at "before_rename" (a publish's temp file written and
    fsynced, not yet renamed: tests inject a killed writer, ENOSPC); returns the previous one."""
    global _fault_hook
    previous, _fault_hook = _fault_hook, hook
    return previous


def host_tag() -> str:
    """This host's name, safe inside a file name (tells operators which node left a file)."""
    return re.sub(r"[^A-Za-z0-9-]", "_", socket.gethostname())[:40] or "host"


def temp_name(final_name: str) -> str:
    """A hidden name beside `final_name`, unique across hosts and processes (host + pid + random):
    what a writer killed before its rename leaves, and `is_temp` recognises."""
    return f".{final_name}.{host_tag()}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}"


def is_temp(name: str) -> bool:
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)


class UnsafeFile(KernelCacheError, OSError):
    """A path refused because of what it is (symlink, FIFO, device, too large) or who owns it."""

    def __init__(self, path: str, reason: str, owner: bool = False):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason
        self.owner = owner  # refused for who may have written it, not for what it is


def _user(uid: int) -> str:
    import pwd  # (the user and group databases only for a message or a named group: not at import)

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _group(gid: int) -> str:
    import grp

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return f"gid {gid}"


def resolve_group(name: str) -> int:
    text = str(name).strip()
    if text.isdigit():
        return int(text)
    import grp

    return grp.getgrnam(text).gr_gid


class Owners(FrozenValue):
    """Whose files a reader accepts: not world-writable, group-writable only by a trusted group, owned
    by this user, root or the trusted group."""

    uids: frozenset[int]  # this user and root
    gid: int | None  # the trusted group (KERNEL_CACHE_TRUSTED_GROUP)
    writer_gids: frozenset[int]  # this user's group, root's and the trusted one

    def __init__(self, uids: frozenset[int], gid: int | None, writer_gids: frozenset[int]) -> None:
        self.__dict__.update(uids=uids, gid=gid, writer_gids=writer_gids)

    @classmethod
    def current(cls, group: int | None = None) -> "Owners":
        gids = {os.getegid(), 0} | ({group} if group is not None else set())
        return cls(uids=frozenset({os.geteuid(), 0}), gid=group, writer_gids=frozenset(gids))

    def problem(self, st: os.stat_result) -> str | None:
        """Why a file with this stat may have been written by an untrusted user, or None."""
        mode = st.st_mode
        if not mode & _WRITABLE_BY_OTHERS and st.st_uid in self.uids:
            return None  # the common case, first
        if mode & stat.S_IWOTH:
            return "is writable by every user"
        if mode & stat.S_IWGRP and st.st_gid not in self.writer_gids:
            return (f"is writable by group {_group(st.st_gid)}, which is not trusted "
                    f"(set KERNEL_CACHE_TRUSTED_GROUP={_group(st.st_gid)} to trust it)")
        if st.st_uid in self.uids or (self.gid is not None and st.st_gid == self.gid):
            return None
        trusted = f" or group {_group(self.gid)}" if self.gid is not None else ""
        return f"is owned by {_user(st.st_uid)}:{_group(st.st_gid)}, not by you{trusted}"

    def describe(self) -> str:
        me = _user(os.geteuid())
        return me + (f" and group {_group(self.gid)}" if self.gid is not None else "")


def check_name(name: str) -> str:
    """One path component we created or listed: no separators, no '.'/'..', no NUL."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise UnsafeFile(repr(name), "is not a plain file name")
    return name


class Tree:
    """A directory opened once (its own path may hold symlinks: the user chose it) and everything below
    it reached without following any. `owners=None`: for content authenticated by signature instead."""

    _fd = -1
    _top: dict[str, int] = {}

    def __init__(self, path: str | os.PathLike[str], owners: Owners | None, *, create: bool = False):
        self.path = os.fspath(path)
        self.owners = owners
        if create:
            os.makedirs(self.path, exist_ok=True)
        self._fd = self._open_root()
        self._top = {}  # first-level name -> kept descriptor (dup'd, checked when first opened)
        self._top_lock = threading.Lock()  # no thread dups a kept descriptor another is closing

    def _open_root(self) -> int:
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
        try:
            self._check(os.fstat(fd))
        except BaseException:
            os.close(fd)  # never stored: __del__ must not close this number again later
            raise
        return fd

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        kept, self._top = self._top, {}
        _close_all([fd, *kept.values()])

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # at interpreter shutdown the modules close() uses may already be torn down
            pass

    def reopen(self) -> None:
        """After ESTALE: the directory was replaced under us."""
        fd = self._open_root()
        with self._top_lock:
            old, self._fd = self._fd, fd
            kept, self._top = self._top, {}
        _close_all([old, *kept.values()])

    def _check(self, st: os.stat_result, parts: tuple[str, ...] = (), regular: bool = False) -> None:
        refused = _refusal(st, self.owners, regular)
        if refused is not None:  # the path built only for a refusal: this runs on every read
            raise UnsafeFile(self._where(parts), *refused)

    def _where(self, parts: tuple[str, ...]) -> str:
        return str(os.path.join(self.path, *parts))

    # Directories --------------------------------------------------------------------------
    @contextlib.contextmanager
    def directory(self, *parts: str, create: bool = False) -> Iterator[int]:
        """A checked descriptor of root/parts; with `create`, missing levels are made (0777 & ~umask)."""
        fd = self._open_dir(parts, create)
        try:
            yield fd
        finally:
            os.close(fd)

    def _open_dir(self, parts: tuple[str, ...], create: bool = False) -> int:
        """Reads start from a kept descriptor of the first level (checked once: `entries/` is opened on
        every hit); creation walks from the root, so writes land in the live tree."""
        start = 0
        with self._top_lock:
            top = self._top.get(parts[0]) if parts and not create else None
            if top is not None:
                fd, start = os.dup(top), 1
            else:
                fd = os.dup(self._fd)
        try:
            for i in range(start, len(parts)):
                name = check_name(parts[i])
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, 0o777, dir_fd=fd)
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                        raise UnsafeFile(self._where(parts[:i + 1]),
                                         "is not a directory (a symbolic link or another kind of file)") from None
                    raise
                os.close(fd)
                fd = child
                self._check(os.fstat(fd), parts[:i + 1])
                if i == 0 and not create:
                    with self._top_lock:
                        if parts[0] not in self._top:
                            self._top[parts[0]] = os.dup(fd)
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _forget_if_gone(self, first: str) -> bool:
        """Drop a kept first-level descriptor whose directory was deleted (rm -rf); True: look again."""
        with self._top_lock:
            top = self._top.get(first)
            if top is None:
                return False
            try:
                gone = os.fstat(top).st_nlink == 0
            except OSError:
                gone = True
            if gone:
                del self._top[first]
                with contextlib.suppress(OSError):
                    os.close(top)
        return gone

    def listdir(self, *parts: str) -> list[tuple[str, os.stat_result]]:
        """(name, lstat) of every entry in root/parts; [] when the directory is missing."""
        try:
            with self.directory(*parts) as fd:
                out = []
                with os.scandir(fd) as it:
                    for entry in it:
                        with contextlib.suppress(OSError):
                            out.append((entry.name, entry.stat(follow_symlinks=False)))
                return out
        except FileNotFoundError:
            return []

    def walk(self, *parts: str) -> tuple[list[tuple[tuple[str, ...], os.stat_result]], bool]:
        """Everything below root/parts as ([(parts, lstat)], truncated), parents first: iterative (a
        planted 10,000-level tree is no recursion) and bounded, `truncated` saying a bound was hit."""
        found: list[tuple[tuple[str, ...], os.stat_result]] = []
        pending, truncated = [(tuple(parts), 0)], False
        while pending:
            where, depth = pending.pop()
            try:
                listed = self.listdir(*where)
            except OSError:
                continue  # replaced or refused meanwhile: what it held is not ours to count
            for name, st in listed:
                if len(found) >= WALK_MAX_NAMES:
                    return found, True
                found.append(((*where, name), st))
                if stat.S_ISDIR(st.st_mode):
                    if depth + 1 < WALK_MAX_DEPTH:
                        pending.append(((*where, name), depth + 1))
                    else:
                        truncated = True
        return found, truncated

    def remove_tree(self, *parts: str) -> bool:
        """Remove the directory root/parts and what it holds, bottom-up, bounded like `walk`; False
        when something in it could not be removed (another user's, too deep)."""
        found, truncated = self.walk(*parts)
        for sub, st in reversed(found):  # children before their parents
            with contextlib.suppress(OSError):
                if stat.S_ISDIR(st.st_mode):
                    self.rmdir(*sub)
                else:
                    self.unlink(*sub)
        try:
            self.rmdir(*parts)
        except OSError:
            return False
        return not truncated

    def rmdir(self, *parts: str) -> None:
        with self.directory(*parts[:-1]) as dfd:
            os.rmdir(check_name(parts[-1]), dir_fd=dfd)

    # Files --------------------------------------------------------------------------------
    def lstat(self, *parts: str) -> os.stat_result | None:
        try:
            with self.directory(*parts[:-1]) as fd:
                return os.stat(check_name(parts[-1]), dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def check_regular(self, *parts: str) -> None:
        """UnsafeFile where root/parts is there but is no regular file this tree's owners wrote: for a
        file another library opens by path (SQLite follows a link and blocks on a FIFO)."""
        st = self.lstat(*parts)
        if st is not None:
            self._check(st, parts, regular=True)

    def absent(self, *parts: str) -> bool:
        """True only when nothing is at root/parts: one stat from the kept descriptor of the first
        level, a miss's whole cost (a link below it may be followed: a probe, never a read). False
        where it cannot say (that level not kept yet, or replaced since)."""
        with self._top_lock:
            top = self._top.get(parts[0]) if len(parts) > 1 else None
            if top is None:
                return False
            try:
                os.stat("/".join(map(check_name, parts[1:])), dir_fd=top, follow_symlinks=False)
                return False
            except FileNotFoundError:
                pass
            except OSError:
                return False
        return not self._forget_if_gone(parts[0])  # a level deleted since: looked up again from the root

    def read(self, *parts: str, max_bytes: int, head: int | None = None) -> tuple[bytes, os.stat_result] | None:
        """(content, fstat) of the regular file root/parts (its first `head` bytes), or None if absent.
        UnsafeFile for a symlink, FIFO, device, untrusted owner or a file over `max_bytes`."""
        for attempt in (1, 2):
            try:
                dfd = self._open_dir(parts[:-1])
                try:
                    return read_at(dfd, parts[-1], max_bytes, self.owners, "", head)
                except UnsafeFile as exc:  # read_at names only the file: name the whole path
                    raise UnsafeFile(self._where(parts), exc.reason, exc.owner) from None
                finally:
                    os.close(dfd)
            except FileNotFoundError:
                if attempt == 2 or len(parts) < 2 or not self._forget_if_gone(parts[0]):
                    return None
        return None

    def write_new(self, *parts: str, data: bytes) -> os.stat_result:
        """Create root/parts with `data`; FileExistsError if the name exists in any form."""
        with self.directory(*parts[:-1], create=True) as dfd:
            fd = os.open(check_name(parts[-1]), _NEW_FLAGS, 0o666, dir_fd=dfd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                return os.fstat(fd)
            finally:
                os.close(fd)

    def publish(self, *parts: str, data: bytes, durable: bool = True) -> None:
        """Write `data` to root/parts atomically (`durable=False`: no fsync, for a file whose loss
        after a power cut costs nothing); modes follow the umask, so a group-shared directory stays
        shareable."""
        tmp = temp_name(parts[-1])
        with self.directory(*parts[:-1], create=True) as dfd:
            with _replace_atomically(dfd, check_name(parts[-1]), check_name(tmp),
                                     self._where((*parts[:-1], tmp)), durable) as f:
                f.write(data)

    def unlink(self, *parts: str, expect_ino: int | None = None) -> bool:
        """Remove root/parts if it is not a directory (a symlink itself, never its target); with
        `expect_ino`, only if it is still that file."""
        try:
            with self.directory(*parts[:-1]) as dfd:
                name = check_name(parts[-1])
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode) or (expect_ino is not None and st.st_ino != expect_ino):
                    return False
                os.unlink(name, dir_fd=dfd)
                return True
        except FileNotFoundError:
            return False

    def rename(self, src: tuple[str, ...], dst: tuple[str, ...], expect_ino: int | None = None) -> bool:
        """Move what is at `src` within the tree; False if it is gone or was replaced."""
        try:
            with self.directory(*src[:-1]) as sfd, self.directory(*dst[:-1], create=True) as dfd:
                name = check_name(src[-1])
                st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
                if expect_ino is not None and st.st_ino != expect_ino:
                    return False
                os.rename(name, check_name(dst[-1]), src_dir_fd=sfd, dst_dir_fd=dfd)
                return True
        except FileNotFoundError:
            return False

    def touch(self, *parts: str) -> None:
        """Set mtime to now (needs only write access, like `touch`)."""
        with self.directory(*parts[:-1]) as dfd:
            os.utime(check_name(parts[-1]), dir_fd=dfd, follow_symlinks=False)

    @contextlib.contextmanager
    def open_lock_file(self, *parts: str) -> Iterator[int]:
        with self.directory(*parts[:-1], create=True) as dfd:
            fd = os.open(check_name(parts[-1]), _LOCK_FLAGS, 0o666, dir_fd=dfd)
            try:
                self._check(os.fstat(fd), parts, regular=True)
                yield fd
            finally:
                os.close(fd)


@contextlib.contextmanager
def _replace_atomically(dir_fd: int, final: str, tmp: str, tmp_path: str,
                        durable: bool = True) -> Iterator[BinaryIO]:
    """The one atomic write: `tmp` (created O_EXCL), fsynced and renamed over `final`, removed on any
    failure, so a reader sees the old file or the whole new one. `durable=False` skips the fsyncs:
    only for a file whose loss after a power cut means recomputing it, never for an entry."""
    fd = os.open(tmp, _NEW_FLAGS, 0o666, dir_fd=dir_fd)  # 0666 & ~umask: group-shared dirs stay shared
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        if _fault_hook is not None:
            _fault_hook("before_rename", tmp_path)
        os.replace(tmp, final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    if durable:
        with contextlib.suppress(OSError):  # durability of the rename; some NFS servers refuse
            os.fsync(dir_fd)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], durable: bool = True) -> Iterator[BinaryIO]:
    """Write a file outside any cache tree (a bundle, the toolchain memo) the same atomic way."""
    path = os.fspath(path)
    parent, name = os.path.split(os.path.abspath(path))
    tmp = temp_name(name)
    dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    try:
        with _replace_atomically(dfd, name, tmp, os.path.join(parent, tmp), durable) as f:
            yield f
    finally:
        os.close(dfd)


def write_file(path: str | os.PathLike[str], data: bytes, durable: bool = True) -> None:
    """`atomic_file` for bytes in hand: one call (a context manager is entered twice)."""
    with atomic_file(path, durable) as f:
        f.write(data)


def read_file(path: str | os.PathLike[str], max_bytes: int) -> bytes | None:
    """A small file outside any cache tree read under the same rules; None when it is missing."""
    parent, name = os.path.split(os.path.abspath(os.fspath(path)))
    try:
        dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        return read_at(dfd, name, max_bytes, None, os.fspath(path))[0]
    except FileNotFoundError:
        return None
    finally:
        os.close(dfd)


def read_at(dir_fd: int, name: str, max_bytes: int, owners: Owners | None,
            where: str = "", head: int | None = None) -> tuple[bytes, os.stat_result]:
    try:
        fd = os.open(check_name(name), _READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFile(where or name, "is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        refused = _refusal(st, owners, True)
        if refused is not None:
            raise UnsafeFile(where or name, *refused)
        if st.st_size > max_bytes:
            raise UnsafeFile(where or name, f"is {st.st_size} bytes, over the {max_bytes}-byte cap "
                                    f"(KERNEL_CACHE_MAX_ENTRY_BYTES)")
        return _read_exactly(fd, st.st_size if head is None else min(head, st.st_size)), st
    finally:
        os.close(fd)


def _refusal(st: os.stat_result, owners: Owners | None, regular: bool) -> tuple[str, bool] | None:
    """Why `st` is refused (and whether for its owner): (with `regular`) no regular file, or not one `owners` trust."""
    if regular and not stat.S_ISREG(st.st_mode):
        return "is not a regular file (a FIFO, device or directory)", False
    problem = None if owners is None else owners.problem(st)
    return None if problem is None else (problem, True)


def _read_exactly(fd: int, size: int) -> bytes:
    """At most `size` bytes (a file that grows while read is cut at the size fstat gave); one read
    comes back uncopied (join returns a lone item itself)."""
    chunks: list[bytes] = []
    while size > 0 and (chunk := os.read(fd, min(size, READ_CHUNK))):
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
