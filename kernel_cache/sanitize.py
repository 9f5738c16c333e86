"""How text from outside (a name found in a cache directory, an environment variable's value) is put
into output: escaped, so a planted name cannot start a line of its own or send raw bytes to a
terminal, and cut, so a huge value cannot flood every log line that mentions it."""

from __future__ import annotations

import os

ECHO_CHARS = 60  # how much of a value a message repeats
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def escaped(text: str | os.PathLike[str]) -> str:
    """`text` as one line of printable characters: control and format characters written as
    escapes (\\n, \\x1b, \\u202e), bytes that were not UTF-8 (surrogate-escaped by os) as \\xNN,
    a backslash doubled so an escape cannot be forged. Plain names come back unchanged."""
    text = os.fspath(text)
    if text.isprintable() and "\\" not in text:
        return text  # the common case, one pass
    out = []
    for ch in text:
        code = ord(ch)
        if ch in _NAMED:
            out.append(_NAMED[ch])
        elif 0xDC80 <= code <= 0xDCFF:  # os.fsdecode's surrogateescape: a raw byte of the name
            out.append(f"\\x{code - 0xDC00:02x}")
        elif ch.isprintable():
            out.append(ch)
        elif code < 0x100:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "".join(out)


def echo(value: object, limit: int = ECHO_CHARS) -> str:
    """A value quoted for a message: escaped and, past `limit` characters, cut with its length
    ('jax_triton,aaaa…' (100000 chars))."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return f"'{escaped(text)}'"
    return f"'{escaped(text[:limit])}…' ({len(text)} chars)"
