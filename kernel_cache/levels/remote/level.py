"""Remote level: a Redis server (or Cluster) every node shares (KERNEL_CACHE_REMOTE), for sites
with no shared filesystem.

Layout: `kc:<namespace>:v2:e:{<key>}` holds an entry's signed bytes, `kc:<namespace>:v2:l:{<key>}`
the compiling node's lease (the key is a hash tag: both share a cluster slot). Writes are `SET NX`
with a TTL that verified hits restart in batches, so unused entries expire and a read stays a read
(a replica serves it). Deployment, breakers and read-only mode are redis_link's.

Never slower than no cache: every call has one deadline and a byte budget (redis_guard), a read
asks for a value's type and size before its bytes (one read-only script a server paused for writes
still serves), and no call on the data path raises or sleeps for the server's sake.

Trust: a server has no file owners, so every entry must carry our signature unless
KERNEL_CACHE_REMOTE_UNSIGNED=1. A rejected value is never refreshed by the read that rejects it, and
the next verified build replaces it only if those same bytes are still there (compare-and-set), so a
neighbour's valid write is never clobbered.

Single-flight across nodes: a signed lease with a maximum lifetime (lease), refreshed while its
holder compiles; only a lease seen held by a live holder makes a compile wait. While a cluster node
is skipped, its keys go to a stand-in node (`RedisLink.placement`) under short-lived
`kc:<namespace>:v2:f<kind>:{<tag>}<key>` names, so a fleet stays single-flight through a failover.

This module is long because it is one level's whole protocol, maintenance included.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from kernel_cache.entries import entry as entry_format
from kernel_cache.entries.entry import SIGNATURE_SIZE, CorruptEntry, Entry, check_key
from kernel_cache.errors import LevelUnavailable, LevelUntrusted, RejectedEntry
from kernel_cache.levels.remote.lease import MAX_LEASE_BYTES, Lease, why_not_honoured
from kernel_cache.levels.remote.redis_link import RedisLink, redis_installed
from kernel_cache.levels.remote.resp_reader import RespError, RespFault, RespReader, RespUnusable
from kernel_cache.sanitize import escaped
from kernel_cache.settings.config import Config
from kernel_cache.settings.remote_url import redacted, split_urls
from kernel_cache.telemetry.warnings_once import warn_once
from kernel_cache.trust.safefs import Owners
from kernel_cache.trust.signing import Signer

MAX_LEASE_POLL = 0.25  # a waiter's longest sleep between looks (from 20 ms, doubling): a publish is seen soon
MAX_SCAN = 200_000  # names `listing` lists before it stops (cachectl on a huge namespace)
REPLY_SLACK = 1 << 20  # bytes a call may receive beyond the entry cap (framing, a pipeline's small replies)
TOUCH_BATCH = 64  # verified hits whose TTL refresh is sent together (else at the next write, close or exit)
MAX_BAD_KEYS = 4096  # rejected values remembered for replacement; the oldest are forgotten
STREAM_BYTES = 8 << 20  # a signed value larger than this is checked chunk by chunk before it is read whole
STREAM_CHUNK = 4 << 20  # one call's worth of a value being checked (its own deadline)
ENDS_BYTES = 1 << 16  # a value past STREAM_BYTES is named by its size and both ends (a whole SHA-1 is too slow)
STAND_IN_TTL = 600  # seconds an entry written to a stand-in node lives (it serves through an outage only)
# What a name holds, told without sending its bytes where it could not be an entry: the server-side
# `marker` names a value for compare-and-set (its type; its size past the cap; past STREAM_BYTES its size
# and the SHA-1 of both ends; else its SHA-1).
_MARKER = f"""
local function marker(k, cap)
  local t = redis.call('type', k)['ok']
  if t == 'none' then return 'none' end
  if t ~= 'string' then return 'type:' .. t end
  local n = redis.call('strlen', k)
  if n > cap then return 'size:' .. n end
  if n > {STREAM_BYTES} then
    return 'ends:' .. n .. ':' .. redis.sha1hex(redis.call('getrange', k, 0, {ENDS_BYTES - 1}) ..
                                               redis.call('getrange', k, -{ENDS_BYTES}, -1))
  end
  return 'sha1:' .. redis.sha1hex(redis.call('get', k))
