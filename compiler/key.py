"""The content key: the core's digest of a spec and its toolchain in the core's canonical encoding.

The encoding (`kernel_cache.canonical`) tags every value with its type, so the int 1, the float 1.0,
the bool True and the string "1" never collide; this module adds Triton's own values to it and the
document carries our own format version: bumping it invalidates every key at once.
"""

from __future__ import annotations

import json
from typing import Any

import kernel_cache
from kernel_cache.canonical import canonical as core_canonical
from kernel_cache.digest import digest, digest_text
from kernel_cache.digest import text as _text
from kernel_cache.display import echo

from . import triton_compat as tc
from .portable import portable
from .spec import KernelSpec
from .toolchain import toolchain_fingerprint

KEY_FORMAT_VERSION = 2  # 2: paths in options and Triton's environment stand for their content (compiler.portable)


def triton_value(value: Any) -> Any:
    """The tagged form of a value only Triton knows (the core's `canonical` extension): a @jit
    function passed as a constexpr, a triton.language dtype, a constexpr wrapper."""
    if tc.is_jit_function(value):
        return {"jit": tc.kernel_fingerprint(value)}
    if type(value).__name__ == "dtype" and hasattr(value, "name"):  # triton.language dtype
        return {"tl.dtype": str(value)}
    if type(value).__name__ == "constexpr" and hasattr(value, "value"):
        return canonical(value.value)
    raise TypeError(f"cannot build a cache key from {type(value).__name__}: {echo(value)}")


def canonical(value: Any) -> Any:
    """`kernel_cache.canonical` with Triton's values: what a content key encodes."""
    return core_canonical(value, triton_value)


def key_document(spec: KernelSpec, toolchain: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything the key covers, in canonical form (useful for debugging a surprising miss)."""
    parsed = tc.parse_options(spec.target, spec.triton_options())
    return {
        **_own_parts(spec),
        "options": _options_part(parsed),
        "target": spec.target.to_json(),
        "toolchain": portable(toolchain if toolchain is not None else toolchain_fingerprint(spec.target)),
    }


def _options_part(parsed: Any) -> Any:
    """Triton's parsed options, canonical, with every file they name by path standing for its content."""
    return canonical(portable(tc.options_to_json(parsed)))


def _own_parts(spec: KernelSpec) -> dict[str, Any]:
    """The parts of the key document that are the spec's own (the rest: options, target, toolchain)."""
    return {
        "format": KEY_FORMAT_VERSION,
        "kernel": {"name": spec.name, "fingerprint": tc.kernel_fingerprint(spec.kernel)},
        "signature": [[k, v] for k, v in spec.signature.items()],
        "constexprs": canonical(dict(spec.constexprs)),
        "attrs": canonical({repr(k): v for k, v in spec.attrs.items()}),
        "keep_ir": spec.keep_ir,
    }


def document_summary(document: dict[str, Any]) -> str:
    """One line naming what a key covers, for DEBUG logs: the kernel, target and signature as
    text, every other part as a digest prefix (so two lines for a surprising miss show which part
    differs), short parts as their JSON."""
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


_KEYS_LIMIT = 8192  # per memo: this session's keys by spec identity (a model asks for the same ones)
_PLAIN = (str, int, float, bool, bytes, type(None))


def content_key(spec: KernelSpec, toolchain: dict[str, Any] | None = None) -> str:
    """The 32-hex-digit content address of `spec`'s compiled artifact.

    Memoized per process: a warm lowering of a model asks for the same specs on every trace, and
    the key document (parsed options, canonical constexprs) costs ~1 ms to build. The memo is keyed
    by everything the document is built from, objects by identity (a redefined kernel or callee is
    a new object), and the toolchain fingerprint as it is now (Triton's environment included)."""
    tools = toolchain if toolchain is not None else toolchain_fingerprint(spec.target)
    ident = _identity(spec, tools)
    if ident is None:
        return digest(key_document(spec, tools))
    keys = kernel_cache.current_session().memo("compiler.key.keys", dict[tuple[Any, ...], str])
    key = keys.get(ident)
    if key is None:
        key = _digest_document(spec, tools)
        if len(keys) < _KEYS_LIMIT:
            keys[ident] = key
    return key


def _digest_document(spec: KernelSpec, tools: dict[str, Any]) -> str:
    """digest(key_document(spec, tools)), the same text hashed, with the parts most specs share (the
    parsed options and the target) encoded once per process. JSON encoding is compositional, so the
    spliced text equals the whole document's (a test checks)."""
    parsed = tc.parse_options(spec.target, spec.triton_options())
    texts = {name: _text(part) for name, part in _own_parts(spec).items()}
    texts["options"] = _shared_text(("options", id(parsed)), parsed, lambda: _options_part(parsed))
    texts["target"] = _shared_text(("target", spec.target), spec.target, spec.target.to_json)
    texts["toolchain"] = _text(portable(tools))
    return digest_text("{" + ",".join(f"{_text(name)}:{texts[name]}" for name in sorted(texts)) + "}")


def _shared_text(slot: Any, owner: Any, build: Any) -> str:
    """The canonical text of a part shared by many specs; `owner` is kept with it, so an object
    identified by id() cannot be freed and its id reused while the memo holds the text. Memoized
    per session, by the id or value of the part."""
    texts = kernel_cache.current_session().memo("compiler.key.texts", dict[Any, tuple[Any, str]])
    found = texts.get(slot)
    if found is None or found[0] is not owner:
        found = (owner, _text(build()))
        if len(texts) < _KEYS_LIMIT:
            texts[slot] = found
    return found[1]


def _identity(spec: KernelSpec, tools: dict[str, Any]) -> tuple[Any, ...] | None:
    try:
        ident = (spec.kernel, tc.kernel_fingerprint(spec.kernel), tuple(spec.signature.items()),
                 _frozen(spec.constexprs), _frozen({repr(k): v for k, v in spec.attrs.items()}),
                 _frozen(spec.triton_options()), spec.keep_ir, spec.target, _frozen(tools))
        hash(ident)
    except TypeError:  # an unhashable value somewhere: build the document every time
        return None
    return ident


def _frozen(mapping: Any) -> tuple[Any, ...]:
    return tuple(sorted(((str(k), (type(v), v) if isinstance(v, _PLAIN) else _frozen_value(v))
                         for k, v in dict(mapping).items()), key=lambda kv: kv[0]))


def _frozen_value(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(_frozen_value(v) if not isinstance(v, _PLAIN) else (type(v), v) for v in value))
    if isinstance(value, dict):
        return (dict, _frozen(value))
    return ("object", value)  # hashed by identity (JITFunctions, dtypes, ...); unhashable raises TypeError
