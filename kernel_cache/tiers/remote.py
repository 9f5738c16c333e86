"""Remote level: a Redis server shared by every node of a cluster (KERNEL_CACHE_REMOTE), for sites
with no shared filesystem (cloud pods, Kubernetes jobs, Slurm sites whose NFS is slow or off-limits).

Layout: `kc:<namespace>:v1:e:<key>` holds an entry's bytes exactly as the other levels store them
(signed); `kc:<namespace>:v1:l:<key>` is the lease of the node compiling that key. Writes are
`SET NX` with a TTL (KERNEL_CACHE_REMOTE_TTL) that a hit refreshes, so what nobody uses expires;
entries over KERNEL_CACHE_MAX_ENTRY_BYTES are neither written nor read.

Never slower than no cache: connect and read timeouts are milliseconds (KERNEL_CACHE_REMOTE_TIMEOUT),
redis-py's retries are off, and after an error a circuit breaker skips the server for a while before
one call probes it again; a server that is down, hung or refusing writes costs at most one timeout
per breaker period, never fails a call, and is named in one warning per cause.

Trust: a server has no file owners, so every entry read must carry our signature
(KERNEL_CACHE_SIGNING_KEY_FILE) unless KERNEL_CACHE_REMOTE_UNSIGNED=1 says the operator trusts every
client that can reach it; refused entries are counted, never copied into a faster level.

Single-flight across nodes: a lease (`SET NX PX`, a random token) refreshed by a heartbeat while the
holder compiles and released by compare-and-delete; waiters poll with jitter until the entry is
published, the lease lapses (its holder died) and they take it, or their wait bound passes.

This module is long because it is one level's whole protocol, maintenance and breaker included.
"""

from __future__ import annotations

import contextlib
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from .. import entry as entry_format
from ..config import Config
from ..display import redacted
from ..entry import CorruptEntry, Entry, check_key
from ..errors import RejectedEntry, TierUnavailable, TierUntrusted
from ..safefs import Owners
from ..signing import Signer
from ..warnings_once import warn_once


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

BREAKER_SECONDS = 30.0  # after an error, the server is skipped this long, then one call probes it
LEASE_MS = 30_000  # a lock's lease; the holder refreshes it every third of that while it compiles
MAX_SCAN = 200_000  # names `records` lists before it stops (cachectl on a huge namespace)
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
_REFRESH = ("if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) "
            "else return 0 end")
T = TypeVar("T")


