"""get_or_compile / lookup: the one place where the compiler meets the store."""

from __future__ import annotations

from .artifact import Artifact
from .compile import compile_spec
from .key import content_key
from .spec import KernelSpec


def _store(store):
    if store is None:
        from kernel_cache import default_store

        store = default_store()
    return store


def lookup(spec: KernelSpec, store=None) -> tuple[Artifact, str] | tuple[None, str]:
    """(artifact, key) when the store already holds `spec`, else (None, key). Never compiles."""
    key = content_key(spec)
    found = _store(store).lookup(key, label=spec.name)
    if found is None:
        return None, key
    return Artifact.from_entry(*found), key


def get_or_compile(spec: KernelSpec, store=None) -> tuple[Artifact, str]:
    """The artifact for `spec` from `store` (default: kernel_cache's process store), compiling and
    publishing it on a miss. Returns (artifact, key)."""
    store = _store(store)
    key = content_key(spec)

    def build():
        art = compile_spec(spec)
        meta, blobs = art.to_entry()
        return meta, blobs, art.compile_seconds

    meta, blobs = store.get_or_create(key, build, label=spec.name)
    return Artifact.from_entry(meta, blobs), key
