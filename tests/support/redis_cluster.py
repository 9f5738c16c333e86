"""Real Redis deployments for the scale-out tests and scripts/bench_remote.py: a Redis Cluster of N
masters with a replica each (`redis-server --cluster-enabled yes`, `redis-cli --cluster create`), and a
primary with a read-only replica (`--replicaof`), on free loopback ports, persistence off, torn down by
pid (scaffolding: the product never imports it)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from redis_server import RedisServer, free_port


def cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is a port too, and free."""
    while True:
        port = free_port()
        if port + 10000 < 65536:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port


def _ask(port: int, *words: str) -> str:
    """One command over a raw socket: the reply's text (enough for INFO, CLUSTER INFO, PING)."""
    command = b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w.encode()) for w in words)
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(command)
        s.settimeout(0.5)
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except OSError:
            pass
    return data.decode(errors="replace")


class RedisCluster:
    def __init__(self, workdir: Path, masters: int = 3, node_timeout_ms: int = 1000):
        if shutil.which("redis-cli") is None:
            raise FileNotFoundError("redis-cli")
        self.nodes: list[RedisServer] = []
        for i in range(masters * 2):
            home = workdir / f"node{i}"
            home.mkdir(parents=True, exist_ok=True)
            self.nodes.append(RedisServer(home, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                          "--cluster-node-timeout", str(node_timeout_ms), port=cluster_port()))
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run(["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", "1", "--cluster-yes"],
                       check=True, capture_output=True, timeout=60)
        self.wait_ok()

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every live node says the cluster is whole (slots covered, a master for each)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            live = [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]
            if all("cluster_state:ok" in _ask(n.port, "CLUSTER", "INFO") for n in live):
                return
            time.sleep(0.2)
        raise RuntimeError("the Redis Cluster did not come up")

    def masters(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None
                and "role:master" in _ask(n.port, "INFO", "replication")]

    def replicas_of(self, master: RedisServer) -> list[RedisServer]:
        """The live nodes replicating `master` (INFO replication of each)."""
        return [n for n in self.nodes if n is not master and n.proc is not None and n.proc.poll() is None
                and f"master_port:{master.port}" in _ask(n.port, "INFO", "replication")]

    def wait_state(self, state: str, timeout: float = 60.0) -> None:
        """Until every live node says `cluster_state:<state>` (ok, or fail: a shard lost)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            live = [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]
            if all(f"cluster_state:{state}" in _ask(n.port, "CLUSTER", "INFO") for n in live):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the Redis Cluster did not reach cluster_state:{state}")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


class PrimaryWithReplica:
    def __init__(self, workdir: Path):
        (workdir / "primary").mkdir(parents=True, exist_ok=True)
        (workdir / "replica").mkdir(parents=True, exist_ok=True)
        self.primary = RedisServer(workdir / "primary")
        self.replica = RedisServer(workdir / "replica", "--replicaof", "127.0.0.1", str(self.primary.port))

    def wait_synced(self, timeout: float = 30.0) -> None:
        """Until the replica has every key the primary has (its link up, no offset left to copy)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = _ask(self.replica.port, "INFO", "replication")
            if "master_link_status:up" in info and _ask(self.replica.port, "DBSIZE") == _ask(self.primary.port,
                                                                                              "DBSIZE"):
                return
            time.sleep(0.1)
        raise RuntimeError("the replica did not catch up")

    def stop(self) -> None:
        self.replica.stop()
        self.primary.stop()
