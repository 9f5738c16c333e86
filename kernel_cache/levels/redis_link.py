"""The remote level's link to Redis: which client (one server or a Redis Cluster), the circuit breaker,
and read-only mode, so the level's protocol (remote.py) never asks how the server is deployed.

- **One URL, any deployment.** The first use asks the named node `INFO cluster`; a cluster node gets
  redis-py's cluster client (slots, MOVED and failover are its business), a standalone server or a
  replica the plain one. Both open their connections through redis_guard (one deadline and byte
  budget per call).
- **Coming back within seconds.** After a server fault the server is skipped for 1 s, then 2, 4 … up
  to `breaker_seconds` while it keeps failing; one success closes the breaker.
- **A replica is for reading.** A READONLY refusal ends this process's writes (entries, TTL
  refreshes, leases) with one warning; reads go on.
- A name of another type (WRONGTYPE) is that key's fault, never the server's.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..display import escaped
from ..errors import LevelUnavailable
from ..warnings_once import warn_once
from . import redis_guard

T = TypeVar("T")
FIRST_BACKOFF = 1.0  # seconds the breaker skips the server after its first fault in a row
# A server that served this process and then fails (a failover, a restart) is waited for by compiles
# that need its lock while the breaker's next probe is at most this far away; beyond, they go on alone.
RECOVERY_SECONDS = 5.0
DISCOVERY_FACTOR = 4  # timeouts a cluster client may take, once per process, to learn the slot map


def redis_installed(endpoint: str) -> None:
    """Raise LevelUnavailable where redis-py is missing, without importing it (the level opens
    before its first use; the import waits for that)."""
    if importlib.util.find_spec("redis") is None:
        raise _not_installed(f"KERNEL_CACHE_REMOTE={endpoint}")


def _not_installed(setting: str) -> LevelUnavailable:
    return LevelUnavailable(f"{setting} is set but the redis package is not installed (pip install redis)")


def redis_module() -> Any:
    """redis-py, imported on first use: it costs ~0.1-0.3 s, which no process without a remote pays."""
    try:
        import redis
        import redis.backoff
        import redis.cluster
        import redis.retry
    except ImportError:
        raise _not_installed("KERNEL_CACHE_REMOTE") from None
    return redis


class RedisLink:
    def __init__(self, url: str, endpoint: str, *, timeout: float, max_reply_bytes: int, breaker_seconds: float,
                 counters: dict[str, int], password: str | None = None):
        self.redis = redis = redis_module()
        self.url, self.endpoint = url, endpoint
        self.timeout, self.max_reply_bytes, self.breaker_seconds = timeout, max_reply_bytes, breaker_seconds
        self.counters = counters
        self.read_only = False
        self.served = False  # some call succeeded in this process: a fault then is worth waiting out briefly
        self.cluster: bool | None = None  # unknown until the first call reaches the server
        self._lock = threading.Lock()
        self._open_until = 0.0
        self._faults_in_a_row = 0
        self._refused = False  # the last fault was a refused connection (a server restarting, or gone)
        self._options: dict[str, Any] = {
            "socket_timeout": timeout, "socket_connect_timeout": timeout, "retry_on_timeout": False,
            "retry": redis.retry.Retry(redis.backoff.NoBackoff(), 0), "connection_class": redis_guard.connection_class(url)}
        if password is not None:
            self._options["password"] = password
        try:  # parses the URL; connects nothing
            self._plain = redis.Redis.from_url(url, health_check_interval=0, **self._options)
        except ValueError:  # redis-py's words may quote a piece of the URL, password included
            raise LevelUnavailable(f"KERNEL_CACHE_REMOTE={endpoint}: redis-py cannot parse this URL (a password "
                                  f"with '/', '?' or '#' must be percent-encoded)") from None
        except redis.RedisError as exc:
            raise LevelUnavailable(f"KERNEL_CACHE_REMOTE={endpoint}: {escaped(str(exc))}") from None
        self._client: Any = None

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._open_until

    @property
    def writable(self) -> bool:
        return self.available and not self.read_only

    def reopens_in(self) -> float:
        """Seconds until the breaker lets the next call probe the server (0: now)."""
        return max(0.0, self._open_until - time.monotonic())

    @property
    def recovering(self) -> bool:
        """Skipped, and probed again soon: within RECOVERY_SECONDS after it served this process (a
        failover, a restart), within FIRST_BACKOFF after a first refused connection otherwise (a
        restart as the fleet starts: one short wait, then compiles go on alone; a server that hangs
        or trickles from the start is never waited for)."""
        horizon = RECOVERY_SECONDS if self.served else FIRST_BACKOFF if self._refused else 0.0
        return not self.read_only and 0.0 < self.reopens_in() <= horizon

    @property
    def client(self) -> Any:
        """The client for the deployment found (the plain one until the first call finds out)."""
        return self._client if self._client is not None else self._plain

    def ensure(self) -> None:
        """Find out, once, whether the URL names a cluster node (INFO; for a cluster, its slot map);
        a server that cannot say now is asked again at the next call the breaker lets by."""
        if self.cluster is None and self.available:
            self.call("connect", lambda: None, None)

    def call(self, what: str, op: Callable[[], T], default: T, *, maintenance: bool = False,
             seconds: float | None = None) -> T:
        """Run `op` within one deadline and byte budget unless the breaker is open. WRONGTYPE: the
        default. READONLY: read-only from now on, the default. Any other failure (not only RedisError:
        redis-py fails otherwise on some replies of a bad server) is a server fault: the breaker
        opens, one warning per cause, and the default on the data path (which never raises for the
        server's sake), or LevelUnavailable for maintenance (cachectl must say what failed)."""
        if not self.available:
            if maintenance:
                raise LevelUnavailable(f"remote cache {self.endpoint}: being skipped after an error; try again in "
                                      f"{self._open_until - time.monotonic():.0f} s")
            return default
        limit = self.timeout if seconds is None else seconds
        try:
            if self.cluster is None:  # once per process: which deployment, within one call's deadline
                with redis_guard.budget(limit, self.max_reply_bytes) as budget:
                    cluster = self._is_cluster()
                if cluster:  # a cluster client learns the slot map and command table: a few calls
                    with redis_guard.budget(self.timeout * DISCOVERY_FACTOR, self.max_reply_bytes) as budget:
                        self._client = self.redis.cluster.RedisCluster.from_url(self.url, **self._options)
                self.cluster = cluster
            with redis_guard.budget(limit, self.max_reply_bytes) as budget:
                result = op()
        except Exception as exc:
            message = str(exc) if isinstance(exc, self.redis.ResponseError) else ""
            if message.startswith("WRONGTYPE"):
                self._count("errors")  # one name holds another type: that key's miss, not the level's
                if maintenance:
                    raise LevelUnavailable(f"remote cache {self.endpoint}: {escaped(message)} ({what})") from None
                return default
            if isinstance(exc, self.redis.exceptions.ReadOnlyError) or message.startswith("READONLY"):
                self._become_read_only(what)
                if maintenance:
                    raise LevelUnavailable(f"remote cache {self.endpoint} is a read-only replica ({what}): name "
                                          f"its primary to change it") from None
                return default
            self.failed(what, exc, budget.overflowed, limit, maintenance)
            return default
        if self._faults_in_a_row or not self.served:
            with self._lock:
                self._faults_in_a_row = 0
                self.served = True
        return result

    def failed(self, what: str, exc: Exception | None, overflowed: bool, seconds: float, maintenance: bool) -> None:
        """A server fault (None: a reply of the wrong shape) during `what`: counted, the breaker
        opened, one warning per cause; LevelUnavailable for maintenance, which must say what failed."""
        cause = self.fault(exc, overflowed, seconds)
        warn_once(f"remote:{self.endpoint}:{cause.split(':')[0].split(' (')[0]}",
                  f"remote cache {self.endpoint} {cause} ({what}); skipping it for {FIRST_BACKOFF:.0f} s, "
                  f"then longer while it keeps failing (at most {self.breaker_seconds:.0f} s at a time), "
                  f"compiling and caching locally meanwhile")
        if maintenance:
            raise LevelUnavailable(f"remote cache {self.endpoint}: {cause} ({what})") from None

    def fault(self, exc: Exception | None, overflowed: bool, seconds: float) -> str:
        """Count a server fault (None: a reply of the wrong shape) and skip the server 1 s, 2 s …
        up to breaker_seconds; the fault's cause, escaped, for messages."""
        timeout = isinstance(exc, self.redis.TimeoutError)
        refused = exc is not None and (isinstance(exc.__context__, ConnectionRefusedError)
                                       or "connection refused" in str(exc).lower())
        with self._lock:
            self._refused = refused
            self.counters["too_large" if overflowed else "timeouts" if timeout else "errors"] += 1
            self.counters["breaker_openings"] += 1
            pause = min(self.breaker_seconds, FIRST_BACKOFF * 2 ** min(self._faults_in_a_row, 16))
            self._faults_in_a_row += 1
            self._open_until = time.monotonic() + pause
        if overflowed:
            return f"sent a reply over {self.max_reply_bytes} bytes"
        if timeout:
            return f"timed out (no whole reply within {seconds:g} s)"
        if exc is None or not isinstance(exc, self.redis.RedisError):
            return "sent a reply that is no answer to what was asked" + (
                f" ({type(exc).__name__} in redis-py: {escaped(str(exc))})" if exc is not None else "")
        return f"{type(exc).__name__}: {escaped(str(exc))}"

    def close(self) -> None:
        for client in (self._client, self._plain):
            if client is not None:
                try:
                    client.close()
                except Exception:  # closing sockets of a dead server: nothing to say
                    pass

    # Internals ----------------------------------------------------------------------------
    def _is_cluster(self) -> bool:
        info = self._plain.info("cluster")
        return isinstance(info, dict) and str(info.get("cluster_enabled", "0")) == "1"

    def _become_read_only(self, what: str) -> None:
        with self._lock:
            self.read_only = True
        warn_once(f"remote-readonly:{self.endpoint}",
                  f"remote cache {self.endpoint} is a read-only replica ({what} refused): this process reads "
                  f"from it and writes nothing there (no entries, TTL refreshes or leases)")

    def _count(self, name: str) -> None:
        with self._lock:
            self.counters[name] += 1
