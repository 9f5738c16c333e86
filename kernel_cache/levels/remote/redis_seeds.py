"""Where the remote level may connect first: the URLs KERNEL_CACHE_REMOTE lists
(`kernel_cache.settings.remote_url`) and every address a host name resolves to (a managed cluster's
DNS name gives several); and server text with the URLs' secrets hidden.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import threading

from kernel_cache.settings.remote_url import DEFAULT_PORT, RemoteUrl

RESOLVE_SECONDS = 2.0  # the longest a host name's lookup may take (the resolver has no deadline of its own)
SUBSTRING_CHARS = 8  # a secret this long is hidden wherever it appears in server text
MAX_ADDRESSES = 16  # addresses of one name tried as seeds


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


def seeds(urls: list[str]) -> list[str]:
    """The URLs to try in order: each redis:// URL once per address its host resolves to (a name
    that does not resolve within RESOLVE_SECONDS is kept as it is, and fails when connected);
    rediss:// keeps its host name (the certificate names it), unix:// its path."""
    out: list[str] = []
    for url in urls:
        parts = RemoteUrl(url).parts
        if parts.scheme.lower() != "redis" or not parts.hostname:
            out.append(url)
            continue
        port = parts.port or DEFAULT_PORT
        userinfo = parts.netloc.rpartition("@")[0]
        for address in _addresses(parts.hostname, port):
            host = f"[{address}]" if ":" in address else address
            netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
            out.append(parts._replace(netloc=netloc).geturl())
    return list(dict.fromkeys(out))


def _addresses(host: str, port: int) -> list[str]:
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
    worker.join(RESOLVE_SECONDS)
    addresses = list(dict.fromkeys(found[:]))[:MAX_ADDRESSES] if not worker.is_alive() else []
    return addresses or [host]
