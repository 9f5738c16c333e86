"""The compiled artifact: binaries plus the metadata a launcher needs, as (metadata, blobs) for the store."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

from kernel_cache.entries.summary import (
    META_ARCH,
    META_COMPILE_SECONDS,
    META_KIND,
    META_NAME,
    META_RECIPE,
    META_TARGET,
    META_TOOLCHAIN,
)

from .target import Target

TEXT_BLOBS = ("ptx", "amdgcn", "ttir", "ttgir", "llir")  # blobs stored UTF-8 encoded
KIND = "triton-kernel"  # what `kind` says in entries this module writes
DEFLATED = ".deflate"  # blob name suffix: that blob as a raw-deflate run (see deflate_run)
DEFLATED_BLOBS = ("ptx", "cubin")  # what a launcher embeds in a compressed message
LAUNCHED_FROM = {"cuda": "ptx", "hip": "hsaco"}  # per backend, the blob jaxlib's Triton call is built from


def deflate_run(data: bytes) -> bytes:
    """`data` as an independent raw-deflate run ending on a byte boundary: such runs concatenate into one
    zlib stream, so jaxlib's compressed Triton call reuses the stored run instead of deflating anew."""
    c = zlib.compressobj(1, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush(zlib.Z_FULL_FLUSH)


@dataclass
class Artifact:
    """One compiled kernel. `recipe` says how to rebuild it (used by `cachectl prewarm`). A dataclass:
    only a lookup or a miss imports it, never a warm process (`kernel_cache.value_class`)."""

    name: str  # the symbol in the binary
    target: Target
    num_warps: int
    num_ctas: int
    num_stages: int
    shared_mem: int
    cluster_dims: tuple[Any, ...] = (1, 1, 1)
    global_scratch_size: int = 0
    global_scratch_align: int = 1
    toolchain: dict[str, Any] = field(default_factory=dict)
    compile_seconds: float = 0.0
    recipe: dict[str, Any] | None = None
    blobs: dict[str, bytes] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # other Triton metadata worth keeping

    @property
    def ptx(self) -> str | None:
        return self._text("ptx")

    @property
    def cubin(self) -> bytes | None:
        return self.blobs.get("cubin")

    @property
    def hsaco(self) -> bytes | None:
        return self.blobs.get("hsaco")

    @property
    def ttir(self) -> str | None:
        return self._text("ttir")

    def deflated(self, name: str) -> bytes | None:
        """The stored raw-deflate run of blob `name` (None for entries written before runs were kept)."""
        return self.blobs.get(name + DEFLATED)

    def _text(self, name: str) -> str | None:
        blob = self.blobs.get(name)
        return blob.decode() if blob is not None else None

    def to_entry(self) -> tuple[dict[str, Any], dict[str, bytes]]:
        meta = {  # the fields cachectl reads back are named in kernel_cache.entries.summary
            META_KIND: KIND,
            META_NAME: self.name,
            META_TARGET: self.target.json,
            META_ARCH: self.target.name,
            "num_warps": self.num_warps,
            "num_ctas": self.num_ctas,
            "num_stages": self.num_stages,
            "shared_mem": self.shared_mem,
            "cluster_dims": list(self.cluster_dims),
            "global_scratch_size": self.global_scratch_size,
            "global_scratch_align": self.global_scratch_align,
            META_TOOLCHAIN: self.toolchain,
            META_COMPILE_SECONDS: self.compile_seconds,
            META_RECIPE: self.recipe,
            "extra": self.extra,
        }
        blobs = dict(self.blobs)
        for name in DEFLATED_BLOBS:
            if name in blobs and name + DEFLATED not in blobs:
                blobs[name + DEFLATED] = deflate_run(blobs[name])
        return meta, blobs

    @classmethod
    def from_entry(cls, meta: dict[str, Any], blobs: dict[str, bytes]) -> "Artifact":
        """The artifact an entry holds; ValueError (or KeyError/TypeError) for one no launcher could use,
        which jaxlib would only fail on deep inside its proto builder."""
        if meta.get(META_KIND) != KIND:
            raise ValueError(f"entry is not a Triton kernel artifact (kind={meta.get(META_KIND)!r})")
        target = Target.from_json(meta[META_TARGET])
        needed = LAUNCHED_FROM.get(target.backend)
        if needed is not None and not blobs.get(needed):
            raise ValueError(f"entry for {target.name} has no {needed}")
        return cls(
            name=meta[META_NAME], target=target, num_warps=int(meta["num_warps"]),
            num_ctas=int(meta["num_ctas"]), num_stages=int(meta["num_stages"]),
            shared_mem=int(meta["shared_mem"]), cluster_dims=tuple(meta.get("cluster_dims", (1, 1, 1))),
            global_scratch_size=int(meta.get("global_scratch_size", 0)),
            global_scratch_align=int(meta.get("global_scratch_align", 1)),
            toolchain=dict(meta.get(META_TOOLCHAIN, {})), compile_seconds=float(meta.get(META_COMPILE_SECONDS, 0)),
            recipe=meta.get(META_RECIPE), blobs=dict(blobs), extra=dict(meta.get("extra", {})))
