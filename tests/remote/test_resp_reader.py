"""The remote level's small reader (kernel_cache/levels/remote/resp_reader.py): a warm node served from Redis
reads entries and restarts their TTL without importing redis-py, over TCP and a Unix socket, with a
password and a database number; what it does not serve (TLS, URL options, a cluster's MOVED, a wrong
password) goes to redis-py. Its hostile-server promises (one deadline, the byte cap) are the level's,
tested in test_remote_hostile.py, whose reads go through it first."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading

import pytest
from conftest import ROOT, child_env
from redis_server import RedisServer
from test_shared_level import KEY, KEY2, make_entry

from kernel_cache.entries import entry as entry_format
from kernel_cache.levels.remote.resp_reader import RespError, RespFault, RespReader, RespUnusable
from kernel_cache.trust.signing import Signer

SIGNING_KEY = b"remote-team-signing-key-0123456789"
needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None,
                                 reason="redis-server is not installed (apt-get install redis-server; scripts/test.sh "
                                        "does it where it runs as root)")


@pytest.mark.parametrize(("url", "password", "expected"), [
    ("redis://127.0.0.1:7000/3", None, ("127.0.0.1", 7000, None, None, None, 3)),
    ("redis://:p%40ss@h/0", None, ("h", 6379, None, None, "p@ss", 0)),
    ("redis://user:pw@h:1?db=5", None, ("h", 1, None, "user", "pw", 5)),
    ("redis://:in-url@h", "from-file", ("h", 6379, None, None, "from-file", 0)),
    ("unix:///run/redis.sock?db=2", None, ("localhost", 0, "/run/redis.sock", None, None, 2)),
])
def test_the_urls_it_serves(url, password, expected):
    reader = RespReader(url, password=password, timeout=1.0, max_reply_bytes=1)
    where = reader.where
    assert (where.host, where.port, where.path, where.username, reader.password, where.db) == expected


@pytest.mark.parametrize("url", ["rediss://h:6380/0", "redis://h/0?socket_timeout=3", "redis://h/x",
                                 "redis://h:port/0", "redis+sentinel://h/0", "redis://h/0#frag"])
def test_the_urls_it_leaves_to_redis_py(url):
    with pytest.raises(RespUnusable):
        RespReader(url, password=None, timeout=1.0, max_reply_bytes=1)


def _read_command(conn: socket.socket) -> None:
    """One whole command, an array of N bulk strings (1 + 2N lines): a reply sent after a part of it
    leaves the rest unread, and closing with unread bytes resets the client's connection."""
    data = b""
    while b"\r\n" not in data or data.count(b"\r\n") < 1 + 2 * int(data[1:data.index(b"\r\n")]):
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk


