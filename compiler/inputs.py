"""What a compile reads besides the kernel and its arguments: the one statement of it.

Triton's compile parses its options with defaults read from the environment (libdevice's path,
ptxas options, the fp-fusion default, whatever a later Triton adds), for a target, with a toolchain.
The content key embeds `compile_inputs`; a lowered call's key and its signature hash `digest_of` the
same function (`lowering.records.call_key`), so a record or a signature never serves a payload built
under other inputs than a fresh compile would use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kernel_cache.entries.canonical import canonical, digest

from . import toolchain
from . import triton_compat as tc
from .portable import portable
from .spec import triton_value
from .target import Target

# (target, options) -> (the environment's state, the installed tools' generation, the document, its
# digest): valid while both are unchanged
_known_inputs: dict[tuple[Any, ...], tuple[object, int, dict[str, Any], str]] = {}
_MAX_KNOWN = 1024


def compile_inputs(target: Target, options: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The inputs in canonical form (files named by their content) and their digest, memoized per
    environment and installation."""
    try:
        ident: tuple[Any, ...] | None = (target, tuple(sorted(options.items())))
        hash(ident)
    except TypeError:  # an unhashable option value: derived every time
        ident = None
    now, generation = tc.triton_env.get(), toolchain.generation
    found = _known_inputs.get(ident) if ident is not None else None
    if found is None or found[0] is not now or found[1] != generation:
        parsed = tc.parse_options(target, dict(options))
        document = {
            "options": canonical(portable(tc.options_to_json(parsed)), triton_value),
            "target": target.json,
            "toolchain": portable(toolchain.toolchain_fingerprint(target)),
        }
        found = (now, generation, document, digest(document))
        if ident is not None:
            if len(_known_inputs) >= _MAX_KNOWN:
                _known_inputs.clear()
            _known_inputs[ident] = found
    return found[2], found[3]


def digest_of(target: Target, options: Mapping[str, Any]) -> str:
    """The digest of `compile_inputs(target, options)`: what a lowered call's key and signature hash.
    TypeError for an option value without a canonical form (the call is then keyless)."""
    return compile_inputs(target, options)[1]
