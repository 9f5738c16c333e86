"""The shared-level scenarios over a real network filesystem: sshfs (FUSE) on loopback, mounted twice
so the two mounts behave like two nodes (separate caches; flock only local to one mount).

Needs root, /dev/fuse and Debian's sshfs + openssh-server; the fixture brings the mounts up with
tests/support/sshfs_loopback.sh (or uses KC_SSHFS_ROOT's if already up) and skips with the reason if not.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid
from pathlib import Path

import pytest
import test_shared_processes as scenarios
from test_shared_level import KEY, make_entry

from kernel_cache import CorruptEntry
from kernel_cache.coordination import locks
from kernel_cache.levels.shared import SharedLevel

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "support" / "sshfs_loopback.sh"


def _is_sshfs(path: Path) -> bool:
    return path.is_dir() and locks.filesystem_of(path)[0] == "fuse.sshfs" and os.path.ismount(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sshfs_root(tmp_path_factory):
    existing = os.environ.get("KC_SSHFS_ROOT")
    if existing and all(_is_sshfs(Path(existing) / n) for n in ("node-a", "node-b")):
        yield Path(existing)
        return
    missing = [t for t in ("sshfs", "ssh-keygen") if shutil.which(t) is None]
    if not (shutil.which("sshd") or os.path.exists("/usr/sbin/sshd")):
        missing.append("sshd")
    if missing:
        pytest.skip(f"sshfs tests need {', '.join(missing)} (apt-get install sshfs openssh-server)")
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        pytest.skip("sshfs tests need root and /dev/fuse to mount")
    root = tmp_path_factory.mktemp("sshfs")
    env = {**os.environ, "KC_SSHFS_ROOT": str(root), "KC_SSHFS_PORT": str(_free_port())}
    res = subprocess.run([str(SCRIPT), "up"], env=env, capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        pytest.skip(f"cannot bring up sshfs on loopback: {res.stderr.strip()[-300:]}")
    try:
        yield root
    finally:
        subprocess.run([str(SCRIPT), "down"], env=env, capture_output=True, timeout=60)


@pytest.fixture
def nodes(sshfs_root) -> tuple[Path, Path]:
    """One fresh shared directory, seen through node-a's and node-b's mounts."""
    name = f"cache-{uuid.uuid4().hex[:8]}"
    a, b = sshfs_root / "node-a" / name, sshfs_root / "node-b" / name
    a.mkdir()
    yield a, b
    shutil.rmtree(a, ignore_errors=True)


def test_auto_picks_soft_locks_on_sshfs(nodes):
    a, b = nodes
    assert locks.filesystem_of(a)[0] == "fuse.sshfs"
    assert SharedLevel(a).lock_kind == "soft" and SharedLevel(b).lock_kind == "soft"


def test_flock_does_not_exclude_across_sshfs_mounts(nodes):
    """Why `auto` must not pick flock here: both 'nodes' get the same flock."""
    a, b = nodes
    level_a, level_b = SharedLevel(a, lock_mode="flock"), SharedLevel(b, lock_mode="flock")
    with level_a.lock(scenarios.KEY, 1) as held_a, level_b.lock(scenarios.KEY, 0.2) as held_b:
        assert held_a and held_b


def test_16_ranks_on_two_sshfs_nodes_build_each_key_once(nodes, tmp_path):
    results = scenarios.scenario_single_flight(list(nodes), tmp_path, "auto")
    assert {r["lock_kind"] for r in results} == {"soft"}


def test_writer_killed_mid_publish_over_sshfs(nodes, tmp_path):
    scenarios.scenario_writer_killed_mid_publish(nodes[0], tmp_path, "auto", other=nodes[1])


def test_killed_lock_holder_over_sshfs(nodes, tmp_path):
    scenarios.scenario_lock_holder_killed(nodes[0], tmp_path, "auto", other=nodes[1])


def test_stale_soft_lock_of_a_dead_node_expires_over_sshfs(nodes):
    scenarios.scenario_stale_marker_of_a_dead_node(nodes[1])  # needs no renameat2(RENAME_EXCHANGE)


def test_corrupt_entry_over_sshfs_is_quarantined(nodes):
    a, b = nodes
    SharedLevel(a).put(make_entry(KEY))
    path = a / "entries" / KEY[:2] / KEY
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    reader = SharedLevel(b)
    with pytest.raises(CorruptEntry):
        reader.get(KEY)
    assert [q["key"] for q in reader.quarantined()] == [KEY] and KEY not in reader