def _serve_once(reply: bytes, close: bool = False) -> tuple[str, threading.Thread]:
    """A one-connection server that reads one command, sends `reply`, then waits for the client to
    close (`close`: closes at once)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        conn, _ = listener.accept()
        with conn:
            _read_command(conn)
            conn.sendall(reply)
            if not close:
                conn.recv(1)  # until the client closes
        listener.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return f"redis://127.0.0.1:{listener.getsockname()[1]}/0", thread


@pytest.mark.parametrize(("reply", "expected"), [
    (b"*2\r\n$5\r\nvalue\r\n$4\r\na\r\nb\r\n", [b"value", b"a\r\nb"]),
    (b"*2\r\n$4\r\nsize\r\n:123\r\n", [b"size", 123]),
    (b"$-1\r\n", None),
    (b"*-1\r\n", None),
    (b"+OK\r\n", b"OK"),
    (b"*1\r\n*1\r\n*0\r\n", [[[]]]),
])
def test_replies_are_read_as_redis_py_reads_them(reply, expected):
    url, thread = _serve_once(reply)
    reader = RespReader(url, password=None, timeout=5, max_reply_bytes=1 << 20)
    assert reader.call("GET", "k") == expected and reader.usable
    reader.close()
    thread.join(5)


@pytest.mark.parametrize(("reply", "kind"), [
    (b"$1048577\r\n", "overflow"),  # announced past the budget: refused before a byte of it is read
    (b"*1\r\n" * 8 + b":1\r\n", "protocol"),  # nested past any reply the level asks for
    (b"?what\r\n", "protocol"),
    (b"$3\r\nabcd\r\n", "protocol"),  # a bulk of the wrong length
    (b"$5\r\nab", "timeout"),  # stalls mid-reply: the call's deadline ends it
])
def test_a_reply_of_the_wrong_shape_ends_the_reader(reply, kind):
    url, thread = _serve_once(reply)
    reader = RespReader(url, password=None, timeout=0.5, max_reply_bytes=1 << 20)
    with pytest.raises(RespFault) as caught:
        reader.call("GET", "k")
    assert caught.value.kind == kind and not reader.usable
    thread.join(5)


def test_a_server_closing_mid_reply_ends_the_reader():
    url, thread = _serve_once(b"$5\r\nab", close=True)
    reader = RespReader(url, password=None, timeout=5, max_reply_bytes=1 << 20)
    with pytest.raises(RespFault) as caught:
        reader.call("GET", "k")
    assert caught.value.kind == "connection" and not reader.usable
    thread.join(5)


def test_an_error_reply_is_raised_and_keeps_the_connection():
    url, thread = _serve_once(b"-NOSCRIPT No matching script\r\n")
    reader = RespReader(url, password=None, timeout=5, max_reply_bytes=1 << 20)
    with pytest.raises(RespError, match="NOSCRIPT"):
        reader.call("EVALSHA", "0" * 40, 0)
    assert reader.usable
    reader.close()
    thread.join(5)


PROBE = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
from kernel_cache.levels.remote.level import RemoteLevel
from kernel_cache.trust.signing import Signer
url, namespace, key, other = sys.argv[1:5]
level = RemoteLevel(url, namespace=namespace, signer=Signer(b"remote-team-signing-key-0123456789"), ttl=5000)
hit = level.get(key)
miss = level.get(other)
level.close()  # sends the hit's TTL refresh
print(json.dumps({"hit": hit is not None and hit.key == key, "miss": miss is None, "counters": level.counters,
                  "redis_imported": "redis" in sys.modules}))
"""


def _probe(url: str, namespace: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, url, namespace, KEY, KEY2], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _plant(url: str, namespace: str, **client) -> object:
    import redis

    from kernel_cache.levels.remote.level import RemoteLevel

    level = RemoteLevel(url, namespace=namespace, signer=Signer(SIGNING_KEY), ttl=100)
    level.put_raw(KEY, Signer(SIGNING_KEY).sign(entry_format.encode(make_entry(KEY))))
    plain = redis.Redis.from_url(url, **client)
    plain.script_flush()  # the reader's first EVALSHA meets NOSCRIPT and loads it with EVAL
    return plain, level._entry(KEY)


@needs_redis
@pytest.mark.parametrize("over", ["tcp", "unix"])
def test_a_warm_node_reads_and_restarts_ttls_without_redis_py(tmp_path, over):
    srv = RedisServer(tmp_path)
    try:
        url = srv.url if over == "tcp" else srv.unix_url
        plain, name = _plant(url, "light")
        assert 0 < plain.ttl(name) <= 100
        report = _probe(url, "light")
        assert report["hit"] and report["miss"] and not report["redis_imported"], report
        assert report["counters"]["hits"] == 1 and report["counters"]["misses"] == 1
        assert report["counters"]["breaker_openings"] == 0
        assert plain.ttl(name) > 100  # the verified hit restarted its life (ttl=5000)
    finally:
        srv.stop()


@needs_redis
def test_a_password_and_a_database_number(tmp_path):
    import redis

    srv = RedisServer(tmp_path)
    try:
        redis.Redis.from_url(srv.url).config_set("requirepass", "s3cret")
        url = f"redis://:s3cret@127.0.0.1:{srv.port}/4"
        _plant(url, "pw")
        report = _probe(url, "pw")
        assert report["hit"] and not report["redis_imported"], report
        wrong = _probe(f"redis://:wrong@127.0.0.1:{srv.port}/4", "pw")  # redis-py takes over and fails
        assert not wrong["hit"] and wrong["redis_imported"] and wrong["counters"]["breaker_openings"] == 1, wrong
    finally:
        srv.stop()
