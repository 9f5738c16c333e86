"""How text from outside (a name found in a cache directory, an environment variable's value) is put
into output: escaped, so a planted name cannot start a line of its own or send raw bytes to a
terminal, and cut, so a huge value cannot flood every log line that mentions it."""

from __future__ import annotations

import os
import re
from urllib.parse import unquote_plus

ECHO_CHARS = 60  # how much of a value a message repeats
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}
# a query parameter: its name, then (looked at, not consumed: `?db=0?password=x` is two) its value
_NEXT_URL = r"(?i),(?=\s*(?:redis|rediss|unix)://)"  # where a comma starts another URL
_QUERY_PARAM = r"[?&;]([^?&;=]*)=(?=([^&;]*))"  # compiled by `re` at its first use (a URL shown)


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


def redacted(url: str) -> str:
    """Server URLs with their credentials shown as *** (`redis://kc:***@host:6379/2`), for messages,
    `cachectl config`, `stats` and `doctor`; several URLs separated by commas are hidden one by one
    (a comma starts a URL only where a scheme follows it). redis-py takes as credentials everything
    before the last '@' of the network location (a password may hold '@' and ':'; a bare
    `name@host` is one too) and query options: `username=` and any name holding `password`
    (`ssl_password=`, `ssl_keyfile_password=`). The query's are hidden first, since their values may
    hold '@', then everything from `//` to the last '@' left but a user name before ':' (a URL with
    '/', '?' or '#' before that '@' does not parse as meant: its name is hidden too). Any text is
    accepted; nothing raises."""
    return ",".join(_redacted_one(part) for part in re.split(_NEXT_URL, url))


def _redacted_one(url: str) -> str:
    out, pos = [], 0
    for m in re.finditer(_QUERY_PARAM, url):
        name = unquote_plus(m.group(1)).strip().lower()
        if m.start() >= pos and ("password" in name or name == "username"):
            out += [url[pos:m.end()], "***"]
            pos = m.end() + len(m.group(2))
    text = "".join(out) + url[pos:]
    at = text.rfind("@")
    if at < 0:
        return text
    start = text.find("//", 0, at) + 2 if "//" in text[:at] else 0
    name, colon, _ = text[start:at].partition(":")
    shown = f"{name}:" if colon and not re.search("[/?#]", text[start:at]) else ""
    return f"{text[:start]}{shown}***{text[at:]}"
