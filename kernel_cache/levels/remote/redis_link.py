"""The remote level's link to Redis: which nodes (one server or a Redis Cluster), a breaker per
node, and read-only mode, so the level's protocol (level.py) never asks how the server is deployed.

- **Seeds.** Each URL of KERNEL_CACHE_REMOTE, once per address its host resolves to (redis_seeds);
  the first that answers `CLUSTER SLOTS` says whether it is a cluster. A dead seed costs one timeout.
- **A node's failure is that node's.** After a fault a node is skipped until a background probe
  finds it answering (1 s, then doubling up to `breaker_seconds`): a call to a skipped node returns
  at once, so a hung node costs a process one timeout in all. In a cluster the slot map is read
  again (at most once per REFRESH_SECONDS) to follow a failover, and meanwhile `placement` names a
  stand-in node every process derives alike, so leases stay single-flight.
- **Redirects are followed once.** A second MOVED is a loop, the first node's fault; ASK and
  TRYAGAIN are that call's miss; CLUSTERDOWN is the node's fault.
- **Writes refused, reads kept.** OOM, MISCONF, NOPERM or a write that times out (a pause for
  writes) skips that node's writes for WRITES_REFUSED_SECONDS, then longer, with one warning that
  names the fix. A READONLY refusal (a replica) ends this process's writes.
- **Bounded.** A slot map is read within one deadline and TOPOLOGY_BYTES (redis_slots); WRONGTYPE
  is that key's fault; server text is shown escaped, every configured secret as ***.

This module is long because finding the deployment, routing by slot and judging each node's faults
are one decision per call, made in one place.
"""

from __future__ import annotations

import contextlib
import importlib.util
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple, TypeVar

from kernel_cache.errors import LevelUnavailable
from kernel_cache.levels.remote import redis_guard, redis_seeds, redis_slots
from kernel_cache.sanitize import escaped
from kernel_cache.settings.remote_url import redacted, secrets_of
from kernel_cache.telemetry.warnings_once import warn_once

T = TypeVar("T")
FIRST_BACKOFF = 1.0  # seconds the breaker skips a node after its first fault in a row
WRITES_REFUSED_SECONDS = 30.0  # a node that refused a write is sent none for this long (doubling to 8x)
REFRESH_SECONDS = 0.25  # the least time between two readings of a cluster's slot map
REFRESH_NODES = 3  # nodes asked for the slot map at one refresh (each within one timeout)
MAINTENANCE_SECONDS = 5.0  # the least deadline of one maintenance call (a SCAN page, 500 names' heads)
_WRITES = frozenset({"write", "heal", "lock", "lease", "unlock", "touch", "delete"})  # calls that write
_SKIPPED = object()  # a call refused for that key or for writes: judged, said, no fault of the node
_FAILED = object()  # a call that failed for the node's sake: its breaker opened


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


@dataclass(slots=True)
class NodeHealth:
    """One node's circuit breaker: open from its first fault until the prober finds it answering."""

    open_until: float = 0.0
    faults_in_a_row: int = 0
    last_cause: str = ""  # what the last fault was, for a message about a skipped node
    writes_open_until: float = 0.0  # writes refused (full, paused, no permission): none sent until then
    writes_refused: int = 0  # refusals in a row: each doubles the pause, up to 8x
    unexplained: str | None = None  # a write timed out (the call's name): its probe says why

    @property
    def writes_available(self) -> bool:
        return time.monotonic() >= self.writes_open_until

    @property
    def available(self) -> bool:
        """The data path may ask it: no fault since it last answered."""
        return self.faults_in_a_row == 0


