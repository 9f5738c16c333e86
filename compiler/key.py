"""The content key: the digest of a spec and its compile inputs in the core's canonical encoding.

The encoding tags every value with its type (1, 1.0, True and "1" never collide); the document's
format version invalidates every key at once when bumped. The memo of keys is the caller's session's.
"""

from __future__ import annotations

import json
from typing import Any

from kernel_cache import Session
from kernel_cache.bounded_memo import BoundedMemo
from kernel_cache.entries.canonical import canonical, digest
from kernel_cache.entries.canonical import text as _text
from kernel_cache.session import SessionMemo

from . import inputs
from . import triton_compat as tc
from .spec import KernelSpec, triton_value
from .toolchain import toolchain_fingerprint

KEY_FORMAT_VERSION = 2  # 2: paths in options and Triton's environment stand for their content (compiler.portable)


def key_document(spec: KernelSpec) -> dict[str, Any]:
    """Everything the key covers, in canonical form (for debugging a surprising miss)."""
    constexprs, attrs = canonical([dict(spec.constexprs), {repr(k): v for k, v in spec.attrs.items()}],
                                  triton_value)["list"]
    return {
        "format": KEY_FORMAT_VERSION,
        "kernel": {"name": spec.name, "fingerprint": tc.kernel_fingerprint(spec.kernel)},
        "signature": [[k, v] for k, v in spec.signature.items()],
        "constexprs": constexprs,
        "attrs": attrs,
        "keep_ir": spec.keep_ir,
        **inputs.compile_inputs(spec.target, spec.triton_options())[0],
    }


def document_summary(document: dict[str, Any]) -> str:
    """One DEBUG line of what a key covers: long parts as a digest prefix, so two lines for a
    surprising miss show which part differs."""
    parts = []
    for name, value in document.items():
        if name == "kernel" and isinstance(value, dict):
            text = f"{value.get('name')}@{str(value.get('fingerprint'))[:12]}"
        elif name == "signature" and isinstance(value, list):
            text = ",".join(f"{k}:{v}" for k, v in value if v != "constexpr")
        elif name == "target" and isinstance(value, dict):
            text = f"{value.get('backend')}:{value.get('arch')}"
        else:
            text = json.dumps(value, sort_keys=True, separators=(",", ":"))
            text = text if len(text) <= 24 else "#" + digest(value)[:10]
        parts.append(f"{name}={text}")
    return " ".join(parts)


KeyMemo = BoundedMemo[tuple[KernelSpec, str], str]  # (spec, toolchain text) -> content key
# a session's keys, 8192 of them (a model asks for the same ones on every trace)
_KEYS: SessionMemo[KeyMemo] = SessionMemo("compiler.key.keys", lambda _: BoundedMemo.of(8192))


def session_keys(session: Session) -> KeyMemo:
    """`session`'s memo of content keys (dropped with it by `configure()`), for `content_key`."""
    return _KEYS.of(session)


def content_key(spec: KernelSpec, keys: KeyMemo | None = None) -> str:
    """The content address of `spec`'s artifact. `keys` memoizes it by spec and toolchain fingerprint: a
    warm lowering asks for the same specs on every trace, and the document is the costly part."""
    if keys is None:
        return digest(key_document(spec))
    try:
        slot = (spec, _text(toolchain_fingerprint(spec.target)))
        key = keys.get(slot)
    except TypeError:  # a value the canonical encoding does not know: the document says which, or keys it
        return digest(key_document(spec))
    return key if key is not None else keys.remember(slot, digest(key_document(spec)))
