"""The remote level's link to Redis: which nodes (one server or a Redis Cluster), a breaker per
node, and read-only mode, so the level's protocol (remote.py) never asks how the server is deployed.

- **Several seeds.** KERNEL_CACHE_REMOTE lists one or more URLs; each host name stands for every
  address it resolves to (redis_seeds). The first seed that answers `CLUSTER SLOTS` gives the
  deployment: a slot map (a cluster), or "cluster support disabled" (one server, or a replica). A
  seed that is down costs one connect timeout, once: its breaker skips it after that.
- **A node's failure is that node's.** Every node has its own breaker: after a fault it is skipped
  1 s, then 2, 4 … up to `breaker_seconds` while it keeps failing; one success closes it. In a
  cluster the other nodes' slots go on, and the slot map is read again from a node that answers
  (at most once per REFRESH_SECONDS), so a failover is followed as soon as a replica is promoted;
  MOVED updates the map and the call goes to the node named, once. A compile waiting for a lease on
  a failed node's slot waits for the failover (at most RECOVERY_SECONDS), so a lease or entry lost
  with a master is rebuilt under the same single-flight, not by every process at once.
- **Bounded topology.** A slot map is read within one call's deadline and TOPOLOGY_BYTES, and
  refused past MAX_NODES nodes (redis_slots): a hostile node costs one timeout and a few MiB.
- **A replica is for reading.** A READONLY refusal ends this process's writes with one warning.
- A name of another type (WRONGTYPE) is that key's fault, never the server's.
- Server text reaches warnings and cachectl escaped, with every configured secret shown as ***.

This module is long because finding the deployment, routing by slot and judging each node's faults
are one decision per call, made in one place.
"""

from __future__ import annotations

import importlib.util
import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from kernel_cache.display import escaped, redacted
from kernel_cache.errors import LevelUnavailable
from kernel_cache.levels.remote import redis_guard, redis_seeds, redis_slots
from kernel_cache.telemetry.warnings_once import warn_once

T = TypeVar("T")
FIRST_BACKOFF = 1.0  # seconds the breaker skips a node after its first fault in a row
# A node that served this process and then fails (a failover, a restart), or a cluster node that
# fails at all, is waited for by compiles that need its lock for at most this long; beyond, they go on alone.
RECOVERY_SECONDS = 5.0
REFRESH_SECONDS = 0.25  # the least time between two readings of a cluster's slot map
REFRESH_NODES = 3  # nodes asked for the slot map at one refresh (each within one timeout)
_SKIPPED = object()


def redis_installed(endpoint: str) -> None:
    """Raise LevelUnavailable where redis-py is missing, without importing it (the level opens
    before its first use; the import waits for that)."""
    if importlib.util.find_spec("redis") is None:
        raise _not_installed(f"KERNEL_CACHE_REMOTE={endpoint}")


def _not_installed(setting: str) -> LevelUnavailable:
    return LevelUnavailable(f"{setting} is set but the redis package is not installed (pip install redis)")


def redis_module() -> Any:
    """redis-py, imported on first use: a slow import, which no process without a remote pays."""
    try:
        import redis
        import redis.backoff
        import redis.connection
        import redis.crc
        import redis.retry
    except ImportError:
        raise _not_installed("KERNEL_CACHE_REMOTE") from None
    return redis


class NodeHealth:
    """One node's circuit breaker."""

    __slots__ = ("open_until", "faults_in_a_row", "refused", "served", "down_since", "last_cause")

    def __init__(self) -> None:
        self.open_until = 0.0
        self.faults_in_a_row = 0
        self.refused = False  # the last fault was a refused connection (restarting, or gone)
        self.served = False  # some call succeeded: a fault then is worth waiting out briefly
        self.down_since: float | None = None  # the first fault of the current run of faults
        self.last_cause = ""  # what the last fault was, for a message about a skipped node

    @property
    def available(self) -> bool:
        return time.monotonic() >= self.open_until

    def reopens_in(self) -> float:
        return max(0.0, self.open_until - time.monotonic())