class RedisLink:
    def __init__(self, urls: list[str], endpoint: str, *, timeout: float, max_reply_bytes: int,
                 breaker_seconds: float, counters: dict[str, int], password: str | None = None):
        self.redis = redis = redis_module()
        self.endpoint = endpoint
        self.timeout, self.max_reply_bytes, self.breaker_seconds = timeout, max_reply_bytes, breaker_seconds
        self.counters = counters
        self.secrets = secrets_of(urls, password)
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
            self._templates[seed] = arguments
        self.seeds = list(self._templates)
        self._template: dict[str, Any] = next(iter(self._templates.values()), {})
        self._server: str | None = None  # one server: the seed that answered
        self._map: redis_slots.SlotMap | None = None
        self._clients: dict[str, Any] = {}
        self._health: dict[str, NodeHealth] = {}
        self._next_refresh = 0.0
        self._cluster_down = False  # a node said CLUSTERDOWN and none has answered since: one fault for all
        self._prober: threading.Thread | None = None  # probes skipped nodes (redis_link's only thread)
        self._wake = threading.Event()  # a new fault, or close
        self._closed = threading.Event()

    # What the level asks -------------------------------------------------------------------
    @property
    def available(self) -> bool:
        """Some node may be asked now (a cluster: some primary; unknown yet: some seed)."""
        return any(self.health(node).available for node in self._reachable_nodes())

    @property
    def writable(self) -> bool:
        """Writes may be tried now on some node (not a replica; some node answering and taking writes)."""
        return not self.read_only and any(self.health(node).available and self.health(node).writes_available
                                          for node in self._reachable_nodes())

    def placement(self, name: str) -> str | None:
        """Where `name` goes now: "" its own node (one server, or its slot's node answering); a hash
        tag whose slot a stand-in node serves while its own node is skipped (the next available
        primary after its slot, so every process that sees the same node down picks the same
        stand-in); None where no node may be asked."""
        self.ensure()
        if self.cluster is None:
            return None  # no seed could say what it is: nothing to ask until its breaker lets it
        if not self.cluster:
            return "" if self.available else None
        for _ in range(2):
            owner = self._owner(name)
            if owner is not None and self.health(owner).available:
                return ""
            self.refresh()  # a promoted replica shows up here (at most once per REFRESH_SECONDS)
        return self.stand_in(name)

    def stand_in(self, name: str) -> str | None:
        """The hash tag of `name`'s stand-in: the first available primary serving a slot after
        `name`'s, other than its own node (None: none, or not a cluster). The same after a
        promotion: the promoted replica serves its old master's slots."""
        slot_map = self._map
        if not self.cluster or slot_map is None:
            return None
        slot = self.redis.crc.key_slot(name.encode())
        owner = slot_map.owners[slot]
        stand_in = slot_map.next_primary(slot, lambda node: node != owner and self.health(node).available)
        return None if stand_in is None else slot_map.stand_in_tag(stand_in, self.redis.crc.key_slot)

    def primaries(self) -> list[str]:
        """The nodes that hold every entry: a cluster's masters, or the one server."""
        self.ensure()
        return self._reachable_nodes() if self.cluster is not None else []

    def group(self, names: Iterable[str]) -> dict[str, list[str]]:
        """`names` by the node that serves them (those of a slot no node serves now are left out)."""
        out: dict[str, list[str]] = {}
        for name in names:
            if (node := self._owner(name)) is not None:
                out.setdefault(node, []).append(name)
        return out

    def ensure(self) -> None:
        """Find out, once, which deployment the seeds name: the seeds in order, each whose breaker
        lets it, until one says (one that cannot say now is asked again at the next call it may)."""
        if self.cluster is not None:
            return
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
             node: str | None = None, maintenance: bool = False) -> T:
        """`op(client)` on the node serving `name` (or `node`, or the one server), within one
        deadline and byte budget; the default at once where that node (or, for a call in _WRITES,
        its writes) is skipped. Refusals are judged as the module says; any other failure (not only
        RedisError: redis-py fails otherwise on some bad replies) opens the node's breaker and gives
        the default, or LevelUnavailable for `maintenance` (cachectl must say what failed)."""
        limit, write = max(self.timeout, MAINTENANCE_SECONDS) if maintenance else self.timeout, what in _WRITES
        self.ensure()
        target = node if node is not None else self._owner(name)
        outcome = self._attempt(what, op, target, limit, maintenance, write)
        if isinstance(outcome, _Moved) and node is None:  # followed once: a second MOVED is a loop
            first, target = target, outcome.node
            outcome = self._attempt(what, op, target, limit, maintenance, write, quiet=True)
            if first is not None and (isinstance(outcome, _Moved) or outcome is _FAILED):
                self._redirect_loop(first, target, what, outcome is _FAILED, maintenance)
        found: T = default if outcome in (_SKIPPED, _FAILED) or isinstance(outcome, _Moved) else outcome
        return found

    def failed(self, what: str, exc: Exception | None, overflowed: bool, seconds: float, maintenance: bool,
               name: str | None = None, write: bool = False) -> None:
        """A fault of the node serving `name` (None: the one server, or the first seed) seen by the
        caller: a reply of the wrong shape (exc None), or a fault of the small reader (a `write`
        that timed out is judged as one through the link: the server may be paused for writes)."""
        node = self._owner(name) if name is not None and self.cluster else self._server or next(iter(self.seeds), None)
        if node is not None and write and isinstance(exc, self.redis.TimeoutError):
            self._write_timed_out(node, what, seconds)
        elif node is not None:
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
            for candidate in [n for n in known + self.seeds if self.health(n).available][:REFRESH_NODES]:
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

    def close(self) -> None:
        self._closed.set()
        self._wake.set()
        for client in list(self._clients.values()):
            with contextlib.suppress(Exception):  # closing sockets of a dead server: nothing to say
                client.close()

    # Internals ----------------------------------------------------------------------------
    def _attempt(self, what: str, op: Callable[[Any], T], node: str | None, limit: float, maintenance: bool,
                 write: bool, quiet: bool = False) -> Any:
        """One try of `op` on `node`: its result, _SKIPPED (the node, or its writes, skipped; a refusal
        judged and said; LevelUnavailable for `maintenance`), _FAILED (the node's fault, judged, and
        said unless `quiet`: a redirect's target, whose failure is said as the redirecting node's) or
        _Moved."""
        if node is None or not self.health(node).available or (write and not self.health(node).writes_available):
            if maintenance:
                raise LevelUnavailable(self._skipped_text(node))
            return _SKIPPED
        redis = self.redis
        budget = None
        try:
            with redis_guard.budget(limit, self.max_reply_bytes) as budget:
                result = op(self.client_for(node))
        except Exception as exc:
            code = self._error_code(exc)
            if isinstance(exc, redis.exceptions.MovedError):
                self._moved(exc.slot_id, f"{exc.host}:{exc.port}" if ":" not in str(exc.host) else f"[{exc.host}]:{exc.port}")
                return _Moved(self._owner_of_slot(exc.slot_id))
            refusal = _WRITE_REFUSALS.get(code) if write else None
            if code in ("ASK", "TRYAGAIN"):
                said = self._migrating(node, what, code)
            elif code == "WRONGTYPE":
                self._count("errors")  # one name holds another type: that key's miss, not the level's
                said = f"remote cache {self.endpoint}: {self.scrub(str(exc))} ({what})"
            elif code == "READONLY":
                said = self._become_read_only(what)
            elif write and isinstance(exc, redis.TimeoutError):
                said = self._write_timed_out(node, what, limit)
            elif refusal is not None:
                said = self._say_writes_refused(node, what, refusal, self._pause_writes(node))
            else:
                self._node_failed(node, what, exc, budget is not None and budget.overflowed, limit, maintenance, quiet=quiet)
                return _FAILED
            if maintenance and not quiet:
                raise LevelUnavailable(said) from None
            return _SKIPPED
        self._served_by(node, write)
        return result

    def _error_code(self, exc: Exception) -> str:
        """The code of a Redis error reply (MOVED, OOM …; "" for anything else): redis-py takes it
        off the message of the errors it has a class for, and keeps it on the others."""
        if not isinstance(exc, self.redis.ResponseError):
            return ""
        for class_name, code in _CODED_ERRORS:
            found = getattr(self.redis.exceptions, class_name, None)
            if found is not None and isinstance(exc, found):
                return code
        return str(exc).split(" ", 1)[0] if str(exc)[:1].isupper() else ""

    def _pause_writes(self, node: str) -> float:
        health = self.health(node)
        with self._lock:
            pause: float = WRITES_REFUSED_SECONDS * 2 ** min(health.writes_refused, 3)
            health.writes_refused += 1
            health.writes_open_until = time.monotonic() + pause
            self.counters["writes_refused"] = self.counters.get("writes_refused", 0) + 1
        return pause

    def _write_timed_out(self, node: str, what: str, seconds: float) -> str:
        """A write with no answer in time: a node paused for writes (its reads answer) or a hung one
        (they do not). Its writes pause, and it is skipped until a probe, sent at once, says which
        (and the warning with it): no other call pays a timeout meanwhile. What cachectl says."""
        self._pause_writes(node)
        health = self.health(node)
        with self._lock:
            self.counters["timeouts"] += 1
            health.faults_in_a_row = max(health.faults_in_a_row, 1)
            health.open_until = time.monotonic()
            health.unexplained = what
            self._start_prober()
        return f"remote cache {self.endpoint} node {redacted(node)}: no answer to a write within {seconds:g} s ({what})"

    def _say_writes_refused(self, node: str, what: str, refusal: tuple[str, str], pause: float) -> str:
        cause, fix = refusal
        where = self._where(node)
        warn_once(f"remote-writes:{self.endpoint}:{cause}",  # one warning per cause: each names its own fix
                  f"{where} refused a write: {self.scrub(cause)} ({what}); reading from it, writing nothing "
                  f"there for {pause:.0f} s at a time (kernels compiled meanwhile are cached locally). Fix: {fix}")
        return f"{where} refused a write: {self.scrub(cause)} ({what}). Fix: {fix}"

    def _migrating(self, node: str, what: str, code: str) -> str:
        """ASK or TRYAGAIN: the slot is being migrated; that call is a miss, said once per node."""
        self._count("errors")
        warn_once(f"remote-migrating:{self.endpoint}:{node}",
                  f"remote cache {self.endpoint} node {redacted(node)} is migrating slots ({code}): a key "
                  f"being moved is a miss there (compiled and cached locally) until the migration ends")
        return (f"remote cache {self.endpoint} node {redacted(node)} is migrating slots ({code}, {what}); try "
                "again when the migration has ended")

    def _redirect_loop(self, first: str, then: str | None, what: str, failed: bool, maintenance: bool) -> None:
        """A call redirected (MOVED) from `first` to `then`, which redirected again or failed: a
        loop or a spray, `first`'s fault (its breaker opens, one warning)."""
        cause = (f"redirected to {redacted(then or '?')}, which " + ("failed" if failed else "redirected again")
                 + " (a MOVED loop: a cluster whose nodes disagree on the slot map)")
        self._node_failed(first, what, _RedirectLoop(cause), False, self.timeout, maintenance)

    def _served_by(self, node: str, write: bool = False) -> None:
        """`node` answered: its breaker closes and its next fault backs off from 1 s again (after a
        write, so do its write refusals)."""
        health = self.health(node)
        if health.faults_in_a_row or (write and health.writes_refused) or self._cluster_down:
            with self._lock:
                health.faults_in_a_row = 0
                self._cluster_down = False
                if write:
                    health.writes_refused = 0

    def _node_failed(self, node: str, what: str, exc: Exception | None, overflowed: bool, seconds: float,
                     maintenance: bool, max_bytes: int | None = None, quiet: bool = False) -> None:
        """Count `node`'s fault (exc None: a reply of the wrong shape), skip it 1 s, 2 s … up to
        breaker_seconds, and say it, unless `quiet` (the caller says it as another node's)."""
        timeout, health = isinstance(exc, self.redis.TimeoutError), self.health(node)  # health() may take the lock
        with self._lock:
            self.counters["too_large" if overflowed else "timeouts" if timeout else "errors"] += 1
            self.counters["breaker_openings"] += 1
            self._back_off(health)
            self._start_prober()
        if not quiet:
            self._say_fault(node, what, self._cause(exc, overflowed, timeout, seconds, max_bytes), exc, maintenance)

    def _say_fault(self, node: str, what: str, cause: str, exc: Exception | None, maintenance: bool) -> None:
        self.health(node).last_cause = cause
        where = self._where(node)
        scope = "that node" if self.cluster else "it"
        meanwhile = ("its keys go to a stand-in node meanwhile (compiled and cached locally where none answers)"
                     if self.cluster else "compiling and caching locally meanwhile")
        down = exc is not None and self._error_code(exc) == "CLUSTERDOWN"
        if down:  # the whole cluster refuses every query: skip every node, said once for them all
            self._cluster_down = True
            until = self.health(node).open_until
            for other in self._map.primaries if self._map is not None else []:
                health = self.health(other)
                with self._lock:
                    health.open_until = max(health.open_until, until)
                    health.faults_in_a_row = max(health.faults_in_a_row, 1)
                    self._start_prober()
            scope, meanwhile = "every node", "compiling and caching locally meanwhile"
        said = "clusterdown" if down or self._cluster_down else cause.split(':')[0].split(' (')[0]
        warn_once(f"remote:{self.endpoint}:{said}",
                  f"{where} {cause} ({what}); skipping {scope} for {FIRST_BACKOFF:.0f} s, then longer while it "
                  f"keeps failing (at most {self.breaker_seconds:.0f} s at a time); {meanwhile}")
        if self.cluster:
            self._next_refresh = 0.0  # a node's new fault: read the map now (a failover may be done)
            self.refresh()
        if maintenance:
            raise LevelUnavailable(f"{where}: {cause} ({what})") from None

    def _cause(self, exc: Exception | None, overflowed: bool, timeout: bool, seconds: float,
               max_bytes: int | None) -> str:
        """A node's fault said for messages."""
        if overflowed:
            return f"sent a reply over {max_bytes or self.max_reply_bytes} bytes"
        if timeout:
            return f"timed out (no whole reply within {seconds:g} s)"
        if isinstance(exc, _RedirectLoop):
            return str(exc)
        if exc is not None and self._error_code(exc) == "CLUSTERDOWN":
            return ("answered CLUSTERDOWN (the cluster lost a shard, or is failing over); `redis-cli cluster "
                    "info` on any node says which")
        if exc is None or not isinstance(exc, self.redis.RedisError):
            return "sent a reply that is no answer to what was asked" + (
                f" ({type(exc).__name__}: {self.scrub(str(exc))})" if exc is not None else "")
        return f"{type(exc).__name__}: {self.scrub(str(exc))}"

    def _back_off(self, health: NodeHealth) -> None:
        """One more fault in a row: the next probe 1 s, 2 s … up to breaker_seconds away (under self._lock)."""
        pause = min(self.breaker_seconds, FIRST_BACKOFF * 2 ** min(health.faults_in_a_row, 16))
        health.faults_in_a_row += 1
        health.open_until = time.monotonic() + pause

    def _start_prober(self) -> None:
        """The prober thread, started where none runs (called holding self._lock)."""
        if self._prober is None and not self._closed.is_set():
            self._prober = threading.Thread(target=self._probe_skipped, daemon=True, name="kernel-cache-remote-probe")
            self._prober.start()
        self._wake.set()

    def _probe_skipped(self) -> None:
        """Probe each skipped node when its pause is over: answering, its breaker closes; failing,
        its pause doubles (up to breaker_seconds). Ends when no node is skipped."""
        while not self._closed.is_set():
            with self._lock:
                skipped = [(node, h) for node, h in self._health.items() if h.faults_in_a_row]
                if not skipped:
                    self._prober = None
                    return
                self._wake.clear()
            wait = min(h.open_until for _, h in skipped) - time.monotonic()
            if wait > 0:
                self._wake.wait(wait)
                continue
            for node, health in skipped:
                if health.open_until <= time.monotonic() and not self._closed.is_set():
                    self._probe(node, health)

    def _probe(self, node: str, health: NodeHealth) -> None:
        try:
            with redis_guard.budget(self.timeout, 1 << 20):
                client = self.client_for(node)
                answered = (client.execute_command("CLUSTER INFO").get("cluster_state") == "ok"  # parsed by redis-py
                            if self.cluster else bool(client.ping()))
        except Exception:  # the node's fault, as a failed call's, but judged here: nobody waits for it
            answered = False
        what, health.unexplained = health.unexplained, None
        if answered:
            self._served_by(node)
            if what is not None:  # it answers reads: paused for writes
                paused = (f"no answer to a write within {self.timeout:g} s while it answers reads (paused for writes: "
                          "CLIENT PAUSE WRITE, or a failover under way)", "none needed if it was paused on purpose; it "
                          "is written again once the pause ends")
                self._say_writes_refused(node, what, paused, health.writes_open_until - time.monotonic())
            return
        with self._lock:
            self._back_off(health)
            self.counters["breaker_openings"] += what is not None
        if what is not None:  # it answers nothing: hung, or stopped
            self._say_fault(node, what, f"timed out (no whole reply within {self.timeout:g} s)", None, False)

    def _read_slots(self, node: str, *, quiet: bool) -> Any:
        """`node`'s slot map (within one timeout and TOPOLOGY_BYTES), _STANDALONE for a server
        without cluster support, or None (the node's fault: judged, said unless `quiet`)."""
        budget = None
        try:
            with redis_guard.budget(self.timeout, redis_slots.TOPOLOGY_BYTES) as budget:
                reply = self.client_for(node).execute_command("CLUSTER SLOTS")
            found: Any = redis_slots.parse(reply, node.rpartition(":")[0].strip("[]"))
        except Exception as exc:
            answered = isinstance(exc, (self.redis.ResponseError, redis_slots.BadSlotMap))
            if answered and ("cluster support disabled" in str(exc).lower() or "unknown command" in str(exc).lower()):
                found = _STANDALONE
            else:
                self._node_failed(node, "topology" if answered else "connect", exc,
                                  budget is not None and budget.overflowed, self.timeout, False,
                                  redis_slots.TOPOLOGY_BYTES, quiet)
                return None
        self._served_by(node)
        return found

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
                + f"; try again in {max(1.0, health.open_until - time.monotonic()):.0f} s")

    def _become_read_only(self, what: str) -> str:
        with self._lock:
            self.read_only = True
        warn_once(f"remote-readonly:{self.endpoint}",
                  f"remote cache {self.endpoint} is a read-only replica ({what} refused): this process reads "
                  f"from it and writes nothing there (no entries, TTL refreshes or leases)")
        return f"remote cache {self.endpoint} is a read-only replica ({what}): name its primary to change it"

    def _where(self, node: str) -> str:
        return f"remote cache {self.endpoint}" + (f" node {redacted(node)}" if self.cluster or len(self.seeds) > 1 else "")

    def _count(self, name: str) -> None:
        with self._lock:
            self.counters[name] += 1


