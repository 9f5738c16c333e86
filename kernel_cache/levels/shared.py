"""The shared level: entry files on a cluster filesystem (NFS, Lustre, GPFS, sshfs, a local disk),
shared by every node (`entry_files`). SQLite is not used: its locking is unreliable on NFS.

Other users write here. Who is believed (README, "Trust model"): without a signing key, the
directory and every level below it must be owned by you, root or the trusted group and writable by
nobody else, or the level is skipped with one warning; with a signing key, ownership is not
required: every entry read must carry a valid signature for that key, or it is rejected (a miss,
left in place, counted). A damaged entry is moved to quarantine for inspection. The directory must
exist (a missing mount must not silently become a node-local cache); a read-only one serves hits.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from kernel_cache.coordination import locks
from kernel_cache.entries.entry import DEFAULT_MAX_ENTRY_BYTES
from kernel_cache.errors import LevelUnavailable, LevelUntrusted
from kernel_cache.levels import cache_marker
from kernel_cache.levels.cache_marker import ENTRIES_DIR, LOCKS_DIR, QUARANTINE_DIR
from kernel_cache.levels.entry_files import Authenticate, EntryFiles
from kernel_cache.settings.config import Config
from kernel_cache.telemetry.warnings_once import info_once, warn_once
from kernel_cache.trust.safefs import Owners, Tree, UnsafeFile
from kernel_cache.trust.signing import Signer

SHARED_NAMES = frozenset({ENTRIES_DIR, LOCKS_DIR, QUARANTINE_DIR, cache_marker.MARKER})  # all it ever holds


class SharedLevel(EntryFiles):
    name = "shared"
    label = "shared cache"
    quarantines = True
    durable = True
    touch_interval = 3600.0  # refresh an entry's recency at most hourly: no write storm on NFS
    own_names = SHARED_NAMES

    def __init__(self, directory: Path, lock_mode: str = "auto", *, stale_after: float = locks.DEFAULT_STALE_AFTER,
                 owners: Owners | None = None, authenticate: Authenticate | None = None,
                 max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES, read_only: bool = False):
        """`owners`: whose files to believe (default: you and root). With `authenticate` (a signing
        key), ownership is not checked: content is. `read_only`: an operator looking, who changes
        nothing there (no layout, marker, lock probe, touch or quarantine)."""
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise LevelUnavailable(f"shared cache directory {self.directory} does not exist (or is not a "
                                   f"directory); create it once, e.g. mkdir -m 2775")
        if not os.access(self.directory, os.R_OK | os.X_OK):
            raise LevelUnavailable(f"shared cache directory {self.directory} is not readable")
        trust = None if authenticate is not None else (owners or Owners.current())
        try:
            self.tree = Tree(self.directory, trust)
            self._start(authenticate=authenticate, max_entry_bytes=max_entry_bytes, stale_after=stale_after,
                        read_only=read_only, lock_mode=lock_mode)
        except UnsafeFile as exc:
            raise LevelUntrusted(
                f"shared cache {exc.path} {exc.reason}: anyone who can write there could plant kernels "
                f"you would run; fix the ownership (README: 'Trust model'), "
                f"name the group with KERNEL_CACHE_TRUSTED_GROUP, or sign entries with "
                f"KERNEL_CACHE_SIGNING_KEY_FILE") from None
        if trust is None and os.stat(self.directory).st_mode & stat.S_IWOTH:
            warn_once(f"shared-world-writable:{directory}",
                      f"shared cache {directory} is writable by every user: entries are checked by "
                      f"signature, but anyone can delete them. Share it with a group instead "
                      f"(chgrp GROUP; chmod 2770)")
        if not self.writable and not read_only:
            self._note_read_only("no write access")


def open_from_config(config: Config, owners: Owners, signer: Signer | None, read_only: bool) -> SharedLevel:
    """The shared level KERNEL_CACHE_SHARED_DIR names (`BACKENDS` asks only where it names one)."""
    assert config.shared_dir is not None
    level = SharedLevel(config.shared_dir, lock_mode=config.lock, stale_after=config.soft_lock_stale,
                        owners=owners, authenticate=signer.problem if signer is not None else None,
                        max_entry_bytes=config.max_entry_bytes, read_only=read_only)
    if signer is not None:
        info_once(f"shared-signed:{config.shared_dir}",
                  f"shared cache {config.shared_dir}: accepting only entries signed with key {signer.key_id.hex()}")
    return level

