"""Remote level: a Redis server shared by every node of a cluster (KERNEL_CACHE_REMOTE), for sites
with no shared filesystem (cloud pods, Kubernetes jobs, Slurm sites whose NFS is slow or off-limits).

Layout: `kc:<namespace>:v1:e:<key>` holds an entry's bytes exactly as the other levels store them
(signed); `kc:<namespace>:v1:l:<key>` is the lease of the node compiling that key. Writes are
`SET NX` with a TTL (KERNEL_CACHE_REMOTE_TTL) that a verified hit restarts, so what nobody uses
expires; entries over KERNEL_CACHE_MAX_ENTRY_BYTES are neither written nor read.

Never slower than no cache, whatever the server does: every call (connect, send, the whole reply)
has one deadline (KERNEL_CACHE_REMOTE_TIMEOUT) and receives at most the entry cap plus a little
(redis_guard); a read asks the server for a value's type and size before its bytes (one script, one
round trip). After a server fault (connection, timeout, auth, out of memory, a reply past the cap) a
circuit breaker skips the server for a while before one call probes it again; a name of the wrong
type is a miss for that key alone. No call on the data path raises for the server's sake.

Trust: a server has no file owners, so every entry read must carry our signature
(KERNEL_CACHE_SIGNING_KEY_FILE) unless KERNEL_CACHE_REMOTE_UNSIGNED=1 says the operator trusts every
client that can reach it. A rejected value (unsigned, forged, damaged, replayed, oversized, of the
wrong type) is never refreshed by the read that rejects it, and the next verified build of that key
replaces it, only if those same bad bytes are still there (a compare-and-set on the server), so a
neighbour's valid write is never clobbered.

Single-flight across nodes: a lease (remote_lease: signed, with a maximum lifetime) refreshed by a
heartbeat while the holder compiles and released by compare-and-delete; waiters poll with jitter
until the entry is published, the lease lapses or proves unworthy (they take it over), or their wait
bound passes.

This module is long because it is one level's whole protocol, maintenance and breaker included.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from .. import entry as entry_format
from ..config import Config
from ..display import escaped, redacted
from ..entry import CorruptEntry, Entry, check_key
from ..errors import RejectedEntry, TierUnavailable, TierUntrusted
from ..safefs import Owners
from ..signing import Signer
from ..warnings_once import warn_once
from . import redis_guard
from .remote_lease import MAX_LEASE_BYTES, Lease, why_not_honoured


def _redis() -> Any:
    """redis-py, imported on first use: it costs ~0.1-0.3 s, which no process without a remote pays."""
    try:
        import redis
        import redis.backoff
        import redis.retry
    except ImportError:
        raise TierUnavailable("KERNEL_CACHE_REMOTE is set but the redis package is not installed "
                              "(pip install redis)") from None
    return redis

BREAKER_SECONDS = 30.0  # after a server fault, the server is skipped this long, then one call probes it
LEASE_MS = 30_000  # a lock's lease; the holder refreshes it every third of that while it compiles
MAX_SCAN = 200_000  # names `listing` lists before it stops (cachectl on a huge namespace)
REPLY_SLACK = 1 << 20  # bytes a call may receive beyond the entry cap (framing, a pipeline's small replies)
MAINTENANCE_SECONDS = 5.0  # the least deadline of one maintenance call (a SCAN page, 500 names' heads)
MAX_BAD_KEYS = 4096  # rejected values remembered for replacement; the oldest are forgotten
# What a name holds, told without sending its bytes where it could not be an entry: the server-side
# `marker` names a value for compare-and-set (its type, or its size past the cap, or its SHA-1).
_MARKER = """
local function marker(k, cap)
  local t = redis.call('type', k)['ok']
  if t == 'none' then return 'none' end
  if t ~= 'string' then return 'type:' .. t end
  local n = redis.call('strlen', k)
  if n > cap then return 'size:' .. n end
  return 'sha1:' .. redis.sha1hex(redis.call('get', k))
