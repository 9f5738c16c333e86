"""The store's levels, one module per backend: `memory` (this process), `disk` (a node-local
directory indexed by diskcache), `shared` (plain files on a cluster filesystem) and `remote` (Redis).

`BACKENDS` lists the persistent ones fastest first, each with the function that opens it from a
Config (None when the Config names none) and where it would live; the store reads them in that
order and backfills hits into the faster ones. Each level describes itself (`name`, `location`,
`mode`, `writable`): nothing here switches on a level's name. A new backend is one module here and
one row below.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ..config import Config
from ..safefs import Owners
from ..signing import Signer
from . import disk, remote, shared

# (config, owners, signer, read_only) -> the opened level, or None when the config names none
Opener = Callable[[Config, Owners, "Signer | None", bool], Any]


class Backend(NamedTuple):
    """One persistent backend: its name, how it opens from a Config, and where it would live (for a
    message about a level that did not open; an opened level says it itself: `Level.location`)."""

    name: str
    open: Opener
    location_in: Callable[[Config], str]


BACKENDS: tuple[Backend, ...] = (
    Backend("disk", disk.open_from_config, disk.location_in),
    Backend("shared", shared.open_from_config, shared.location_in),
    Backend("remote", remote.open_from_config, remote.location_in),
)
