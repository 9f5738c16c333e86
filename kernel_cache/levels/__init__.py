"""The store's levels, one module per backend: `memory` (this process), `disk` (a node-local
directory of entry files), `shared` (the same files on a cluster filesystem; both built on
`entry_files`) and `remote` (Redis).

`BACKENDS` lists the persistent ones fastest first: a new backend is one module here and one row
below. The shared and remote modules (and the Redis client) are imported only when a Config names
them: a process with a local cache alone never loads them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from kernel_cache.lazy import later
from kernel_cache.levels import disk

if TYPE_CHECKING:
    from kernel_cache.levels import shared
    from kernel_cache.levels.remote import level as remote
else:
    remote = later("kernel_cache.levels.remote.level")
    shared = later("kernel_cache.levels.shared")


class Backend(NamedTuple):
    """One persistent backend: its name, the Config field naming where it lives (None: not used; read
    without importing its module), and its module (`open_from_config(config, owners, signer, read_only)`)."""

    name: str
    field: str
    module: Any


BACKENDS: tuple[Backend, ...] = (Backend("disk", "dir", disk), Backend("shared", "shared_dir", shared),
                                 Backend("remote", "remote", remote))