end
"""
# -> nil | {'type', T} | {'size', N} | {'value', bytes}; reads nothing past the cap, refreshes no TTL
_PEEK = """
local t = redis.call('type', KEYS[1])['ok']
if t == 'none' then return nil end
if t ~= 'string' then return {'type', t} end
local n = redis.call('strlen', KEYS[1])
if n > tonumber(ARGV[1]) then return {'size', n} end
return {'value', redis.call('get', KEYS[1])}
"""
# replace (ARGV[3] non-empty, with a PX of ARGV[4]) or delete what `marker` says is still ARGV[2]
_REPLACE = _MARKER + """
local m = marker(KEYS[1], tonumber(ARGV[1]))
if m ~= 'none' and m ~= ARGV[2] then return 0 end
redis.call('del', KEYS[1])
if ARGV[3] ~= '' then redis.call('set', KEYS[1], ARGV[3], 'PX', ARGV[4]) end
return 1
"""
_MARKER_OF = _MARKER + "return marker(KEYS[1], tonumber(ARGV[1]))"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
_REFRESH = ("if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) "
            "else return 0 end")
T = TypeVar("T")


def marker(found: Any) -> str:
    """The server-side `marker` of what _PEEK returned, computed here (for compare-and-set)."""
    if not found:
        return "none"
    kind, value = bytes(found[0]), found[1]
    if kind == b"type":
        return "type:" + bytes(value).decode(errors="replace")
    if kind == b"size":
        return f"size:{int(value)}"
    return "sha1:" + hashlib.sha1(bytes(value)).hexdigest()  # Redis's own digest, an identity, not a MAC


class RemoteTier:
    name = "remote"
    directory: Path | None = None

    def __init__(self, url: str, *, namespace: str = "default", ttl: float = 14 * 86400, timeout: float = 0.25,
                 signer: Signer | None = None, max_entry_bytes: int = 1 << 28,
                 password: str | None = None, breaker_seconds: float = BREAKER_SECONDS,
                 lease_ms: int = LEASE_MS, lease_max_seconds: float = 600.0):
        """`signer`: entries and leases must carry its signature (None: every client of the server
        is trusted, KERNEL_CACHE_REMOTE_UNSIGNED=1). `lease_max_seconds`: the longest a lease is honoured."""
        self._redis = redis = _redis()
        self.url, self.endpoint = url, redacted(url)
        self.namespace = namespace
        self.prefix = f"kc:{namespace}:v1:"
        self.ttl = max(1, int(ttl))
        self.timeout = timeout
        self.signer = signer
        self.authenticate: Callable[[bytes], str | None] | None = signer.problem if signer is not None else None
        self.max_entry_bytes = max_entry_bytes
        self.breaker_seconds = breaker_seconds
        self.lease_ms = lease_ms
        self.lease_max_seconds = lease_max_seconds
        self.counters = {"hits": 0, "misses": 0, "errors": 0, "timeouts": 0, "breaker_openings": 0,
                         "lock_waits": 0, "rejected": 0, "too_large": 0, "writes": 0, "healed": 0,
                         "leases_refused": 0}
        self._open_until = 0.0
        self._lock = threading.Lock()
        self._pending_touches: set[str] = set()
        self._bad: OrderedDict[str, str] = OrderedDict()  # key -> marker of the value we rejected there
        options: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout,
                                   "retry_on_timeout": False, "retry": redis.retry.Retry(redis.backoff.NoBackoff(), 0),
                                   "health_check_interval": 0,
                                   "connection_class": redis_guard.connection_class(url)}
        if password is not None:
            options["password"] = password
        try:
            self.client = redis.Redis.from_url(url, **options)
        except ValueError:  # redis-py's words may quote a piece of the URL, password included
            raise TierUnavailable(f"KERNEL_CACHE_REMOTE={self.endpoint}: redis-py cannot parse this URL (a "
                                  f"password with '/', '?' or '#' must be percent-encoded)") from None
        except redis.RedisError as exc:
            raise TierUnavailable(f"KERNEL_CACHE_REMOTE={self.endpoint}: {escaped(str(exc))}") from None
        self._peek = self.client.register_script(_PEEK)
        self._replace = self.client.register_script(_REPLACE)
        self._marker_of = self.client.register_script(_MARKER_OF)
        self._release = self.client.register_script(_RELEASE)
        self._refresh = self.client.register_script(_REFRESH)

    # The data path ------------------------------------------------------------------------
    @property
    def writable(self) -> bool:
        return time.monotonic() >= self._open_until

    def get(self, key: str) -> Entry | None:
        name = self._entry(key)
        found = self._peeked("read", name, self.max_entry_bytes)
        if found is None:
            self._count("misses")
            return None
        kind, value = found
        if kind == b"size":
            self._remember_bad(key, found)
            self._count("too_large")
            return None
        if kind == b"type":
            self._remember_bad(key, found)
            self._count("rejected")
            raise RejectedEntry(f"remote name for {key[:12]} holds a Redis {escaped(bytes(value).decode(errors='replace'))}, "
                                f"not an entry")
        data = bytes(value)
        if self.authenticate is not None:
            problem = self.authenticate(data)
            if problem is not None:
                self._remember_bad(key, found)
                self._count("rejected")
                raise RejectedEntry(f"remote entry {key[:12]} is {problem}")
        try:
            entry = entry_format.decode(data, expected_key=key)
        except CorruptEntry:
            bad = marker(found)
            self._call("delete", lambda: self._replace(keys=[name], args=[self.max_entry_bytes, bad, b"", 0]), None)
            raise
        with self._lock:
            self._bad.pop(key, None)
        self._count("hits")
        self._call("touch", lambda: self.client.expire(name, self.ttl), None)  # verified: its life restarts
        return entry

    def put_raw(self, key: str, data: bytes) -> None:
        entry_format.decode(data, expected_key=check_key(key))  # a bad entry must not reach the cluster
        if len(data) > self.max_entry_bytes:
            self._count("too_large")
            return
        name = self._entry(key)
        with self._lock:
            bad = self._bad.get(key)
        if bad is None:
            if self._call("write", lambda: self.client.set(name, data, nx=True, ex=self.ttl), None):
                self._count("writes")
            return
        # a value we rejected sits there: replace it, but only if it is still those bytes
        replaced = self._call("heal", lambda: self._replace(keys=[name], args=[self.max_entry_bytes, bad, data,
                                                                              self.ttl * 1000]), None)
        if replaced is not None:
            with self._lock:
                self._bad.pop(key, None)
        if replaced:
            self._count("writes")
            self._count("healed")

    def __contains__(self, key: object) -> bool:
        """Whether an entry may be there: a string at the name, and not the value we rejected."""
        try:
            name = self._entry(key)
        except (TypeError, ValueError):
            return False
        assert isinstance(key, str)
        with self._lock:
            bad = self._bad.get(key)
        if bad is not None:
            now = self._call("read", lambda: self._marker_of(keys=[name], args=[self.max_entry_bytes]), None)
            return isinstance(now, bytes) and now.decode() != bad and now.startswith(b"sha1:")
        return bool(self._call("read", lambda: self.client.type(name), b"none") == b"string")

    @contextlib.contextmanager
    def lock(self, key: str, timeout: float) -> Iterator[bool]:
        """A lease on `key` across nodes: True when held (refreshed until released or its maximum
        lifetime), False when the entry got published meanwhile, `timeout` passed or the server is
        being skipped (the caller then compiles anyway). A lease that is not ours to honour (no
        valid signature, too old, not a lease) is taken over with a compare-and-set."""
        name = self.prefix + "l:" + check_key(key)
        lease = Lease.new(name, self.signer)
        deadline, pause, waited = time.monotonic() + timeout, 0.02, False
        while True:
            if not self.writable:
                yield False  # the server is being skipped: compile here, unlocked across nodes
                return
            if self._call("lock", lambda: self.client.set(name, lease.value, nx=True, px=self.lease_ms), None):
                break
            if self._took_over(name, lease):
                break
            if key in self or time.monotonic() >= deadline:
                yield False
                return
            if not waited:
                waited = True
                self._count("lock_waits")
            time.sleep(min(pause * (0.5 + random.random()), max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 1.0)
        stop = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=(name, lease, stop), daemon=True,
                                name="kernel-cache-remote-lease")
        beat.start()
        try:
            yield True
        finally:
            stop.set()
            beat.join(timeout=self.timeout * 4 + 1)
            self._call("unlock", lambda: self._release(keys=[name], args=[lease.value]), None)

    def close(self) -> None:
        self.flush_touches()
        with contextlib.suppress(Exception):
            self.client.close()

    # Maintenance: a server fault raises TierUnavailable (cachectl says what failed) -----------
    def delete(self, key: str) -> bool:
        name = self._entry(key)
        return bool(self._call("delete", lambda: self.client.delete(name), 0, maintenance=True))

    def peek_raw(self, key: str) -> bytes | None:
        """The stored bytes (at most the entry cap), not refreshing the entry's life. CorruptEntry
        for a name that holds no entry (another Redis type, a value past the cap)."""
        name = self._entry(key)
        found = self._peeked("read", name, self.max_entry_bytes, maintenance=True)
        if found is None:
            return None
        kind, value = found
        if kind == b"type":
            raise CorruptEntry(f"the name holds a Redis {escaped(bytes(value).decode(errors='replace'))}, not an entry")
        if kind == b"size":
            raise CorruptEntry(f"{int(value)} bytes, over KERNEL_CACHE_MAX_ENTRY_BYTES ({self.max_entry_bytes})")
        return bytes(value)

    def listing(self) -> list[dict[str, Any]]:
        """Per entry: key, size_bytes, created (from its header), last_used (from its TTL: a hit
        restarts it), listed with SCAN and bounded by MAX_SCAN. Names of another Redis type are
        listed too (size 0): reading them says what they are."""
        names: list[bytes] = []
        cursor: Any = 0
        while len(names) < MAX_SCAN:
            def page(at: Any = cursor) -> tuple[Any, list[bytes]]:
                found: tuple[Any, list[bytes]] = self.client.scan(at, match=self.prefix + "e:*", count=1000)
                return found
            none: tuple[Any, list[bytes]] = (0, [])
            cursor, more = self._call("scan", page, none, maintenance=True)
            names += more
            if not cursor:
                break
        out: list[dict[str, Any]] = []
        now = time.time()
        for start in range(0, min(len(names), MAX_SCAN), 500):
            chunk = names[start:start + 500]

            def heads(chunk: list[bytes] = chunk) -> list[Any]:
                pipe = self.client.pipeline(transaction=False)
                for name in chunk:
                    pipe.type(name)
                    pipe.strlen(name)
                    pipe.ttl(name)
                    pipe.getrange(name, 0, entry_format.META_PEEK_BYTES - 1)
                replies: list[Any] = pipe.execute(raise_on_error=False)
                return replies
            replies: list[Any] = self._call("scan", heads, [], maintenance=True)
            for i, name in enumerate(chunk):
                kind, size, ttl, head = replies[4 * i:4 * i + 4]
                key = bytes(name).decode(errors="replace")[len(self.prefix) + 2:]
                if not entry_format.is_key(key) or kind == b"none":
                    continue
                size = size if isinstance(size, int) else 0
                ttl = ttl if isinstance(ttl, int) else -1
                last_used = now - max(0, self.ttl - ttl) if ttl > 0 else now
                try:
                    created = float(entry_format.peek_meta_head(head, size).get("created", last_used))
                except (CorruptEntry, TypeError, ValueError):
                    created = last_used
                out.append({"key": key, "size_bytes": int(size), "created": created, "last_used": last_used})
        return out

    def touch(self, keys: Iterable[str]) -> None:
        valid = [check_key(key) for key in keys]
        with self._lock:
            self._pending_touches.update(valid)

    def flush_touches(self) -> None:
        """Restart the TTL of entries a lowered-call record served without reading them."""
        with self._lock:
            keys, self._pending_touches = self._pending_touches, set()
        if not keys:
            return

        def expire() -> None:
            pipe = self.client.pipeline(transaction=False)
            for key in sorted(keys):
                pipe.expire(self._entry(key), self.ttl)
            pipe.execute(raise_on_error=False)
        self._call("touch", expire, None)

    def remove_debris(self, older_than_seconds: float = 0.0) -> list[tuple[str, int]]:
        return []  # a dead holder's lease expires by itself; nothing else is left behind

    def quarantined(self) -> list[dict[str, Any]]:
        return []  # a damaged entry is deleted where found: the server keeps nothing for inspection

    def describe(self) -> dict[str, Any]:
        """What `cachectl stats` and `doctor` show: the endpoint (password hidden), namespace,
        round trip, server version, eviction policy and this process's counters. Server text is
        escaped: it reaches terminals."""
        info: dict[str, Any] = {"endpoint": self.endpoint, "namespace": self.namespace, "ttl_seconds": self.ttl,
                                "counters": dict(self.counters), "reachable": False}
        try:
            with redis_guard.budget(self._maintenance_seconds(), self.max_entry_bytes + REPLY_SLACK):
                start = time.perf_counter()
                self.client.ping()
                info["round_trip_ms"] = round((time.perf_counter() - start) * 1000, 3)
                server = self.client.info("server")
                memory = self.client.info("memory")
            info.update(reachable=True, server_version=_text(server.get("redis_version")),
                        maxmemory=memory.get("maxmemory"), maxmemory_policy=_text(memory.get("maxmemory_policy")))
        except Exception as exc:
            info["error"] = f"{type(exc).__name__}: {escaped(str(exc))}"
        return info

    # Internals ----------------------------------------------------------------------------
    def _entry(self, key: object) -> str:
        return self.prefix + "e:" + check_key(key)

    def _count(self, name: str, by: int = 1) -> None:
        with self._lock:
            self.counters[name] += by

    def _remember_bad(self, key: str, found: Any) -> None:
        with self._lock:
            self._bad[key] = marker(found)
            self._bad.move_to_end(key)
            while len(self._bad) > MAX_BAD_KEYS:
                self._bad.popitem(last=False)

    def _took_over(self, name: str, lease: Lease) -> bool:
        """Take the lease at `name` over when what is there is not to be honoured; True when ours."""
        found = self._peeked("lock", name, MAX_LEASE_BYTES)
        if found is None:
            return False  # gone meanwhile (or the server failed): try SET NX again
        value = found[1] if found[0] == b"value" else b"(not a lease)"
        why = why_not_honoured(value, name, self.signer, self.lease_max_seconds)
        if why is None:
            return False
        taken = self._call("lock", lambda: self._replace(keys=[name], args=[MAX_LEASE_BYTES, marker(found),
                                                                           lease.value, self.lease_ms]), 0)
        if taken:
            self._count("leases_refused")
            warn_once(f"remote-lease:{self.endpoint}:{why}",
                      f"remote cache {self.endpoint}: ignored a compile lease {why}; compiling here")
        return bool(taken)

    def _heartbeat(self, name: str, lease: Lease, stop: threading.Event) -> None:
        while not stop.wait(self.lease_ms / 3000):
            if lease.expired(self.lease_max_seconds):
                return  # past its maximum lifetime: let it lapse, whatever the compile is doing
            self._call("lease", lambda: self._refresh(keys=[name], args=[lease.value, self.lease_ms]), None)

    def _peeked(self, what: str, name: str, cap: int, maintenance: bool = False) -> tuple[bytes, Any] | None:
        """What _PEEK says `name` holds: (b'value', bytes), (b'type', bytes), (b'size', int), or None
        (nothing there, or the server failed). A reply of another shape is the server's fault."""
        found = self._call(what, lambda: self._peek(keys=[name], args=[cap]), None, maintenance=maintenance)
        if found is None:
            return None
        if isinstance(found, list) and len(found) == 2:
            kind, value = found
            if (kind in (b"value", b"type") and isinstance(value, bytes)) or (kind == b"size" and isinstance(value, int)):
                return kind, value
        cause = self._open_breaker(None, False, 0.0)
        warn_once(f"remote:{self.endpoint}:malformed", f"remote cache {self.endpoint} {cause} ({what}); skipping it "
                  f"for {self.breaker_seconds:.0f} s at a time, compiling and caching locally meanwhile")
        if maintenance:
            raise TierUnavailable(f"remote cache {self.endpoint}: {cause} ({what})")
        return None

    def _maintenance_seconds(self) -> float:
        return max(self.timeout, MAINTENANCE_SECONDS)

    def _call(self, what: str, op: Callable[[], T], default: T, *, maintenance: bool = False) -> T:
        """Run `op` within one deadline and byte budget unless the breaker is open. On a fault of
        one name (WRONGTYPE): the default. On a server fault: the breaker opened, one warning per
        cause, and the default on the data path (which never raises for the server's sake), or
        TierUnavailable for maintenance (cachectl must say what failed)."""
        if time.monotonic() < self._open_until:
            if maintenance:
                raise TierUnavailable(f"remote cache {self.endpoint}: being skipped after an error; try again in "
                                      f"{self._open_until - time.monotonic():.0f} s")
            return default
        seconds = self._maintenance_seconds() if maintenance else self.timeout
        try:
            with redis_guard.budget(seconds, self.max_entry_bytes + REPLY_SLACK) as call:
                return op()
        except Exception as exc:  # not only RedisError: redis-py fails otherwise on some replies of a bad server
            if isinstance(exc, self._redis.ResponseError) and str(exc).startswith("WRONGTYPE"):
                self._count("errors")  # one name holds another type: that key's miss, not the level's
                if maintenance:
                    raise TierUnavailable(f"remote cache {self.endpoint}: {escaped(str(exc))} ({what})") from None
                return default
            cause = self._open_breaker(exc, call.overflowed, seconds)
            warn_once(f"remote:{self.endpoint}:{cause.split(':')[0]}",
                      f"remote cache {self.endpoint} {cause} ({what}); skipping it for "
                      f"{self.breaker_seconds:.0f} s at a time, compiling and caching locally meanwhile")
            if maintenance:
                raise TierUnavailable(f"remote cache {self.endpoint}: {cause} ({what})") from None
            return default

    def _open_breaker(self, exc: Exception | None, overflowed: bool, seconds: float) -> str:
        """Count the fault (None: a reply of the wrong shape), skip the server for a while; the
        fault's cause, escaped, for messages."""
        timeout = isinstance(exc, self._redis.TimeoutError)
        with self._lock:
            self.counters["too_large" if overflowed else "timeouts" if timeout else "errors"] += 1
            self.counters["breaker_openings"] += 1
            self._open_until = time.monotonic() + self.breaker_seconds
        if overflowed:
            return f"sent a reply over {self.max_entry_bytes + REPLY_SLACK} bytes"
        if timeout:
            return f"timed out (no whole reply within {seconds:g} s)"
        if exc is None or not isinstance(exc, self._redis.RedisError):
            return "sent a reply that is no answer to what was asked" + (
                f" ({type(exc).__name__} in redis-py: {escaped(str(exc))})" if exc is not None else "")
        return f"{type(exc).__name__}: {escaped(str(exc))}"


def _text(value: object) -> str | None:
    """A server-given string, escaped for a terminal."""
    return None if value is None else escaped(str(value))


def open_from_config(config: Config, owners: Owners, signer: Signer | None, read_only: bool) -> RemoteTier | None:
    """The remote level KERNEL_CACHE_REMOTE names (None: not configured). Without a signing key it
    opens only when KERNEL_CACHE_REMOTE_UNSIGNED=1 says every client of the server is trusted."""
    if config.remote is None:
        return None
    if signer is None and not config.remote_unsigned:
        raise TierUntrusted(f"remote cache {redacted(config.remote)}: a server has no file owners, so kernel-cache "
                            f"needs a signing key to trust what it serves (KERNEL_CACHE_SIGNING_KEY_FILE), or "
                            f"KERNEL_CACHE_REMOTE_UNSIGNED=1 if every client that can reach it is trusted")
    return RemoteTier(config.remote, namespace=config.remote_namespace, ttl=config.remote_ttl,
                      timeout=config.remote_timeout, signer=signer,
                      max_entry_bytes=config.max_entry_bytes, password=config.remote_password,
                      lease_max_seconds=config.lock_timeout)
