"""KERNEL_CACHE_REMOTE, read once for every reader of it: the URLs it lists (one server, or nodes of
one Redis Cluster, separated by commas), checked and parsed (`RemoteUrl`), and shown with their
credentials hidden (`redacted`). No redis-py here: configuration is checked in every process. A URL
redis-py could not parse is refused with what is wrong, never with its secrets in the message.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote, unquote_plus, urlsplit

from kernel_cache.errors import KernelCacheError

SCHEMES = ("redis", "rediss", "unix")
DEFAULT_PORT = 6379
# a comma starts a new URL only where a scheme follows: an unencoded comma in a password stays put
_SPLIT = re.compile(r",(?=\s*(?:redis|rediss|unix)://)", re.IGNORECASE)
_QUERY_PARAM = r"[?&;]([^?&;=]*)=(?=([^&;]*))"  # a query option: its name, then (looked at) its value
_INT_OPTIONS = frozenset({"db", "max_connections", "protocol"})
_FLOAT_OPTIONS = frozenset({"socket_timeout", "socket_connect_timeout", "health_check_interval", "timeout"})


class BadRemoteUrl(KernelCacheError, ValueError):
    """A KERNEL_CACHE_REMOTE URL that cannot be used: the message says what, without its secrets."""


def split_urls(text: str) -> list[str]:
    """The URLs of a KERNEL_CACHE_REMOTE value, in order, blanks dropped."""
    return [part.strip() for part in _SPLIT.split(text.strip()) if part.strip()]


def _secret(name: str) -> bool:
    """Whether a query option carries a credential (redis-py's `username=`, any `*password*`)."""
    name = name.strip().lower()
    return "password" in name or name == "username"


class RemoteUrl:
    """One URL of the setting, split as redis-py splits it (BadRemoteUrl where it would refuse it)."""

    def __init__(self, url: str):
        self.scheme = url.partition("://")[0].lower() if "://" in url else ""
        if self.scheme not in SCHEMES:
            raise BadRemoteUrl("no Redis URL (redis://host:port/db, rediss:// for TLS, unix:///path/redis.sock)")
        try:
            self.parts = parts = urlsplit(url)
        except ValueError:  # an unclosed '[' of an IPv6 host
            raise BadRemoteUrl("the host cannot be read (an IPv6 address is written [::1])") from None
        if "@" in (parts.path + parts.query + parts.fragment) and "@" not in parts.netloc:
            raise BadRemoteUrl("a password holding '/', '?' or '#' must be percent-encoded (%2F, %3F, %23)")
        try:
            self.options = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
        except ValueError:
            raise BadRemoteUrl("the query must be name=value pairs joined by '&'") from None
        self.username, self.password = _credential(parts.username, "user name"), _credential(parts.password, "password")
        self.host, self.port, self.path, db = parts.hostname or "localhost", 0, None, ""
        if self.scheme == "unix":
            if not parts.path:
                raise BadRemoteUrl("a unix:// URL names the socket's path (unix:///run/redis.sock)")
            self.path = unquote(parts.path)
        else:
            if not parts.hostname:
                raise BadRemoteUrl("no host (redis://host:port/db)")
            try:
                self.port = parts.port or DEFAULT_PORT  # raises on a port that is no number or out of range
            except ValueError:
                given = parts.netloc.rpartition("@")[2].rpartition(":")[2]
                raise BadRemoteUrl(f"the port must be a number from 1 to 65535 (given: {given[:12]!r})") from None
            if parts.port == 0:
                raise BadRemoteUrl("the port must be a number from 1 to 65535 (given: '0')")
            db = parts.path.lstrip("/")
            if db and not db.isdigit():
                raise BadRemoteUrl(f"the database after the host must be a number (given: {db[:12]!r})")
        _check_options(self.options)
        db = dict(self.options).get("db", db)
        self.db = int(db) if db else 0


def _credential(piece: str | None, what: str) -> str | None:
    if piece and re.search(r"%(?![0-9A-Fa-f]{2})", piece):
        raise BadRemoteUrl(f"a '%' in the {what} must be followed by two hex digits (write '%' as %25)")
    return unquote(piece) if piece else None


def _check_options(options: list[tuple[str, str]]) -> None:
    for name, value in options:
        if name in _INT_OPTIONS and not value.isdigit():
            raise BadRemoteUrl(f"option {name} must be a whole number (given: {value[:12]!r})")
        if name in _FLOAT_OPTIONS:
            try:
                float(value)
            except ValueError:
                raise BadRemoteUrl(f"option {name} must be a number of seconds (given: {value[:12]!r})") from None


def secrets_of(urls: list[str], password: str | None = None) -> list[str]:
    """Every credential `urls` carry, as written and percent-decoded, plus a password given apart:
    what server text must never show (longest first)."""
    found = []
    for url in urls:
        try:
            parsed = RemoteUrl(url)
        except BadRemoteUrl:
            continue
        found += [p for p in (parsed.parts.username, parsed.parts.password) if p]
        found += [value for name, value in parsed.options if value and _secret(name)]
    return sorted({*found, *map(unquote, found), *([password] if password else [])}, key=len, reverse=True)


def redacted(url: str) -> str:
    """Server URLs with their credentials shown as *** (`redis://kc:***@host:6379/2`). It reads the
    text, not `RemoteUrl`'s parse: it must take any text without raising. redis-py takes as
    credentials everything before the last '@' of the network location (a password may hold '@' and
    ':') and the query's `username=` and `*password*` options: those are hidden first (their values
    may hold '@'), then everything from `//` to the last '@' but a user name before ':' (hidden too
    where '/', '?' or '#' comes before that '@')."""
    return ",".join(_redacted_one(part) for part in _SPLIT.split(url))


def _redacted_one(url: str) -> str:
    out, pos = [], 0
    for m in re.finditer(_QUERY_PARAM, url):
        if m.start() >= pos and _secret(unquote_plus(m.group(1))):
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
