"""Store configuration from the environment (KERNEL_CACHE_*) or from code, validated early."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from .safefs import resolve_group
from .signing import Signer, SigningKeyError, load_key_file

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.IGNORECASE)
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
LOG_LEVELS = ("", "off", "info", "debug")
LOCK_MODES = ("auto", "flock", "soft")
INDEX_TIMEOUT_CAP = 30.0  # a healthy SQLite write transaction takes milliseconds


class ConfigError(ValueError):
    """A malformed setting; the message names the variable or option."""


def parse_size(text: str, what: str = "size") -> int:
    """'512M', '10G', '1.5GiB', '4096' -> bytes (binary units)."""
    m = _SIZE.match(str(text))
    if not m:
        raise ConfigError(f"{what}: cannot read {text!r} as a size (examples: 4096, 512M, 10G)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_duration(text: str, what: str = "duration") -> float:
    """'30d', '12h', '90m', '45s', '3600' -> seconds."""
    m = _DURATION.match(str(text))
    if not m:
        raise ConfigError(f"{what}: cannot read {text!r} as a duration (examples: 45s, 90m, 12h, 30d)")
    return float(m.group(1)) * _SECONDS[m.group(2).lower()]


def _flag(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("", "0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={value!r}: expected 1/0, true/false, yes/no or on/off")


@dataclass(frozen=True)
class Config:
    """Where and how much to cache. `dir=None` means memory only (no persistence across runs)."""

    dir: Path | None = None
    shared_dir: Path | None = None
    disabled: bool = False
    memory_bytes: int = 256 << 20
    memory_items: int = 4096
    max_bytes: int = 8 << 30
    log: str = ""
    lock: str = "auto"
    lock_timeout: float = 600.0
    soft_lock_stale: float = 120.0  # a soft lock not refreshed for this long belongs to a dead holder
    trusted_group: str | None = None  # besides yourself and root, whose cache files you accept
    signing_key: bytes | None = field(default=None, repr=False)
    max_entry_bytes: int = 256 << 20  # no real entry comes near; a hostile file larger is refused unread

    def __post_init__(self):
        if self.log not in LOG_LEVELS:
            raise ConfigError(f"KERNEL_CACHE_LOG={self.log!r}: expected one of info, debug, off")
        if self.lock not in LOCK_MODES:
            raise ConfigError(f"KERNEL_CACHE_LOCK={self.lock!r}: expected one of {', '.join(LOCK_MODES)}")
        if self.soft_lock_stale <= 0 or self.lock_timeout <= 0:
            raise ConfigError("KERNEL_CACHE_SOFT_LOCK_STALE and KERNEL_CACHE_LOCK_TIMEOUT must be positive")
        for name in ("memory_bytes", "memory_items", "max_bytes"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative")
        if self.max_entry_bytes < 1 << 16:
            raise ConfigError("KERNEL_CACHE_MAX_ENTRY_BYTES must be at least 64K")
        if self.trusted_group is not None:
            try:
                resolve_group(self.trusted_group)
            except KeyError:
                raise ConfigError(f"KERNEL_CACHE_TRUSTED_GROUP={self.trusted_group!r}: no such group") from None
        if self.signing_key is not None:
            try:
                Signer(self.signing_key)
            except SigningKeyError as exc:
                raise ConfigError(f"KERNEL_CACHE_SIGNING_KEY: {exc}") from None

    @property
    def trusted_gid(self) -> int | None:
        return None if self.trusted_group is None else resolve_group(self.trusted_group)

    @property
    def index_timeout(self) -> float:
        """Longest wait for the local SQLite index held by another process (a stuck neighbour)."""
        return min(self.lock_timeout, INDEX_TIMEOUT_CAP)

    def signer(self) -> Signer | None:
        return None if self.signing_key is None else Signer(self.signing_key)

    def with_(self, **changes) -> "Config":
        return replace(self, **changes)

    @classmethod
    def from_env(cls, environ=None) -> "Config":
        env = os.environ if environ is None else environ

        def size(name: str, default: int) -> int:
            raw = env.get(name)
            return default if raw in (None, "") else parse_size(raw, name)

        def path(name: str) -> Path | None:
            raw = env.get(name, "").strip()
            return Path(raw).expanduser() if raw else None

        def duration(name: str, default: float) -> float:
            raw = env.get(name, "").strip()
            return parse_duration(raw, name) if raw else default

        return cls(
            trusted_group=env.get("KERNEL_CACHE_TRUSTED_GROUP", "").strip() or None,
            signing_key=_signing_key(env),
            max_entry_bytes=size("KERNEL_CACHE_MAX_ENTRY_BYTES", cls.max_entry_bytes),
            dir=path("KERNEL_CACHE_DIR"),
            shared_dir=path("KERNEL_CACHE_SHARED_DIR"),
            disabled=_flag("KERNEL_CACHE_DISABLE", env.get("KERNEL_CACHE_DISABLE", "")),
            memory_bytes=size("KERNEL_CACHE_MEMORY_BYTES", cls.memory_bytes),
            memory_items=int(size("KERNEL_CACHE_MEMORY_ITEMS", cls.memory_items)),
            max_bytes=size("KERNEL_CACHE_MAX_BYTES", cls.max_bytes),
            log=env.get("KERNEL_CACHE_LOG", "").strip().lower(),
            lock=env.get("KERNEL_CACHE_LOCK", "auto").strip().lower() or "auto",
            lock_timeout=duration("KERNEL_CACHE_LOCK_TIMEOUT", cls.lock_timeout),
            soft_lock_stale=duration("KERNEL_CACHE_SOFT_LOCK_STALE", cls.soft_lock_stale),
        )


def _signing_key(env) -> bytes | None:
    """From KERNEL_CACHE_SIGNING_KEY_FILE (preferred: a 0600 file) or KERNEL_CACHE_SIGNING_KEY."""
    key_file = env.get("KERNEL_CACHE_SIGNING_KEY_FILE", "").strip()
    key_text = env.get("KERNEL_CACHE_SIGNING_KEY", "").strip()
    if key_file and key_text:
        raise ConfigError("set KERNEL_CACHE_SIGNING_KEY or KERNEL_CACHE_SIGNING_KEY_FILE, not both")
    if key_file:
        try:
            return load_key_file(Path(key_file).expanduser())
        except SigningKeyError as exc:
            raise ConfigError(str(exc)) from None
    return key_text.encode() if key_text else None
