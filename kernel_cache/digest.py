"""The one hash of a JSON document: canonical text (sorted keys, no spaces) through xxh3-128.

Content keys (`compiler.key`), winner keys (`kernel_cache.winners`) and the toolchain summary all use
it: one digest in the core, so no floor keeps a copy of its own."""

from __future__ import annotations

import json
from typing import Any

import xxhash


def digest(document: Any) -> str:
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return str(xxhash.xxh3_128_hexdigest(text.encode()))
