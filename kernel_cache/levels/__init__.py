"""The store's levels, one module per backend: `memory` (this process), `disk` (a node-local
directory indexed by diskcache), `shared` (plain files on a cluster filesystem) and `remote` (Redis).

`BACKENDS` lists the persistent ones fastest first, each with the function that opens it from a
Config (None when the Config names none); the store reads them in that order and backfills hits
into the faster ones. A new backend is one module here and one row below.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..config import Config
from ..display import redacted
from ..safefs import Owners
from ..signing import Signer
from . import disk, remote, shared

# (config, owners, signer, read_only) -> the opened level, or None when the config names none
Opener = Callable[[Config, Owners, "Signer | None", bool], Any]

BACKENDS: tuple[tuple[str, Opener], ...] = (
    ("disk", disk.open_from_config),
    ("shared", shared.open_from_config),
    ("remote", remote.open_from_config),
)


def location(config: Config, name: str) -> str:
    """Where the level called `name` lives, for messages (never a password)."""
    if name == "disk":
        return str(config.dir)
    if name == "shared":
        return str(config.shared_dir)
    if name == "remote" and config.remote is not None:
        return redacted(config.remote)
    return name