class RedisLink:
    def __init__(self, urls: list[str], endpoint: str, *, timeout: float, max_reply_bytes: int,
                 breaker_seconds: float, counters: dict[str, int], password: str | None = None,
                 secrets: Iterable[str] = ()):
        self.redis = redis = redis_module()
        self.endpoint = endpoint
        self.timeout, self.max_reply_bytes, self.breaker_seconds = timeout, max_reply_bytes, breaker_seconds
        self.counters = counters
        self.secrets = sorted(set(secrets), key=len, reverse=True)
        self.read_only = False
        self.cluster: bool | None = None  # unknown until a seed answers
        self._lock = threading.Lock()
        self._discovering = threading.Lock()
        self._refreshing = threading.Lock()
        self._options: dict[str, Any] = {
            "socket_timeout": timeout, "socket_connect_timeout": timeout, "retry_on_timeout": False,
            "retry": redis.retry.Retry(redis.backoff.NoBackoff(), 0), "health_check_interval": 0}
        if password is not None:
            self._options["password"] = password
        self.seeds: list[str] = []
        self._templates: dict[str, dict[str, Any]] = {}  # node -> redis-py's connection arguments
        for seed in redis_seeds.seeds(urls):
            try:  # checked with the configuration; this redis-py may still refuse an option's name or value
                arguments = redis.connection.parse_url(seed)
                arguments["connection_class"] = guarded = redis_guard.connection_class(seed)
                guarded(**{k: v for k, v in {**arguments, **self._options}.items() if k != "connection_class"})
            except (TypeError, ValueError) as exc:  # a connection object, made to check: no socket yet
                warn_once(f"remote-url:{self.endpoint}:{seed}", f"remote cache {redacted(seed)}: this redis-py "
                          f"cannot use the URL ({self.scrub(str(exc))}); it is left out")
                continue
            self.seeds.append(seed)
            self._templates[seed] = arguments
        self._template: dict[str, Any] = next(iter(self._templates.values()), {})
        self._server: str | None = None  # one server: the seed that answered
        self._map: redis_slots.SlotMap | None = None
        self._clients: dict[str, Any] = {}
        self._health: dict[str, NodeHealth] = {}
        self._settling_since: float | None = None  # a cluster said CLUSTERDOWN or TRYAGAIN: a failover
        self._settling_last = 0.0
        self._next_refresh = 0.0

    # What the level asks -------------------------------------------------------------------
    @property
    def available(self) -> bool:
        """Some node may be asked now (a cluster: some primary; unknown yet: some seed)."""
        return any(self.health(node).available for node in self._reachable_nodes())

    @property
    def writable(self) -> bool:
        return self.available and not self.read_only

    def writable_for(self, name: str) -> bool:
        """Writes to `name`'s node may be tried now."""
        if self.read_only:
            return False
        node = self._owner(name)
        return self.available if node is None else self.health(node).available

    def recovering(self, name: str | None = None) -> bool:
        """`name`'s node (None: any node) is skipped and worth waiting for: a cluster node that failed
        less than RECOVERY_SECONDS ago, or a cluster settling a failover; one server within
        RECOVERY_SECONDS after it served this process, or within FIRST_BACKOFF after a first refused
        connection (a restart as the fleet starts: one short wait, then compiles go on alone; a
        server that hangs or trickles from the start is never waited for)."""
        if self.read_only:
            return False
        if self.cluster:
            if self._settling():
                return True
            nodes = [self._owner(name)] if name is not None else self._map.primaries if self._map else []
            return any(node is not None and self._failing_over(node) for node in nodes)
        nodes = [self._server] if self._server is not None else self.seeds
        for node in nodes:
            health = self.health(node)
            horizon = RECOVERY_SECONDS if health.served else FIRST_BACKOFF if health.refused else 0.0
            if 0.0 < health.reopens_in() <= horizon:
                return True
        return False

    def recovery_pause(self, name: str, left: float) -> float | None:
        """Seconds a compile waiting for `name`'s lease sleeps before it asks again, while that node
        is recovering and `left` seconds of its wait remain; None: ask now (or give up)."""
        if not self.recovering(name) or left <= 0:
            return None
        if self.cluster:
            self.refresh()  # a promoted replica shows up here
            if not self.recovering(name):
                return None
            return min(left, REFRESH_SECONDS * (0.5 + random.random()))
        node = self._server if self._server is not None else self.seeds[0]
        wait = self.health(node).reopens_in()
        return wait + random.random() * 0.05 if wait < left else None

    def primaries(self) -> list[str]:
        """The nodes that hold every entry: a cluster's masters, or the one server."""
        self.ensure()
        if self.cluster and self._map is not None:
            return self._map.primaries
        return [self._server] if self._server is not None else []

    def group(self, names: Iterable[str]) -> dict[str | None, list[str]]:
        """`names` by the node that serves them (None: not known now)."""
        out: dict[str | None, list[str]] = {}
        for name in names:
            out.setdefault(self._owner(name), []).append(name)
        return out

    def ensure(self) -> None:
        """Find out, once, which deployment the seeds name (a server that cannot say now is asked
        again at the next call its breaker lets by)."""
        if self.cluster is None:
            self._discover()

    def script(self, text: str) -> Any:
        """A Lua script registered once, run on whichever node a call goes to."""
        return self.client_for(self.seeds[0] if self.seeds else "localhost:6379").register_script(text)

    def health(self, node: str) -> NodeHealth:
        found = self._health.get(node)
        if found is None:
            with self._lock:
                found = self._health.setdefault(node, NodeHealth())
        return found

    def scrub(self, text: str) -> str:
        """Server text for a terminal: escaped, every configured secret shown as ***."""
        return escaped(redis_seeds.scrubbed(text, self.secrets))

    # Calls --------------------------------------------------------------------------------
    def call(self, what: str, op: Callable[[Any], T], default: T, *, name: str | None = None,
             node: str | None = None, maintenance: bool = False, seconds: float | None = None) -> T:
        """`op(client)` on the node serving `name` (or `node`, or the one server), within one
        deadline and byte budget, unless that node's breaker is open. MOVED: the node it names,
        once. WRONGTYPE: the default. READONLY: read-only from now on, the default. CLUSTERDOWN,
        TRYAGAIN, ASK: a failover or resharding under way, that key's miss. Any other failure (not
        only RedisError: redis-py fails otherwise on some replies of a bad server) is the node's
        fault: its breaker opens, one warning per cause, and the default on the data path (which
        never raises for the server's sake), or LevelUnavailable for maintenance (cachectl must say
        what failed)."""
        limit = self.timeout if seconds is None else seconds
        if self.cluster is None:
            self._discover()
        target = node if node is not None else self._owner(name) if name is not None else self._server
        if target is None and self.cluster and self._map is not None and name is None:
            target = next(iter(self._map.primaries), None)
        for attempt in range(2):
            if target is None or not self.health(target).available:
                if maintenance:
                    raise LevelUnavailable(self._skipped_text(target))
                return default
            outcome = self._attempt(what, op, target, limit, maintenance)
            if isinstance(outcome, _Moved) and attempt == 0 and node is None:
                target = outcome.node
                continue
            found: T = default if outcome is _SKIPPED or isinstance(outcome, _Moved) else outcome
            return found
        return default

    def failed(self, what: str, exc: Exception | None, overflowed: bool, seconds: float, maintenance: bool,
               name: str | None = None) -> None:
        """A fault of the node serving `name` (None: the one server, or the first seed) seen by the
        caller (a reply of the wrong shape: exc None; a fault of the small reader)."""
        node = self._owner(name) if name is not None and self.cluster else self._server or next(iter(self.seeds), None)
        if node is not None:
            self._node_failed(node, what, exc, overflowed, seconds, maintenance)

    def refresh(self) -> None:
        """Read the slot map again from a node that answers (at most once per REFRESH_SECONDS, one
        thread at a time; the others go on with the map they have)."""
        now = time.monotonic()
        if not self.cluster or now < self._next_refresh or not self._refreshing.acquire(blocking=False):
            return
        try:
            self._next_refresh = now + REFRESH_SECONDS
            known = self._map.nodes if self._map is not None else []
            asked = 0
            for candidate in [n for n in known + self.seeds if self.health(n).available]:
                if asked >= REFRESH_NODES:
                    break
                asked += 1
                found = self._read_slots(candidate, quiet=True)
                if found is not None:
                    self._map = found
                    return
        finally:
            self._refreshing.release()

    def client_for(self, node: str) -> Any:
        """redis-py's client for a node (made at its first use; a cluster's nodes share the
        credentials and TLS of the seed that answered)."""
        client = self._clients.get(node)
        if client is None:
            with self._lock:
                client = self._clients.get(node)
                if client is None:
                    arguments = self._templates.get(node)
                    if arguments is None:
                        host, _, port = node.rpartition(":")
                        arguments = {**self._template, "host": host.strip("[]"), "port": int(port), "db": 0}
                    pool = self.redis.ConnectionPool(**{**arguments, **self._options})
                    client = self._clients[node] = self.redis.Redis(connection_pool=pool)
        return client

    @property
    def client(self) -> Any:
        """The one server's client (the first seed's until a seed answered): for tests and tools
        that talk to a single server; a cluster's calls go through `call`."""
        self.ensure()
        return self.client_for(self._server or (self.seeds[0] if self.seeds else "localhost:6379"))

    def close(self) -> None:
        for client in list(self._clients.values()):
            try:
                client.close()
            except Exception:  # closing sockets of a dead server: nothing to say
                pass

    # Internals ----------------------------------------------------------------------------
    def _attempt(self, what: str, op: Callable[[Any], T], node: str, limit: float, maintenance: bool) -> Any:
        """One try of `op` on `node`: its result, _SKIPPED (judged and said), or _Moved."""
        redis = self.redis
        budget = None
        try:
            with redis_guard.budget(limit, self.max_reply_bytes) as budget:
                result = op(self.client_for(node))
        except Exception as exc:
            message = str(exc) if isinstance(exc, redis.ResponseError) else ""
            if isinstance(exc, redis.exceptions.MovedError):
                self._moved(exc.slot_id, f"{exc.host}:{exc.port}" if ":" not in str(exc.host) else f"[{exc.host}]:{exc.port}")
                return _Moved(self._owner_of_slot(exc.slot_id))
            if isinstance(exc, (redis.exceptions.ClusterDownError, redis.exceptions.TryAgainError,
                                redis.exceptions.AskError)) or message.startswith(("CLUSTERDOWN", "TRYAGAIN", "ASK")):
                self._settle(what, message, maintenance)
                return _SKIPPED
            if message.startswith("WRONGTYPE"):
                self._count("errors")  # one name holds another type: that key's miss, not the level's
                if maintenance:
                    raise LevelUnavailable(f"remote cache {self.endpoint}: {self.scrub(message)} ({what})") from None
                return _SKIPPED
            if isinstance(exc, redis.exceptions.ReadOnlyError) or message.startswith("READONLY"):
                self._become_read_only(what)
                if maintenance:
                    raise LevelUnavailable(f"remote cache {self.endpoint} is a read-only replica ({what}): name "
                                          f"its primary to change it") from None
                return _SKIPPED
            self._node_failed(node, what, exc, budget is not None and budget.overflowed, limit, maintenance)
            return _SKIPPED
        self._served_by(node)
        return result

    def _served_by(self, node: str) -> None:
        """`node` answered: its breaker closes and its next fault backs off from 1 s again."""
        health = self.health(node)
        if health.faults_in_a_row or not health.served:
            with self._lock:
                health.faults_in_a_row, health.served, health.down_since = 0, True, None

    def _node_failed(self, node: str, what: str, exc: Exception | None, overflowed: bool, seconds: float,
                     maintenance: bool, max_bytes: int | None = None) -> None:
        cause = self._fault(node, exc, overflowed, seconds, max_bytes)
        self.health(node).last_cause = cause
        where = f"remote cache {self.endpoint}" + (f" node {redacted(node)}" if self.cluster or len(self.seeds) > 1 else "")
        scope = "that node's slots" if self.cluster else "it"
        warn_once(f"remote:{self.endpoint}:{cause.split(':')[0].split(' (')[0]}",
                  f"{where} {cause} ({what}); skipping {scope} for {FIRST_BACKOFF:.0f} s, then longer while it "
                  f"keeps failing (at most {self.breaker_seconds:.0f} s at a time), compiling and caching locally "
                  f"meanwhile")
        if self.cluster:
            self.refresh()
        if maintenance:
            raise LevelUnavailable(f"{where}: {cause} ({what})") from None

    def _fault(self, node: str, exc: Exception | None, overflowed: bool, seconds: float,
               max_bytes: int | None = None) -> str:
        """Count a node's fault (None: a reply of the wrong shape) and skip it 1 s, 2 s … up to
        breaker_seconds; the fault's cause, for messages."""
        timeout = isinstance(exc, self.redis.TimeoutError)
        refused = exc is not None and (isinstance(exc.__context__, ConnectionRefusedError)
                                       or "connection refused" in str(exc).lower())
        health = self.health(node)
        with self._lock:
            now = time.monotonic()
            health.refused = refused
            self.counters["too_large" if overflowed else "timeouts" if timeout else "errors"] += 1
            self.counters["breaker_openings"] += 1
            pause = min(self.breaker_seconds, FIRST_BACKOFF * 2 ** min(health.faults_in_a_row, 16))
            health.faults_in_a_row += 1
            health.open_until = now + pause
            if health.down_since is None:
                health.down_since = now
        if overflowed:
            return f"sent a reply over {max_bytes or self.max_reply_bytes} bytes"
        if timeout:
            return f"timed out (no whole reply within {seconds:g} s)"
        if exc is None or not isinstance(exc, self.redis.RedisError):
            return "sent a reply that is no answer to what was asked" + (
                f" ({type(exc).__name__}: {self.scrub(str(exc))})" if exc is not None else "")
        return f"{type(exc).__name__}: {self.scrub(str(exc))}"

    def _failing_over(self, node: str) -> bool:
        health = self.health(node)
        return (not health.available and health.down_since is not None
                and time.monotonic() - health.down_since < RECOVERY_SECONDS)

    def _discover(self) -> None:
        """Ask the seeds in order, each whose breaker lets it, until one says what it is."""
        with self._discovering:
            if self.cluster is not None:
                return
            for seed in self.seeds:
                if not self.health(seed).available:
                    continue
                found = self._read_slots(seed, quiet=False)
                if found is _STANDALONE:
                    self._server, self.cluster = seed, False
                    return
                if isinstance(found, redis_slots.SlotMap):
                    self._map, self.cluster = found, True
                    self._next_refresh = time.monotonic() + REFRESH_SECONDS
                    return

    def _read_slots(self, node: str, *, quiet: bool) -> Any:
        """`node`'s slot map (within one timeout and TOPOLOGY_BYTES), _STANDALONE for a server
        without cluster support, or None (the node's fault: judged, said unless `quiet`)."""
        budget = None
        try:
            with redis_guard.budget(self.timeout, redis_slots.TOPOLOGY_BYTES) as budget:
                reply = self.client_for(node).execute_command("CLUSTER SLOTS")
            found: Any = redis_slots.parse(reply, node.rpartition(":")[0].strip("[]"))
        except self.redis.ResponseError as exc:
            if "cluster support disabled" in str(exc).lower() or "unknown command" in str(exc).lower():
                found = _STANDALONE
            else:
                self._report(node, "topology", exc, False, quiet)
                return None
        except redis_slots.BadSlotMap as exc:
            self._report(node, "topology", ValueError(str(exc)), False, quiet)
            return None
        except Exception as exc:
            self._report(node, "connect", exc, budget is not None and budget.overflowed, quiet)
            return None
        self._served_by(node)
        return found

    def _report(self, node: str, what: str, exc: Exception, overflowed: bool, quiet: bool) -> None:
        """A seed's or node's fault while reading the slot map: counted, said unless `quiet`."""
        if quiet:
            self._fault(node, exc, overflowed, self.timeout, redis_slots.TOPOLOGY_BYTES)
        else:
            self._node_failed(node, what, exc, overflowed, self.timeout, False, redis_slots.TOPOLOGY_BYTES)

    def _owner(self, name: str | None) -> str | None:
        """The node serving `name`: its slot's in a cluster, else the one server (None: not known)."""
        if name is None or not self.cluster:
            return self._server
        return self._owner_of_slot(self.redis.crc.key_slot(name.encode()))

    def _owner_of_slot(self, slot: int) -> str | None:
        slot_map = self._map
        return slot_map.owners[slot] if slot_map is not None and 0 <= slot < redis_slots.SLOTS else None

    def _moved(self, slot: int, node: str) -> None:
        if self._map is not None:
            self._map = self._map.moved(slot, node)
        self._next_refresh = 0.0  # a resharding or failover: the next fault or MOVED reads the whole map

    def _settling(self) -> bool:
        """The cluster said CLUSTERDOWN or TRYAGAIN within the last two refresh intervals, and first
        less than RECOVERY_SECONDS ago: worth waiting for."""
        since, now = self._settling_since, time.monotonic()
        return since is not None and now - self._settling_last < 2 * REFRESH_SECONDS and now - since < RECOVERY_SECONDS

    def _settle(self, what: str, message: str, maintenance: bool) -> None:
        """CLUSTERDOWN, TRYAGAIN, ASK: the cluster is moving slots or promoting a replica."""
        now = time.monotonic()
        with self._lock:
            if self._settling_since is None or now - self._settling_last >= 2 * REFRESH_SECONDS:
                self._settling_since = now
            self._settling_last = now
        self._count("errors")
        self.refresh()
        if maintenance:
            raise LevelUnavailable(f"remote cache {self.endpoint}: {self.scrub(message)} ({what}); try again "
                                  f"in a few seconds") from None

    def _reachable_nodes(self) -> list[str]:
        if self.cluster is None:
            return self.seeds
        if self.cluster:
            return self._map.primaries if self._map is not None else []
        return [self._server] if self._server is not None else []

    def _skipped_text(self, node: str | None) -> str:
        if node is None:
            causes = list(dict.fromkeys(c for c in (self.health(s).last_cause for s in self.seeds) if c))
            return (f"remote cache {self.endpoint}: no node answered" + (f" ({'; '.join(causes)})" if causes else "")
                    + "; try again in a few seconds")
        health = self.health(node)
        return (f"remote cache {self.endpoint}: being skipped after an error"
                + (f" ({health.last_cause})" if health.last_cause else "")
                + f"; try again in {max(1.0, health.reopens_in()):.0f} s")

    def _become_read_only(self, what: str) -> None:
        with self._lock:
            self.read_only = True
        warn_once(f"remote-readonly:{self.endpoint}",
                  f"remote cache {self.endpoint} is a read-only replica ({what} refused): this process reads "
                  f"from it and writes nothing there (no entries, TTL refreshes or leases)")

    def _count(self, name: str) -> None:
        with self._lock:
            self.counters[name] += 1


class _Moved:
    """A MOVED reply: the call goes to `node` (None: no node known for the slot)."""

    __slots__ = ("node",)

    def __init__(self, node: str | None):
        self.node = node


_STANDALONE = object()  # a seed without cluster support: one server