end
"""
# -> nil | {'type', T} | {'size', N} past the cap ARGV[1] | {'large', N} past ARGV[2] (if given) |
# {'value', bytes}; reads nothing past the cap, refreshes no TTL
_PEEK_BODY = """
local t = redis.call('type', KEYS[1])['ok']
if t == 'none' then return nil end
if t ~= 'string' then return {'type', t} end
local n = redis.call('strlen', KEYS[1])
if n > tonumber(ARGV[1]) then return {'size', n} end
if ARGV[2] and n > tonumber(ARGV[2]) then return {'large', n} end
return {'value', redis.call('get', KEYS[1])}
"""
# Redis 7 serves a script flagged no-writes while it refuses writes (older servers refuse the flag and
# get the plain script). Every script is sent by EVAL: an EVALSHA of a script not yet held waits out a
# write pause, and nothing is registered per client
_PEEK = "#!lua flags=no-writes\n" + _PEEK_BODY
_NO_FLAGS = ("Error compiling script", "shebang")  # what a server without script flags answers
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
    kind, value = bytes(found[0]), found[1]
    if kind == b"type":
        return "type:" + bytes(value).decode(errors="replace")
    if kind == b"size":
        return f"size:{int(value)}"
    data = bytes(value)
    if len(data) > STREAM_BYTES:  # as the server names it: size and both ends
        return f"ends:{len(data)}:" + hashlib.sha1(data[:ENDS_BYTES] + data[-ENDS_BYTES:]).hexdigest()
    return "sha1:" + hashlib.sha1(data).hexdigest()  # Redis's own digest, an identity, not a MAC


class RemoteLevel:
    name = "remote"
    directory: Path | None = None
    breaker_seconds = 30.0  # the longest the breaker skips a failing server (1 s after a first fault, doubling)
    lease_ms = 30_000  # a lock's lease; the holder refreshes it every third of that while it compiles

    def __init__(self, url: str, *, namespace: str = "default", ttl: float = 14 * 86400, timeout: float = 0.25,
                 signer: Signer | None = None, max_entry_bytes: int = 1 << 28, password: str | None = None,
                 lease_max_seconds: float = 600.0):
        """`signer`: entries and leases must carry its signature (None: every client of the server
        is trusted, KERNEL_CACHE_REMOTE_UNSIGNED=1). `lease_max_seconds`: the longest a lease is honoured."""
        self.endpoint = redacted(url)
        self.urls = split_urls(url)
        self.namespace = namespace
        self.prefix = f"kc:{namespace}:v2:"  # v2: keys in braces (v1 names expire by their TTL)
        self.ttl = max(1, int(ttl))
        self.timeout = timeout
        self.signer = signer
        self.max_entry_bytes = max_entry_bytes
        self.lease_max_seconds = lease_max_seconds
        self.counters = {"hits": 0, "misses": 0, "errors": 0, "timeouts": 0, "breaker_openings": 0,
                         "lock_waits": 0, "rejected": 0, "too_large": 0, "writes": 0, "healed": 0,
                         "leases_refused": 0}
        self._lock = threading.Lock()
        self._pending_touches: set[str] = set()
        self._bad: OrderedDict[str, str] = OrderedDict()  # key -> marker of the value we rejected there
        redis_installed(self.endpoint)
        self._password = password
        self._connecting = threading.Lock()
        self._link: RedisLink | None = None
        self._reader: RespReader | None = None  # reads and TTL refreshes until the link is made (one server)
        if len(self.urls) == 1:
            with contextlib.suppress(RespUnusable):  # connects at its first call, not here
                self._reader = RespReader(self.urls[0], password=password, timeout=timeout,
                                          max_reply_bytes=max_entry_bytes + REPLY_SLACK)
        self._stand_in_used = -float(STAND_IN_TTL)  # when a stand-in node last served this process (monotonic)
        self._plain_peek = False  # the server knows no script flags (Redis < 7): its peek is the plain script

    @property
    def link(self) -> RedisLink:
        """The link, made at its first use: a warm node served by its own disk never imports redis-py."""
        if self._link is None:
            with self._connecting:
                if self._link is None:
                    link = RedisLink(self.urls, self.endpoint, timeout=self.timeout,
                                     max_reply_bytes=self.max_entry_bytes + REPLY_SLACK,
                                     breaker_seconds=self.breaker_seconds, counters=self.counters,
                                     password=self._password)
                    if self._reader is not None:  # one connection per server from now on
                        self._reader.give_up()
                    self._link = link
        return self._link

    def _light(self) -> RespReader | None:
        """The small reader (`resp_reader`) until it fails or the link is made; None: the link serves."""
        return self._reader if self._reader is not None and self._reader.usable else None

    def _fault_seen_by_reader(self, what: str, fault: RespFault, write: bool = False) -> None:
        link = self.link  # the breaker is the link's (redis-py is imported for a failing server only)
        cause = {"timeout": link.redis.TimeoutError, "connection": link.redis.ConnectionError}.get(fault.kind)
        link.failed(what, cause(str(fault)) if cause is not None else None, fault.kind == "overflow",
                    self.timeout, False, write=write)

    # The data path ------------------------------------------------------------------------
    @property
    def writable(self) -> bool:
        """False on a read-only replica, while the breaker skips every node, or while they refuse writes."""
        return self.link.writable

    @property
    def location(self) -> str:
        return self.endpoint

    @property
    def mode(self) -> str:
        if not self.link.available:
            return "skipped (server failing)"
        return "read-only (replica)" if self.link.read_only else "read-write"

    def get(self, key: str) -> Entry | None:
        stream_over = STREAM_BYTES if self.signer is not None else None
        found, name = self._at_placed("e:", key, lambda at: self._peek("read", at, self.max_entry_bytes, stream_over))
        if isinstance(found, tuple) and found[0] == b"large" and name is not None:
            found = self._checked_large(key, name, int(found[1]))
        if not isinstance(found, tuple) or name is None:
            self._count("misses")
            return None
        kind, value = found
        if kind == b"size":
            self._remember_bad(key, found, "too_large")
            return None
        if kind == b"type":
            self._remember_bad(key, found)
            raise RejectedEntry(f"remote name for {key[:12]} holds a Redis {escaped(bytes(value).decode(errors='replace'))}, "
                                f"not an entry")
        data = bytes(value)
        problem = self.signer.problem(data) if self.signer is not None else None
        if problem is not None:
            self._remember_bad(key, found)
            raise RejectedEntry(f"remote entry {key[:12]} is {problem}")
        try:
            entry = entry_format.decode(data, expected_key=key)
        except CorruptEntry:
            self._script("delete", _REPLACE, name, [self.max_entry_bytes, marker(found), b"", 0], None)
            raise
        with self._lock:  # verified: its life restarts, in a batch sent where writes go (never by the read)
            self._bad.pop(key, None)
            self.counters["hits"] += 1
            self._pending_touches.add(key)
            due = len(self._pending_touches) >= TOUCH_BATCH
        if due:
            self.flush_touches()
        return entry

    def keep(self, entry: Entry, data: bytes) -> None:
        self.put_raw(entry.key, data)

    def put_raw(self, key: str, data: bytes) -> None:
        entry_format.decode(data, expected_key=check_key(key))  # a bad entry must not reach the cluster
        if len(data) > self.max_entry_bytes:
            self._count("too_large")
            return
        self.flush_touches()
        with self._lock:
            bad = self._bad.get(key)
        own = self._entry(key)

        def write(name: str) -> object:
            if bad is None or name != own:
                ttl = self.ttl if name == own else min(self.ttl, STAND_IN_TTL)
                return self.link.call("write", lambda c: c.set(name, data, nx=True, ex=ttl), _FAILED, name=name)
            # a value we rejected sits there: replace it, but only if it is still those bytes
            healed = self._script("heal", _REPLACE, own, [self.max_entry_bytes, bad, data, self.ttl * 1000], _FAILED)
            if healed is not _FAILED:
                with self._lock:
                    self._bad.pop(key, None)
                    self.counters["healed"] += bool(healed)
            return healed
        done, _ = self._at_placed("e:", key, write, look_aside=False)
        if done is not _FAILED and done:
            self._count("writes")

    def __contains__(self, key: object) -> bool:
        """Whether an entry may be there: a string at the name, and not the value we rejected."""
        if not isinstance(key, str) or not entry_format.is_key(key):
            return False
        with self._lock:
            bad = self._bad.get(key)

        def there(name: str) -> object:
            if bad is not None and name == self._entry(key):
                now = self._script("read", _MARKER_OF, name, [self.max_entry_bytes], _FAILED)
                return now if now is _FAILED else (isinstance(now, bytes) and now.decode() != bad
                                                   and now.startswith((b"sha1:", b"ends:")) or None)
            kind = self.link.call("read", lambda c: c.type(name), _FAILED, name=name)
            return kind if kind is _FAILED else (kind == b"string" or None)
        found, _ = self._at_placed("e:", key, there)
        return found is True

    @contextlib.contextmanager
    def lock(self, key: str, timeout: float) -> Iterator[bool | None]:
        """A lease on `key` across nodes: True when held; False when a live holder's wait ended
        without it (published, or `timeout` passed); None when nobody was seen holding it and it
        could not be taken: the caller compiles at once, never waiting for a breaker. A lease not
        ours to honour is taken over with a compare-and-set."""
        deadline, pause, waited = time.monotonic() + timeout, 0.02, False
        leases: dict[str, Lease] = {}

        def take(at: str) -> object:  # True taken, None held by another
            lease = leases[at] = Lease.new(at, self.signer)
            return self.link.call("lock", lambda c: c.set(at, lease.value, nx=True, px=self.lease_ms), _FAILED, name=at)
        while True:
            taken, name = self._at_placed("l:", key, take, look_aside=False)
            if taken is None and name is not None:
                taken = self._holder(name, leases[name])
            if taken is _FAILED or name is None:
                yield None  # the lease could not be taken, nor its holder seen: nobody to wait on
                return
            lease = leases[name]
            if taken:
                break
            if key in self or time.monotonic() >= deadline:
                yield False
                return
            if not waited:
                waited = True
                self._count("lock_waits")
            time.sleep(min(pause * (0.5 + random.random()), max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, MAX_LEASE_POLL)
        stop = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=(name, lease, stop), daemon=True,
                                name="kernel-cache-remote-lease")
        beat.start()
        try:
            yield True
        finally:
            stop.set()
            beat.join(timeout=self.timeout * 4 + 1)
            self._script("unlock", _RELEASE, name, [lease.value], None)

    def close(self) -> None:
        self.flush_touches()
        if self._reader is not None:
            self._reader.close()
        if self._link is not None:
            self._link.close()

    # Maintenance: a server fault raises LevelUnavailable (cachectl says what failed) -----------
    def delete(self, key: str) -> bool:
        name = self._entry(key)
        return bool(self.link.call("delete", lambda c: c.delete(name), 0, maintenance=True, name=name))

    def peek_raw(self, key: str) -> bytes | None:
        """The stored bytes (at most the entry cap), not refreshing the entry's life. CorruptEntry
        for a name that holds no entry (another Redis type, a value past the cap)."""
        name = self._entry(key)
        found = self._peek("read", name, self.max_entry_bytes, maintenance=True)  # cachectl: bounded by the cap
        if found is None or found is _FAILED:
            return None
        kind, value = found
        if kind == b"type":
            raise CorruptEntry(f"the name holds a Redis {escaped(bytes(value).decode(errors='replace'))}, not an entry")
        if kind == b"size":
            raise CorruptEntry(f"{int(value)} bytes, over KERNEL_CACHE_MAX_ENTRY_BYTES ({self.max_entry_bytes})")
        return bytes(value)

    def listing(self) -> list[dict[str, Any]]:
        """Per entry: key, size_bytes, created (its header), last_used (from its TTL), by SCAN up to
        MAX_SCAN; names of another Redis type too (size 0): reading them says what they are."""
        out: list[dict[str, Any]] = []
        now = time.time()
        for node, names in self._scan_names().items():
            for start in range(0, len(names), 500):
                chunk = names[start:start + 500]
                heads = [c for name in chunk for c in (("TYPE", name), ("STRLEN", name), ("TTL", name),
                                                        ("GETRANGE", name, 0, entry_format.META_PEEK_BYTES - 1))]
                replies: list[Any] = self.link.call("scan", partial(_pipeline, commands=heads), [], node=node, maintenance=True)
                for i, name in enumerate(chunk):
                    entry = self._listed(name, replies[4 * i:4 * i + 4], now)
                    if entry is not None:
                        out.append(entry)
        return out

    def _listed(self, name: bytes, replies: list[Any], now: float) -> dict[str, Any] | None:
        if len(replies) != 4:
            return None
        kind, size, ttl, head = replies
        key = bytes(name).decode(errors="replace")[len(self.prefix) + 2:].removeprefix("{").removesuffix("}")
        if not entry_format.is_key(key) or kind == b"none":
            return None
        size = size if isinstance(size, int) else 0
        ttl = ttl if isinstance(ttl, int) else -1
        last_used = now - max(0, self.ttl - ttl) if ttl > 0 else now
        try:
            created = float(entry_format.peek_meta_head(head, size).get("created", last_used))
        except (CorruptEntry, TypeError, ValueError):
            created = last_used
        return {"key": key, "size_bytes": int(size), "created": created, "last_used": last_used}

    def _scan_names(self) -> dict[str, list[bytes]]:
        """The entry names by the node holding them, one SCAN page per call (each within the
        maintenance deadline), on every master of a cluster; at most MAX_SCAN in all."""
        pattern = self.prefix + "e:*"
        nodes = self.link.primaries()
        if not nodes:
            self.link.call("scan", lambda client: None, None, maintenance=True)  # raises: no node answered
        out: dict[str, list[bytes]] = {}
        total = 0
        for node in nodes:
            cursor: Any = 0
            names = out.setdefault(node, [])
            while total < MAX_SCAN:
                def page(client: Any, at: Any = cursor) -> tuple[Any, list[bytes]]:
                    found: tuple[Any, list[bytes]] = client.scan(at, match=pattern, count=1000)
                    return found
                none: tuple[Any, list[bytes]] = (0, [])
                cursor, more = self.link.call("scan", page, none, node=node, maintenance=True)
                more = more[:MAX_SCAN - total]
                names += more
                total += len(more)
                if not cursor:
                    break
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
        reader = self._light()
        if reader is not None:
            try:
                replies = reader.pipeline([("EXPIRE", self._entry(key), self.ttl) for key in sorted(keys)])
            except RespFault as fault:
                self._fault_seen_by_reader("touch", fault, write=True)
                return
            except RespError as refused:  # at connect (auth): the reader gave up, the link sends them
                replies = [refused]
            if not any(isinstance(reply, RespError) for reply in replies):
                return
            reader.give_up()  # a replica (READONLY) or a cluster (MOVED): the link sends them and judges
        if not self.link.writable:
            return  # a replica takes no writes; a skipped server gets these uses no more
        for node, names in self.link.group(self._entry(key) for key in sorted(keys)).items():
            expires = [("EXPIRE", name, self.ttl) for name in names]
            self.link.call("touch", partial(_pipeline, commands=expires), None, node=node)

    def remove_debris(self, older_than_seconds: float = 0.0) -> list[tuple[str, int]]:
        return []  # a dead holder's lease expires by itself; nothing else is left behind

    def quarantined(self) -> list[dict[str, Any]]:
        return []  # a damaged entry is deleted where found: the server keeps nothing for inspection

    def describe(self) -> dict[str, Any]:
        """What `cachectl stats` and `doctor` show (server text escaped: it reaches terminals)."""
        info: dict[str, Any] = {"endpoint": self.endpoint, "namespace": self.namespace, "ttl_seconds": self.ttl,
                                "counters": dict(self.counters), "reachable": False}
        try:
            def ask(client: Any) -> tuple[float, dict[str, Any]]:
                start = time.perf_counter()
                client.ping()
                return round((time.perf_counter() - start) * 1000, 3), client.info()  # its default sections
            nodes = self.link.primaries()
            found = self.link.call("stats", ask, None, node=nodes[0] if nodes else None, maintenance=True)
            assert found is not None
            round_trip_ms, server = found
            info.update(reachable=True, round_trip_ms=round_trip_ms, server_version=self._text(server.get("redis_version")),
                        maxmemory=server.get("maxmemory"), maxmemory_policy=self._text(server.get("maxmemory_policy")),
                        role=self._text(server.get("role")), cluster=bool(self.link.cluster))
            if self.link.cluster:
                info["masters"] = len(nodes)
        except Exception as exc:
            said = str(exc) if isinstance(exc, LevelUnavailable) else self.link.scrub(str(exc))  # ours: said safely
            info["error"] = f"{type(exc).__name__}: {said}"
        return info

    # Internals ----------------------------------------------------------------------------
    def _entry(self, key: object) -> str:
        return self._name("e:", check_key(key))

    def _name(self, kind: str, key: str) -> str:
        """The key is a hash tag, so in a cluster an entry and its lease share a slot (and a node);
        the same names on one server, so nothing depends on finding out which it is first."""
        return f"{self.prefix}{kind}{{{key}}}"

    def _count(self, name: str) -> None:
        with self._lock:
            self.counters[name] += 1

    def _remember_bad(self, key: str, found: Any, counter: str = "rejected") -> None:
        """What we rejected at `key`'s name, for the compare-and-set that replaces it: a peek's
        reply, or the server-side marker's text itself; counted under `counter`."""
        with self._lock:
            self._bad[key] = found if isinstance(found, str) else marker(found)
            self._bad.move_to_end(key)
            while len(self._bad) > MAX_BAD_KEYS:
                self._bad.popitem(last=False)
            self.counters[counter] += 1

    def _checked_large(self, key: str, name: str, size: int) -> Any:
        """A signed value over STREAM_BYTES, checked chunk by chunk through the MAC before it is read
        whole: a planted value costs a chunk of memory, never its size. What `_peek` gives; None also
        where the value changed meanwhile (a miss)."""
        assert self.signer is not None
        body = size - SIGNATURE_SIZE
        tail = self.link.call("read", lambda c: c.getrange(name, body, size - 1), None, name=name)
        if not isinstance(tail, bytes) or len(tail) != SIGNATURE_SIZE or body < 0:
            return None

        def chunks() -> Iterator[bytes]:
            for start in range(0, body, STREAM_CHUNK):
                end = min(start + STREAM_CHUNK, body) - 1
                def read(client: Any, first: int = start, last: int = end) -> Any:
                    return client.getrange(name, first, last)
                piece = self.link.call("read", read, None, name=name)
                if not isinstance(piece, bytes) or len(piece) != end - start + 1:
                    raise _Changed
                yield piece
        try:
            problem = self.signer.trailer_problem(tail) or self.signer.streamed_problem(chunks(), tail)
        except _Changed:
            return None
        if problem is None:
            return self._peek("read", name, self.max_entry_bytes)
        now = self._script("read", _MARKER_OF, name, [self.max_entry_bytes], None)
        if isinstance(now, bytes):
            self._remember_bad(key, now.decode(errors="replace"))
        else:
            self._count("rejected")
        raise RejectedEntry(f"remote entry {key[:12]} ({size} bytes, checked in chunks) is {problem}")

    def _holder(self, name: str, lease: Lease) -> object:
        """Whether `lease` is ours at `name`, which SET NX found taken: True (the lease there was not
        one to honour, and ours replaced it), False (a live holder's, or released or replaced
        meanwhile: look again) or _FAILED (the node could not say: nobody to wait for)."""
        found = self._peek("read lease", name, MAX_LEASE_BYTES)
        if found is None or found is _FAILED:
            return _FAILED if found is _FAILED else False
        value = found[1] if found[0] == b"value" else b"(not a lease)"
        why = why_not_honoured(value, name, self.signer, self.lease_max_seconds)
        if why is None:
            return False
        taken = self._script("lock", _REPLACE, name, [MAX_LEASE_BYTES, marker(found), lease.value, self.lease_ms],
                             _FAILED)
        if taken is _FAILED or not taken:
            return taken  # _FAILED, or replaced meanwhile (0): look again
        self._count("leases_refused")
        warn_once(f"remote-lease:{self.endpoint}:{why}",
                  f"remote cache {self.endpoint}: ignored a compile lease {why}; compiling here")
        return True

    def _heartbeat(self, name: str, lease: Lease, stop: threading.Event) -> None:
        while not stop.wait(self.lease_ms / 3000):
            if lease.expired(self.lease_max_seconds):
                return  # past its maximum lifetime: let it lapse, whatever the compile is doing
            self._script("lease", _REFRESH, name, [lease.value, self.lease_ms], None)

    def _peek(self, what: str, name: str, cap: int, stream_over: int | None = None,
              maintenance: bool = False) -> Any:
        """What _PEEK says `name` holds: (b'value', bytes), (b'type', bytes), (b'size', int), with
        `stream_over` (b'large', int); None (nothing there) or _FAILED (the server failed or refused;
        a reply of another shape is its fault). A read goes by the small reader while it serves."""
        args = [cap] if stream_over is None else [cap, stream_over]
        reader = self._light() if what == "read" and not maintenance else None
        if reader is not None:
            try:
                found = self._eval_peek(reader.call, RespError, name, args)
            except RespError:  # a reply left to redis-py (MOVED, auth): the link serves from now on
                reader.give_up()
                reader = None
            except RespFault as fault:  # the server's fault, this call's one deadline spent: the breaker judges
                self._fault_seen_by_reader("read", fault)
                return _FAILED
        if reader is None:
            found = self.link.call(what, lambda client: self._eval_peek(
                client.execute_command, self.link.redis.ResponseError, name, args), _FAILED, name=name,
                maintenance=maintenance)
        if found is None or found is _FAILED:
            return found
        if isinstance(found, list) and len(found) == 2:
            kind, value = found
            if ((kind in (b"value", b"type") and isinstance(value, bytes))
                    or (kind in (b"size", b"large") and isinstance(value, int))):
                return kind, value
        self.link.failed(what, None, False, 0.0, maintenance, name=name)
        return _FAILED

    def _eval_peek(self, send: Callable[..., Any], error: type[Exception], name: str, args: list[Any]) -> Any:
        """`send` the peek flagged read-only, or plain to a server older than script flags."""
        if not self._plain_peek:
            try:
                return send("EVAL", _PEEK, 1, name, *args)
            except error as exc:
                if not any(said in str(exc) for said in _NO_FLAGS):
                    raise
                self._plain_peek = True
        return send("EVAL", _PEEK_BODY, 1, name, *args)

    def _at_placed(self, kind: str, key: str, op: Callable[[str], object],
                   look_aside: bool = True) -> tuple[object, str | None]:
        """(op(name), name) at `key`'s name of `kind` where it goes now, once more at its stand-in when
        its node failed meanwhile; with `look_aside`, a miss is looked for at the stand-in too while
        stand-ins served lately (what an outage published stays found). `op` returns None for a
        miss, _FAILED for a failed call; (_FAILED, None): no node could be asked."""
        name = self._placed(kind, key)
        if name is None:
            return _FAILED, None
        found = op(name)
        if found is _FAILED:
            again = self._placed(kind, key)
            if again is None or again == name:
                return _FAILED, None
            name, found = again, op(again)
        recent = time.monotonic() - self._stand_in_used < STAND_IN_TTL
        if found is None and look_aside and name == self._name(kind, key) and recent:
            tag = self.link.stand_in(name)
            if tag is not None:
                seen = op(aside := self._stand_in_name(kind, tag, key))
                if seen is not None and seen is not _FAILED:
                    return seen, aside
        return found, name

    def _stand_in_name(self, kind: str, tag: str, key: str) -> str:
        return f"{self.prefix}f{kind}{{{tag}}}{key}"

    def _placed(self, kind: str, key: str) -> str | None:
        """`key`'s name of `kind` where it goes now: its own (the small reader serving, one server,
        or its slot's node answering), a stand-in node's (its node skipped), or None (no node may be
        asked)."""
        own = self._name(kind, check_key(key))
        if self._light() is not None:
            return own
        tag = self.link.placement(own)
        if tag is None or tag == "":
            return None if tag is None else own
        self._stand_in_used = time.monotonic()
        return self._stand_in_name(kind, tag, key)

    def _text(self, value: object) -> str | None:
        """A server-given string for a terminal (escaped, secrets hidden)."""
        return None if value is None else self.link.scrub(str(value))

    def _script(self, what: str, script: str, name: str, args: list[Any], default: T) -> T:
        """A Lua script on the one name `name`, on the node serving it."""
        return self.link.call(what, lambda client: client.eval(script, 1, name, *args), default, name=name)


