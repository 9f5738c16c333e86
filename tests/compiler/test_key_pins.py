"""The keys, pinned: a change to the keying scheme (one canonical encoder, one digest) must leave
every persisted key as it is, or change it on purpose (a format version bump, with a note).

Pinned: the content keys of the example specs for sm_90 and sm_80 under a fixed toolchain fingerprint
(Triton's own parts of a key, its kernel fingerprint and its parsed options, differ between Triton
versions, so the pins are per Triton version; an unpinned version skips), and winner keys for fixed
autotune-key values (independent of Triton; winner format 2 puts the key values in the core's one
canonical encoding). Lowered-call record fingerprints cover this project's own source, so
they change with every edit by design and are not pinned.

    python tests/compiler/test_key_pins.py     # print the pins for the installed Triton (to add a version)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
PINS = HERE / "key_pins.json"
TOOLCHAIN = {"triton_version": "pinned", "triton_build": "0" * 64, "backend": "1" * 64, "env": {}}
WINNER_INPUTS = [  # (config keys, autotune-key values as lowering.records.winners.key_values gives them, device)
    (["0123456789abcdef" * 2, "fedcba9876543210" * 2],
     {"key": [["n", 1024]], "in": [["array", [1024], "float32"]], "out": [["array", [1024], "float32"]]},
     "NVIDIA H100 80GB HBM3"),
    (["a" * 32], {"key": [], "in": [], "out": []}, "NVIDIA A100-SXM4-80GB"),
]


def current_pins() -> dict:
    from compiler import content_key, toolchain
    from compiler.examples import example_specs
    from kernel_cache.entries import winner_entry as winners

    real = toolchain.toolchain_fingerprint
    toolchain.toolchain_fingerprint, toolchain.generation = lambda target: TOOLCHAIN, toolchain.generation + 1
    try:
        content = {f"{label}@{arch}": content_key(spec) for arch in ("sm_90", "sm_80") for label, spec in example_specs(arch)}
    finally:  # the memo of compile inputs made under the pinned toolchain is stale from here
        toolchain.toolchain_fingerprint, toolchain.generation = real, toolchain.generation + 1
    return {
        "content": content,
        "winner": [winners.winner_key(keys, winners.canonical(values), device) for keys, values, device in WINNER_INPUTS],
    }


def test_content_keys_are_the_pinned_ones():
    from compiler import triton_compat

    pins = json.loads(PINS.read_text())
    if triton_compat.TRITON_VERSION not in pins["content"]:
        pytest.skip(f"no pins for Triton {triton_compat.TRITON_VERSION} (python tests/compiler/test_key_pins.py prints them)")
    assert current_pins()["content"] == pins["content"][triton_compat.TRITON_VERSION]


def test_winner_keys_are_the_pinned_ones():
    assert current_pins()["winner"] == json.loads(PINS.read_text())["winner"]


if __name__ == "__main__":
    sys.path[:0] = [str(HERE.parents[1])]
    from compiler import triton_compat

    found = current_pins()
    print(json.dumps({"content": {triton_compat.TRITON_VERSION: found["content"]}, "winner": found["winner"]},
                     indent=2, sort_keys=True))
