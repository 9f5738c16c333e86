"""Persisted autotune winners: which config of an autotuned kernel ran fastest, on one GPU model.

A winner is a small entry (kind "autotune-winner", JSON metadata, no blobs). Its key is the digest of
  - the kernel family: the sorted content keys of every config's compiled kernel (each covers the
    kernel's source, signature, constexprs, options, arch and toolchain, so a changed kernel,
    config list, arch or Triton is another family);
  - the autotune-key values of the call, type-tagged (the int 1, the float 1.0 and True differ);
  - the GPU model (jax's `device_kind`, e.g. "NVIDIA H100 80GB HBM3").
The record names the winning config by its content key, so a reader uses it only when that key is
one of the configs it is about to launch. `problem` recomputes the key from the record, so a record
moved under another key is refused.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kernel_cache.entries.call_entry import expect_text as _text
from kernel_cache.entries.canonical import canonical as canonical  # the key values as a winner key encodes them
from kernel_cache.entries.canonical import digest
from kernel_cache.entries.entry import Entry, is_key
from kernel_cache.entries.summary import META_ARCH, META_CREATED, META_KIND, META_NAME, META_TARGET, META_TOOLCHAIN

KIND = "autotune-winner"
FORMAT = 2  # 2: key values in the one canonical encoding (format 1 left lists untagged and stringified dict keys)
RETIRED_FORMATS = frozenset({1})  # well-formed records no key of this version reaches: they age out


def family(config_keys: Sequence[str]) -> str:
    """The kernel family: one hash of the content keys of all its configs (order does not matter)."""
    return digest(sorted(config_keys))


def winner_key(config_keys: Sequence[str], key_values: Any, device: str) -> str:
    """The store key of the winner of this family, for these (canonical) key values, on this GPU model."""
    return digest({"kind": KIND, "format": FORMAT, "family": family(config_keys),
                    "key_values": key_values, "device": device})


@dataclass(frozen=True)
class ConfigTiming:
    """One config as tuning saw it: its kernel's content key, its description and its median time."""

    key: str
    description: str
    seconds: float | None  # None: this config failed to compile or run
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "description": self.description, "seconds": self.seconds, "error": self.error}


@dataclass(frozen=True)
class Winner:
    """The tuning result of one autotuned call site."""

    kernel: str
    arch: str  # sm_90
    target: dict[str, Any]  # {backend, arch, warp_size}
    toolchain: str  # the toolchain summary of the configs' kernels
    device: str  # GPU model
    key_values: Any  # canonical (see `canonical`)
    key_text: str  # the same, for people: "n=4096; f32[4096], f32[4096] -> f32[4096]"
    configs: tuple[ConfigTiming, ...]
    winner: int  # index into configs
    reps: int = 0
    label: str = ""  # the program and call site it was tuned on
    tuned_at: float = field(default_factory=time.time)

    @property
    def key(self) -> str:
        return winner_key([c.key for c in self.configs], self.key_values, self.device)

    @property
    def best(self) -> ConfigTiming:
        return self.configs[self.winner]

    def to_entry(self) -> Entry:
        meta = {META_KIND: KIND, "format": FORMAT, META_NAME: self.kernel, META_ARCH: self.arch,
                META_TARGET: self.target, META_TOOLCHAIN: {"summary": self.toolchain}, META_CREATED: self.tuned_at,
                "device": self.device, "key_values": self.key_values, "key_text": self.key_text,
                "family": family([c.key for c in self.configs]), "reps": self.reps, "label": self.label,
                "winner": {"index": self.winner, **self.best.to_json()},
                "configs": [c.to_json() for c in self.configs]}
        return Entry(key=self.key, meta=meta, blobs={})

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> "Winner":
        """The record in an entry's metadata; ValueError for anything that is not a well-formed one."""
        if meta.get(META_KIND) == KIND and meta.get("format") in RETIRED_FORMATS:
            raise ValueError(f"an autotune winner record of format {meta.get('format')}, which this kernel-cache no "
                             f"longer looks up (its winner keys are format {FORMAT}): tune again with cachectl tune")
        if meta.get(META_KIND) != KIND or meta.get("format") != FORMAT:
            raise ValueError(f"not an autotune winner record (kind={meta.get(META_KIND)!r})")
        try:
            configs = tuple(ConfigTiming(key=_text(c["key"]), description=_text(c["description"]),
                                         seconds=_seconds(c.get("seconds")), error=_text(c.get("error", "")))
                            for c in meta["configs"])
            toolchain = meta[META_TOOLCHAIN]
            record = cls(kernel=_text(meta[META_NAME]), arch=_text(meta[META_ARCH]), target=dict(meta[META_TARGET]),
                         toolchain=_text(toolchain["summary"]), device=_text(meta["device"]),
                         key_values=meta["key_values"], key_text=_text(meta.get("key_text", "")), configs=configs,
                         winner=int(meta["winner"]["index"]), reps=int(meta.get("reps", 0)),
                         label=_text(meta.get("label", "")), tuned_at=float(meta[META_CREATED]))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed autotune winner record: {type(exc).__name__}: {exc}") from None
        if not configs or not all(is_key(c.key) for c in configs):
            raise ValueError("autotune winner record lists no configs, or a config key that is no content key")
        if not 0 <= record.winner < len(configs) or record.best.seconds is None:
            raise ValueError(f"autotune winner record names config #{record.winner}, which it did not time")
        return record


def problem(entry: Entry) -> str | None:
    """Why a decoded winner entry cannot be used (malformed, or filed under another key), or None."""
    try:
        record = Winner.from_meta(entry.meta)
    except ValueError as exc:
        return str(exc)
    if record.key != entry.key:
        return "autotune winner record is filed under another key than its family, key values and GPU give"
    return None


def damage(entry: Entry) -> str | None:
    """`problem`, except that a well-formed record of a retired format is no damage (it ages out)."""
    if entry.meta.get(META_KIND) == KIND and entry.meta.get("format") in RETIRED_FORMATS:
        return None
    return problem(entry)


def summary(meta: dict[str, Any]) -> dict[str, Any] | None:
    """What listings show of a winner entry (None for other entries or a malformed record)."""
    try:
        record = Winner.from_meta(meta)
    except ValueError:
        return None
    timed = [c.seconds for c in record.configs if c.seconds is not None]
    return {"config": record.best.description, "config_key": record.best.key, "seconds": record.best.seconds,
            "slowest_seconds": max(timed), "configs": len(record.configs), "device": record.device,
            "key_values": record.key_text, "label": record.label}


def _seconds(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise TypeError(f"expected a time in seconds, got {value!r}")
    return float(value)