_FAILED = object()  # a call the node failed (or refused): said by the link


def _pipeline(client: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """`commands` in one round trip, no transaction; an error comes back as its reply."""
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    replies: list[Any] = pipe.execute(raise_on_error=False)
    return replies


class _Changed(Exception):
    """A value changed size while it was being checked in chunks: read it again next time."""


def open_from_config(config: Config, owners: Owners, signer: Signer | None, read_only: bool) -> RemoteLevel | None:
    """The remote level KERNEL_CACHE_REMOTE names (None: not configured). Without a signing key it
    opens only when KERNEL_CACHE_REMOTE_UNSIGNED=1 says every client of the server is trusted."""
    if config.remote is None:
        return None
    if signer is None and not config.remote_unsigned:
        raise LevelUntrusted(f"remote cache {redacted(config.remote)}: a server has no file owners, so kernel-cache "
                            f"needs a signing key to trust what it serves (KERNEL_CACHE_SIGNING_KEY_FILE), or "
                            f"KERNEL_CACHE_REMOTE_UNSIGNED=1 if every client that can reach it is trusted")
    return RemoteLevel(config.remote, namespace=config.remote_namespace, ttl=config.remote_ttl,
                      timeout=config.remote_timeout, signer=signer,
                      max_entry_bytes=config.max_entry_bytes, password=config.remote_password,
                      lease_max_seconds=config.lock_timeout)