class _RedirectLoop(Exception):
    """A MOVED that led nowhere: said as the first node's fault."""


_CODED_ERRORS = (("MovedError", "MOVED"), ("AskError", "ASK"), ("TryAgainError", "TRYAGAIN"),
                 ("ClusterDownError", "CLUSTERDOWN"), ("ReadOnlyError", "READONLY"), ("OutOfMemoryError", "OOM"),
                 ("NoPermissionError", "NOPERM"), ("NoScriptError", "NOSCRIPT"))


# (cause, fix) by error code where a write was refused for the server's state, not its health: reads go on
_WRITE_REFUSALS = MappingProxyType({
    "OOM": ("it is full (OOM: maxmemory reached under a policy that evicts nothing)",
            "`redis-cli config set maxmemory-policy allkeys-lru` (and in its config file), or a larger maxmemory"),
    "MISCONF": ("it cannot persist (MISCONF: its RDB snapshots fail, so it stops writes)",
                "free the server's disk, or `config set stop-writes-on-bgsave-error no` where persistence is not wanted"),
    "NOPERM": ("its ACL forbids our user a write (NOPERM)",
               "grant the user +set +eval +evalsha +pexpire +expire +del on the kc:* keys (`ACL SETUSER`)"),
})


class _Moved(NamedTuple):
    """A MOVED reply: the call goes to `node` (None: no node known for the slot)."""

    node: str | None


_STANDALONE = object()  # a seed without cluster support: one server
