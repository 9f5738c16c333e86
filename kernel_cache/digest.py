"""The one hash of a JSON document: canonical text (sorted keys, no spaces) through xxh3-128.

Content keys (`compiler.key`), winner keys (`kernel_cache.winner_entry`), lowered-call record fingerprints
(`lowering.records.call_records`) and the toolchain summary all use it, over documents in the one canonical
encoding (`kernel_cache.canonical`): one digest in the core, so no floor keeps a copy of its own.
A caller that memoizes the text of a shared part splices it into the whole document's text
(JSON text is compositional) and hashes that with `digest_text`: the same digest."""

from __future__ import annotations

import json
from typing import Any

import xxhash


def text(document: Any) -> str:
    """The canonical text of a JSON document: what `digest` hashes."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def digest_text(document_text: str) -> str:
    """The digest of a document given as its canonical text."""
    return str(xxhash.xxh3_128_hexdigest(document_text.encode()))


def digest(document: Any) -> str:
    return digest_text(text(document))
