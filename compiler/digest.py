"""The one hash of a JSON document: canonical text (sorted keys, no spaces) through xxh3-128."""

from __future__ import annotations

import json
from typing import Any

import xxhash


def digest(document: Any) -> str:
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return str(xxhash.xxh3_128_hexdigest(text.encode()))
