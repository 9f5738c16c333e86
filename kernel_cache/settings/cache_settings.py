"""Settings stored with a local cache directory (`cachectl config max-size SIZE`), as ccache keeps
`ccache -M` in the cache: every process on that directory honours them, not only the one shell
whose environment held a variable.

One setting today: the local level's bound, where the process's own configuration leaves it at its
default. The file is read as every cache file is (through `safefs`, at most `MAX_BYTES`, only when
trusted owners wrote it); a file that fails that, or holds anything but the JSON written here, is a
`StoredSettingsError`: cachectl stops on it, a program warns once and keeps the default. Read once
per store, never on a lookup.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Any

from kernel_cache.sanitize import echo
from kernel_cache.settings.config import Config, ConfigError
from kernel_cache.telemetry.warnings_once import warn_once
from kernel_cache.trust.safefs import Owners, Tree, UnsafeFile
from kernel_cache.value_class import FrozenValue

SETTINGS_FILE = "settings.json"
MAX_BYTES = 4096  # the file holds one small JSON object


class StoredSettingsError(ConfigError):
    """The settings file of a cache directory is refused (unsafe, or not what cachectl writes)."""


class StoredSettings(FrozenValue):
    """What a cache directory's settings file says (None: not stored there)."""

    max_bytes: int | None
    path: Path | None  # the file, where there is a cache directory

    def __init__(self, max_bytes: int | None = None, path: Path | None = None) -> None:
        self.__dict__.update(max_bytes=max_bytes, path=path)

    def to_json(self) -> dict[str, Any]:
        return {"path": None if self.path is None else str(self.path), "max_bytes": self.max_bytes}


def parse(data: bytes, where: str) -> int | None:
    """The bound in a settings file's bytes (names a newer version may add are ignored)."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise StoredSettingsError(f"{where} is not a JSON object of kernel-cache's settings") from None
    if not isinstance(doc, dict):
        raise StoredSettingsError(f"{where} is not a JSON object of kernel-cache's settings")
    value = doc.get("max_bytes")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise StoredSettingsError(f"{where}: max_bytes is {echo(str(value)[:40])}, not a positive number of bytes")
    return value


def load(directory: Path, owners: Owners) -> StoredSettings:
    """The settings stored in `directory`; nothing where it is missing or refused as a whole (the level
    itself says so)."""
    path = Path(directory) / SETTINGS_FILE
    try:
        tree = Tree(directory, owners)
    except OSError:
        return StoredSettings(path=path)
    try:
        found = tree.read(SETTINGS_FILE, max_bytes=MAX_BYTES)
    except UnsafeFile as exc:
        reason = re.sub(r" \(KERNEL_CACHE_MAX_ENTRY_BYTES\)$", "", exc.reason)
        raise StoredSettingsError(f"{path} is refused: it {reason}") from None
    except OSError as exc:
        raise StoredSettingsError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        tree.close()
    return StoredSettings(max_bytes=None if found is None else parse(found[0], str(path)), path=path)


def write(tree: Tree, max_bytes: int | None) -> Path:
    """Store the bound in `tree` (None: remove it), mode 0644 whatever the umask (a file others may
    change is refused on read)."""
    path = Path(tree.path) / SETTINGS_FILE
    if max_bytes is None:
        with contextlib.suppress(FileNotFoundError):
            tree.unlink(SETTINGS_FILE)
        return path
    data = (json.dumps({"max_bytes": int(max_bytes)}, sort_keys=True) + "\n").encode()
    old = os.umask(0o022)
    try:
        tree.publish(SETTINGS_FILE, data=data)
    finally:
        os.umask(old)
    return path


def with_stored_bound(config: Config, owners: Owners) -> Config:
    """`config` with the bound stored in its cache directory, where its own bound is the default;
    a refused file is one warning, and the default stays."""
    if config.disabled or config.dir is None or config.max_bytes_given:
        return config
    try:
        stored = load(Path(config.dir), owners)
    except StoredSettingsError as exc:
        warn_once(f"cache-settings:{config.dir}", f"{exc}: ignoring it, the local cache keeps its default bound "
                  f"(rewrite it with 'cachectl config max-size SIZE', or remove it)")
        return config
    return config if stored.max_bytes is None else config.with_(max_bytes=stored.max_bytes)
