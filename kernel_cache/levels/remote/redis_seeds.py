"""Where the remote level may connect first: the URLs KERNEL_CACHE_REMOTE lists (one server, or
nodes of one Redis Cluster, separated by commas), checked when the configuration is read, and every
address a host name resolves to (a managed cluster's DNS name gives several).

No redis-py here: configuration is checked in every process. A URL redis-py could not parse is
refused saying what is wrong, never with the URL's secrets in the message.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import threading
from urllib.parse import parse_qsl, unquote, urlsplit

from kernel_cache.errors import KernelCacheError

SCHEMES = ("redis", "rediss", "unix")
DEFAULT_PORT = 6379
RESOLVE_SECONDS = 2.0  # the longest a host name's lookup may take (the resolver has no deadline of its own)
SUBSTRING_CHARS = 8  # a secret this long is hidden wherever it appears in server text
MAX_ADDRESSES = 16  # addresses of one name tried as seeds
# a comma starts a new URL only where a scheme follows: an unencoded comma in a password stays put
_SPLIT = re.compile(r",\s*(?=(?:redis|rediss|unix)://)", re.IGNORECASE)
_INT_OPTIONS = frozenset({"db", "max_connections", "protocol"})
_FLOAT_OPTIONS = frozenset({"socket_timeout", "socket_connect_timeout", "health_check_interval", "timeout"})


class BadRemoteUrl(KernelCacheError, ValueError):
    """A KERNEL_CACHE_REMOTE URL that cannot be used: the message says what, without its secrets."""


def split_urls(text: str) -> list[str]:
    """The URLs of a KERNEL_CACHE_REMOTE value, in order, blanks dropped."""
    return [part.strip() for part in _SPLIT.split(text.strip()) if part.strip()]


def check_url(url: str) -> None:
    """Raise BadRemoteUrl naming what redis-py would refuse or misread in `url`."""
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme not in SCHEMES:
        raise BadRemoteUrl("no Redis URL (redis://host:port/db, rediss:// for TLS, unix:///path/redis.sock)")
    parts = urlsplit(url)
    if "@" in (parts.path + parts.query + parts.fragment) and "@" not in parts.netloc:
        raise BadRemoteUrl("a password holding '/', '?' or '#' must be percent-encoded (%2F, %3F, %23)")
    for piece, what in ((parts.username, "user name"), (parts.password, "password")):
        if piece and re.search(r"%(?![0-9A-Fa-f]{2})", piece):
            raise BadRemoteUrl(f"a '%' in the {what} must be followed by two hex digits (write '%' as %25)")
    if scheme == "unix":
        if not parts.path:
            raise BadRemoteUrl("a unix:// URL names the socket's path (unix:///run/redis.sock)")
    else:
        if not parts.hostname:
            raise BadRemoteUrl("no host (redis://host:port/db)")
        try:
            port = parts.port  # raises on a port that is no number or out of range
        except ValueError:
            port = 0
        if port == 0:
            given = parts.netloc.rpartition("@")[2].rpartition(":")[2]
            raise BadRemoteUrl(f"the port must be a number from 1 to 65535 (given: {given[:12]!r})")
        db = parts.path.lstrip("/")
        if db and not db.isdigit():
            raise BadRemoteUrl(f"the database after the host must be a number (given: {db[:12]!r})")
    _check_options(parts.query)


def _check_options(query: str) -> None:
    try:
        options = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise BadRemoteUrl("the query must be name=value pairs joined by '&'") from None
    for name, value in options:
        if "password" in name.lower() or name.lower() == "username":
            continue
        if name in _INT_OPTIONS and not value.isdigit():
            raise BadRemoteUrl(f"option {name} must be a whole number (given: {value[:12]!r})")
        if name in _FLOAT_OPTIONS:
            try:
                float(value)
            except ValueError:
                raise BadRemoteUrl(f"option {name} must be a number of seconds (given: {value[:12]!r})") from None


def secrets_of(url: str, password: str | None = None) -> list[str]:
    """Every credential `url` carries (user name, password, any option naming a password), as
    written and percent-decoded, plus a password given apart: what server text must never show."""
    found = [password] if password else []
    parts = urlsplit(url)
    found += [p for p in (parts.username, parts.password) if p]
    try:
        options = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        options = []
    found += [value for name, value in options if value and ("password" in name.lower() or name.lower() == "username")]
    out = set(found) | {unquote(s) for s in found}
    return sorted((s for s in out if s), key=len, reverse=True)


def scrubbed(text: str, secrets: list[str]) -> str:
    """`text` (a server's words) with every secret shown as ***, longest first: a secret of
    SUBSTRING_CHARS or more wherever it appears, a shorter one (a user name such as `kc`) where it
    stands as a word of its own, so the words around it stay readable."""
    for secret in secrets:
        if len(secret) >= SUBSTRING_CHARS:
            text = text.replace(secret, "***")
        else:
            text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", "***", text)
    return text


def seeds(urls: list[str], resolve_seconds: float = RESOLVE_SECONDS) -> list[str]:
    """The URLs to try in order: each redis:// URL once per address its host resolves to (a name
    that does not resolve within `resolve_seconds` is kept as it is, and fails when connected);
    rediss:// keeps its host name (the certificate names it), unix:// its path."""
    out: list[str] = []
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme.lower() != "redis" or not parts.hostname:
            out.append(url)
            continue
        port = parts.port or DEFAULT_PORT
        userinfo = parts.netloc.rpartition("@")[0]
        for address in _addresses(parts.hostname, port, resolve_seconds):
            host = f"[{address}]" if ":" in address else address
            netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
            out.append(parts._replace(netloc=netloc).geturl())
    return list(dict.fromkeys(out))


def _addresses(host: str, port: int, seconds: float) -> list[str]:
    """The addresses `host` resolves to, in the resolver's order (an address literal: itself)."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    found: list[str] = []

    def lookup() -> None:
        try:
            for *_, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
                found.append(str(sockaddr[0]))
        except OSError:
            pass
    worker = threading.Thread(target=lookup, daemon=True, name="kernel-cache-resolve")
    worker.start()
    worker.join(seconds)
    addresses = list(dict.fromkeys(found[:]))[:MAX_ADDRESSES] if not worker.is_alive() else []
    return addresses or [host]