class RemoteTier:
    name = "remote"
    directory: Path | None = None

    def __init__(self, url: str, *, namespace: str = "default", ttl: float = 14 * 86400, timeout: float = 0.25,
                 authenticate: Callable[[bytes], str | None] | None = None, max_entry_bytes: int = 1 << 28,
                 password: str | None = None, breaker_seconds: float = BREAKER_SECONDS,
                 lease_ms: int = LEASE_MS):
        self._redis = redis = _redis()
        self.url, self.endpoint = url, redacted(url)
        self.namespace = namespace
        self.prefix = f"kc:{namespace}:v1:"
        self.ttl = max(1, int(ttl))
        self.timeout = timeout
        self.authenticate = authenticate
        self.max_entry_bytes = max_entry_bytes
        self.breaker_seconds = breaker_seconds
        self.lease_ms = lease_ms
        self.counters = {"hits": 0, "misses": 0, "errors": 0, "timeouts": 0, "breaker_openings": 0,
                         "lock_waits": 0, "rejected": 0, "too_large": 0, "writes": 0}
        self._open_until = 0.0
        self._lock = threading.Lock()
        self._pending_touches: set[str] = set()
        options: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout,
                                   "retry_on_timeout": False, "retry": redis.retry.Retry(redis.backoff.NoBackoff(), 0),
                                   "health_check_interval": 0}
        if password is not None:
            options["password"] = password
        try:
            self.client = redis.Redis.from_url(url, **options)
        except (ValueError, redis.RedisError) as exc:
            raise TierUnavailable(f"KERNEL_CACHE_REMOTE={self.endpoint}: {exc}") from None
        self._release = self.client.register_script(_RELEASE)
        self._refresh = self.client.register_script(_REFRESH)

    # The data path ------------------------------------------------------------------------
    @property
    def writable(self) -> bool:
        return time.monotonic() >= self._open_until

    def get(self, key: str) -> Entry | None:
        name = self._entry(key)
        data = self._call("read", lambda: self.client.getex(name, ex=self.ttl), None)
        if not isinstance(data, bytes):
            self._count("misses")
            return None
        if len(data) > self.max_entry_bytes:
            self._count("too_large")
            return None
        if self.authenticate is not None:
            problem = self.authenticate(data)
            if problem is not None:
                self._count("rejected")
                raise RejectedEntry(f"remote entry {key[:12]} is {problem}")
        try:
            entry = entry_format.decode(data, expected_key=key)
        except CorruptEntry:
            self._call("delete", lambda: self.client.delete(name), None)
            raise
        self._count("hits")
        return entry

    def put_raw(self, key: str, data: bytes) -> None:
        entry_format.decode(data, expected_key=check_key(key))  # a bad entry must not reach the cluster
        if len(data) > self.max_entry_bytes:
            self._count("too_large")
            return
        if self._call("write", lambda: self.client.set(self._entry(key), data, nx=True, ex=self.ttl), None):
            self._count("writes")

    def __contains__(self, key: object) -> bool:
        try:
            name = self._entry(key)
        except (TypeError, ValueError):
            return False
        return bool(self._call("read", lambda: self.client.exists(name), 0))

    @contextlib.contextmanager
    def lock(self, key: str, timeout: float) -> Iterator[bool]:
        """A lease on `key` across nodes: True when held (refreshed until released), False when the
        entry got published meanwhile or `timeout` passed (the caller then compiles anyway)."""
        name, token = self.prefix + "l:" + check_key(key), secrets.token_hex(16)
        deadline, pause, waited = time.monotonic() + timeout, 0.02, False
        while True:
            if not self.writable:
                yield False  # the server is being skipped: compile here, unlocked across nodes
                return
            if self._call("lock", lambda: self.client.set(name, token, nx=True, px=self.lease_ms), None):
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
        beat = threading.Thread(target=self._heartbeat, args=(name, token, stop), daemon=True,
                                name="kernel-cache-remote-lease")
        beat.start()
        try:
            yield True
        finally:
            stop.set()
            beat.join(timeout=self.timeout * 4 + 1)
            self._call("unlock", lambda: self._release(keys=[name], args=[token]), None)

    def close(self) -> None:
        self.flush_touches()
        with contextlib.suppress(Exception):
            self.client.close()

    # Maintenance --------------------------------------------------------------------------
    def delete(self, key: str) -> bool:
        return bool(self._call("delete", lambda: self.client.delete(self._entry(key)), 0))

    def peek_raw(self, key: str) -> bytes | None:
        data = self._call("read", lambda: self.client.get(self._entry(key)), None)
        return data if isinstance(data, bytes) else None

    def listing(self) -> list[dict[str, Any]]:
        """Per entry: key, size_bytes, created (from its header), last_used (from its TTL: a hit
        restarts it), listed with SCAN and bounded by MAX_SCAN."""
        def scan() -> list[dict[str, Any]]:
            names = []
            for name in self.client.scan_iter(match=self.prefix + "e:*", count=1000):
                names.append(name)
                if len(names) >= MAX_SCAN:
                    break
            out: list[dict[str, Any]] = []
            now = time.time()
            for start in range(0, len(names), 500):
                chunk = names[start:start + 500]
                pipe = self.client.pipeline(transaction=False)
                for name in chunk:
                    pipe.strlen(name)
                    pipe.ttl(name)
                    pipe.getrange(name, 0, entry_format.META_PEEK_BYTES - 1)
                replies = pipe.execute()
                for i, name in enumerate(chunk):
                    size, ttl, head = replies[3 * i:3 * i + 3]
                    key = name.decode(errors="replace")[len(self.prefix) + 2:]
                    if not entry_format.is_key(key) or not size:
                        continue
                    last_used = now - max(0, self.ttl - ttl) if ttl and ttl > 0 else now
                    try:
                        created = float(entry_format.peek_meta_head(head, size).get("created", last_used))
                    except (CorruptEntry, TypeError, ValueError):
                        created = last_used
                    out.append({"key": key, "size_bytes": int(size), "created": created, "last_used": last_used})
            return out
        result: list[dict[str, Any]] = self._call("scan", scan, [])
        return result

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
            pipe.execute()
        self._call("touch", expire, None)

    def remove_debris(self, older_than_seconds: float = 0.0) -> list[tuple[str, int]]:
        return []  # a dead holder's lease expires by itself; nothing else is left behind

    def quarantined(self) -> list[dict[str, Any]]:
        return []  # a damaged entry is deleted where found: the server keeps nothing for inspection

    def describe(self) -> dict[str, Any]:
        """What `cachectl stats` and `doctor` show: the endpoint (password hidden), namespace,
        round trip, server version, eviction policy and this process's counters."""
        info: dict[str, Any] = {"endpoint": self.endpoint, "namespace": self.namespace, "ttl_seconds": self.ttl,
                                "counters": dict(self.counters), "reachable": False}
        try:
            start = time.perf_counter()
            self.client.ping()
            info["round_trip_ms"] = round((time.perf_counter() - start) * 1000, 3)
            server = self.client.info("server")
            memory = self.client.info("memory")
            info.update(reachable=True, server_version=server.get("redis_version"),
                        maxmemory=memory.get("maxmemory"), maxmemory_policy=memory.get("maxmemory_policy"))
        except Exception as exc:
            info["error"] = f"{type(exc).__name__}: {exc}"
        return info

    # Internals ----------------------------------------------------------------------------
    def _entry(self, key: object) -> str:
        return self.prefix + "e:" + check_key(key)

    def _count(self, name: str, by: int = 1) -> None:
        with self._lock:
            self.counters[name] += by

    def _heartbeat(self, name: str, token: str, stop: threading.Event) -> None:
        while not stop.wait(self.lease_ms / 3000):
            self._call("lease", lambda: self._refresh(keys=[name], args=[token, self.lease_ms]), None)

    def _call(self, what: str, op: Callable[[], T], default: T) -> T:
        """Run `op` unless the breaker is open; on any server error: the default, the breaker opened,
        one warning per cause. A call on the data path never raises for the server's sake."""
        if time.monotonic() < self._open_until:
            return default
        try:
            return op()
        except Exception as exc:
            if not isinstance(exc, self._redis.RedisError):
                raise
            timeout = isinstance(exc, self._redis.TimeoutError)
            with self._lock:
                self.counters["timeouts" if timeout else "errors"] += 1
                self.counters["breaker_openings"] += 1
                self._open_until = time.monotonic() + self.breaker_seconds
            cause = "timed out" if timeout else f"{type(exc).__name__}: {exc}"
            warn_once(f"remote:{self.endpoint}:{type(exc).__name__}",
                      f"remote cache {self.endpoint} {cause} ({what}); skipping it for "
                      f"{self.breaker_seconds:.0f} s at a time, compiling and caching locally meanwhile")
            return default


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
                      timeout=config.remote_timeout, authenticate=signer.problem if signer is not None else None,
                      max_entry_bytes=config.max_entry_bytes, password=config.remote_password)
