"""Store configuration from the environment (KERNEL_CACHE_*) or from code, validated early."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.IGNORECASE)
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
LOG_LEVELS = ("", "off", "info", "debug")
LOCK_MODES = ("auto", "flock", "soft")


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
