"""A Redis Cluster's slot map as the remote level keeps it: which node serves each of the 16,384
slots, read from one node's `CLUSTER SLOTS` reply and refused where it is past sane bounds.

A node may be hostile or broken: its reply is read within one deadline and TOPOLOGY_BYTES, and a
map past MAX_NODES nodes or of another shape is that node's fault. Nodes are named `host:port`; an
empty host (or `?`) is the host that was asked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kernel_cache.errors import KernelCacheError

SLOTS = 16384
MAX_NODES = 1000  # Redis Cluster's own recommended ceiling for a cluster's size
TOPOLOGY_BYTES = 3 << 20  # one CLUSTER SLOTS reply (a cluster of MAX_NODES in few ranges is ~0.2 MiB)
MAX_STAND_IN_TAGS = 1 << 16  # hash tags tried for one that lands on a stand-in node's slots


class BadSlotMap(KernelCacheError, ValueError):
    """A CLUSTER SLOTS reply that is no sane slot map: the message says what."""


class SlotMap:
    def __init__(self, owners: list[str | None], replicas: dict[str, list[str]]):
        self.owners = owners  # slot -> the node serving it (None: no node serves it now)
        self.replicas = replicas  # primary -> its replicas, in the order the reply gave them
        self._runs: list[tuple[int, str]] | None = None  # (first slot, node) of each run of slots, made once
        self._tags: dict[str, str | None] = {}  # node -> its stand-in hash tag, found once

    @property
    def primaries(self) -> list[str]:
        return list(dict.fromkeys(owner for owner in self.owners if owner is not None))

    @property
    def nodes(self) -> list[str]:
        """Every node the map names: primaries first, then replicas."""
        return list(dict.fromkeys(self.primaries + [r for rs in self.replicas.values() for r in rs]))

    def next_primary(self, slot: int, usable: Callable[[str], bool]) -> str | None:
        """The first usable node serving a slot after `slot`, in slot order (wrapping): the stand-in
        every process with this map picks for `slot` while its own node is skipped."""
        runs = self._runs
        if runs is None:
            runs = self._runs = [(i, owner) for i, owner in enumerate(self.owners)
                                 if owner is not None and (i == 0 or self.owners[i - 1] != owner)]
        after = [run for run in runs if run[0] > slot] + [run for run in runs if run[0] <= slot]
        return next((owner for _, owner in after if usable(owner)), None)

    def stand_in_tag(self, node: str, key_slot: Callable[[bytes], int]) -> str | None:
        """The first hash tag `kcsN` whose slot (`key_slot`: Redis's) `node` serves here: the same
        in every process with this map."""
        if node not in self._tags:
            self._tags[node] = next((f"kcs{i}" for i in range(MAX_STAND_IN_TAGS)
                                     if self.owners[key_slot(f"kcs{i}".encode())] == node), None)
        return self._tags[node]

    def moved(self, slot: int, node: str) -> SlotMap:
        """This map with `slot` served by `node` (a MOVED reply), unless that names too many nodes."""
        if not 0 <= slot < SLOTS or (node not in self.replicas and len(self.replicas) >= MAX_NODES):
            return self
        owners = list(self.owners)
        owners[slot] = node
        return SlotMap(owners, {**self.replicas, node: self.replicas.get(node, [])})


def parse(reply: Any, asked_host: str) -> SlotMap:
    """The slot map in a CLUSTER SLOTS reply; BadSlotMap for anything past the bounds above."""
    if not isinstance(reply, list) or len(reply) > SLOTS:
        raise BadSlotMap(f"CLUSTER SLOTS gave {type(reply).__name__} of {len(reply) if isinstance(reply, list) else '?'} "
                         f"ranges, not a list of at most {SLOTS}")
    owners: list[str | None] = [None] * SLOTS
    replicas: dict[str, list[str]] = {}
    seen: set[str] = set()
    for entry in reply:
        if not isinstance(entry, list) or len(entry) < 3 or len(entry) > 2 + MAX_NODES:
            raise BadSlotMap("a CLUSTER SLOTS range is not [start, end, primary, replicas...]")
        start, end = entry[0], entry[1]
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end < SLOTS):
            raise BadSlotMap(f"a CLUSTER SLOTS range is outside 0-{SLOTS - 1}")
        nodes = [_node(item, asked_host) for item in entry[2:]]
        seen.update(nodes)
        if len(seen) > MAX_NODES:
            raise BadSlotMap(f"CLUSTER SLOTS names more than {MAX_NODES} nodes")
        primary = nodes[0]
        known = replicas.setdefault(primary, [])
        known += [n for n in nodes[1:] if n not in known]
        owners[start:end + 1] = [primary] * (end - start + 1)
    return SlotMap(owners, replicas)


def _node(item: Any, asked_host: str) -> str:
    if not isinstance(item, list) or len(item) < 2:
        raise BadSlotMap("a CLUSTER SLOTS node is not [host, port, ...]")
    host, port = item[0], item[1]
    if isinstance(host, bytes):
        host = host.decode("ascii", errors="replace")
    if not isinstance(host, str) or len(host) > 255 or any(c.isspace() or c in "/@?#" for c in host):
        raise BadSlotMap("a CLUSTER SLOTS node's host is no host name")
    if not isinstance(port, int) or not 0 < port < 65536:
        raise BadSlotMap("a CLUSTER SLOTS node's port is no port")
    host = host if host not in ("", "?") else asked_host
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
