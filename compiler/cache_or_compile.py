"""get_or_compile / lookup: the one place where the compiler meets the store.

A caller holding a session passes its store and its memo of content keys (`session_keys`); with
neither, the process session is looked up once, here, for both.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kernel_cache import Store, current_session
from kernel_cache.errors import KernelCacheError
from kernel_cache.lazy import later
from kernel_cache.telemetry.warnings_once import warn_once

from .artifact import Artifact
from .key import KeyMemo, content_key, document_summary, key_document, session_keys
from .spec import KernelSpec

if TYPE_CHECKING:
    from . import compile as compiling
else:
    compiling = later("compiler.compile")  # Triton's stages: imported at the first miss, never by a warm process

log = logging.getLogger("kernel_cache.compiler")
stopped = threading.Event()  # set by `compile_processes.cancel`: this process compiles nothing more


class Cancelled(KernelCacheError, RuntimeError):
    """A compile asked for, or ended, after `stopped`: nothing is published."""


def compile_spec(spec: KernelSpec) -> Artifact:
    """Triton's stages for `spec` (the name tests and benchmarks wrap); once `stopped`, none starts, and
    one under way raises `Cancelled` rather than be published."""
    if not stopped.is_set():
        artifact = compiling.compile_spec(spec)
        if not stopped.is_set():
            return artifact
    raise Cancelled(f"compiling {spec.name} was cancelled")


def _session_parts(store: Store | None, keys: KeyMemo | None) -> tuple[Store, KeyMemo | None]:
    """The store and key memo to use: the caller's, else the process session's."""
    if store is not None:
        return store, keys
    session = current_session()
    return session.store, keys if keys is not None else session_keys(session)


def lookup(spec: KernelSpec, store: Store | None = None, *,
           keys: KeyMemo | None = None) -> tuple[Artifact | None, str]:
    """(artifact, key) when the store already holds `spec`, else (None, key). Never compiles."""
    store, keys = _session_parts(store, keys)
    key = content_key(spec, keys=keys)
    found = store.lookup(key, label=spec.describe)
    if found is None:
        return None, key
    return _artifact(store, key, found), key


def _artifact(store: Store, key: str, found: tuple[dict[str, Any], dict[str, bytes]]) -> Artifact | None:
    """The artifact in a valid entry; an entry that is well-formed but not a usable artifact (another
    tool's, an older layout) is dropped so the caller rebuilds it."""
    try:
        return Artifact.from_entry(*found)
    except (KeyError, TypeError, ValueError) as exc:
        warn_once(f"bad-artifact:{key}", f"dropped entry {key[:12]}: not a usable kernel artifact ({exc})")
        store.delete(key)
        return None


Build = Callable[[KernelSpec, str], tuple[dict[str, Any], dict[str, bytes], float]]  # a miss's entry


def build_here(spec: KernelSpec, key: str) -> tuple[dict[str, Any], dict[str, bytes], float]:
    """The entry of `spec` (under `key`) compiled in this thread."""
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s compiling %s: key covers %s", key[:12], spec.describe(), document_summary(key_document(spec)))
    art = compile_spec(spec)
    meta, blobs = art.to_entry()
    return meta, blobs, art.compile_seconds


def get_or_compile(spec: KernelSpec, store: Store | None = None, *, keys: KeyMemo | None = None,
                   known_missing: bool = False, build_on: Build = build_here) -> tuple[Artifact, str]:
    """(artifact, key) for `spec`, compiled by `build_on` and published on a miss. `known_missing`:
    `lookup` just missed it (under the build lock only a presence probe)."""
    store, keys = _session_parts(store, keys)
    key = content_key(spec, keys=keys)
    build = functools.partial(build_on, spec, key)
    found = store.get_or_create(key, build, label=spec.describe, known_missing=known_missing)
    artifact = _artifact(store, key, found)
    if artifact is None:  # the unusable entry is gone: build it again
        artifact = _artifact(store, key, store.get_or_create(key, build, label=spec.describe))
    if artifact is None:
        raise RuntimeError(f"the store returned an unusable entry for {spec.name} twice ({key[:12]})")
    return artifact, key
