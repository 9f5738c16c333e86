"""What the cache's levels report, said as cachectl says things: one `cachectl: …` line, and for a
remote that does not answer, the fix for its cause (the one `cachectl doctor` gives).

The store warns a program once per cause, in Python's warning layout, with what the program does
meanwhile ("compiling and caching locally meanwhile", "try again in a few seconds"). cachectl
compiles nothing and runs once: its reads of the remote raise the fault instead, and each command
reports it with the fix.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import warnings
from collections.abc import Iterator
from typing import TextIO

from kernel_cache.telemetry.warnings_once import KernelCacheWarning

UNREACHABLE_FIX = "check the host, port and firewall, and that redis-server runs"
PASSWORD_FIX = "check KERNEL_CACHE_REMOTE_PASSWORD_FILE (or the URL's user:password)"
REMOTE = "remote cache "  # how every message of the remote level starts
# the remote's notes to a program on a fault that cachectl's own reads of it raise again (reported there)
_RAISED_AGAIN = ("; skipping ", " refused a write: ", " is migrating slots ")
_UNANSWERED = re.compile(r"no node answered|being skipped after an error|(?:Connection|Authentication|Timeout)Error"
                         r"|timed out \(no whole reply")
_ENDPOINT = re.compile(r"remote cache \S+(?: node \S+)?")
_RETRY = re.compile(r"; try again in (?:a few seconds|\d+ s)")  # a program's breaker, not a one-shot command's


def fix_for(text: str) -> str:
    """The fix for a remote that did not answer: its password when the server refused it, else the
    way to it. The endpoint named in `text` is not read (its user name may spell "auth")."""
    lowered = _ENDPOINT.sub("", text).lower()
    return PASSWORD_FIX if "auth" in lowered or "password" in lowered else UNREACHABLE_FIX


def without_retry(text: str) -> str:
    """`text` without the link's "try again in …": waiting is no fix for a wrong host or password."""
    return _RETRY.sub("", text)


def explained(message: str) -> str:
    """A level's failure as cachectl says it: a remote that did not answer, with the fix for its
    cause instead of "try again in …". Other messages (a key of another type, a read-only replica,
    writes refused: each says its own fix) and other levels' are kept as they are."""
    if not message.startswith(REMOTE) or not _UNANSWERED.search(message) or "; fix: " in message:
        return message
    return f"{without_retry(message)}; fix: {fix_for(message)}"


@contextlib.contextmanager
def in_cachectl_words() -> Iterator[None]:
    """KernelCacheWarnings printed as `cachectl: MESSAGE` while the command runs; the remote's notes
    on a fault that cachectl's reads raise again are left out here (the command says it, with the
    fix), and kept in prewarm's forked workers, which do compile and cache locally meanwhile."""
    command = os.getpid()
    with warnings.catch_warnings():
        other = warnings.showwarning

        def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: TextIO | None = None, line: str | None = None) -> None:
            if not issubclass(category, KernelCacheWarning):
                other(message, category, filename, lineno, file, line)
                return
            text = str(message)
            if os.getpid() == command and text.startswith(REMOTE) and any(n in text for n in _RAISED_AGAIN):
                return
            with contextlib.suppress(OSError):  # stderr closed: a warning must not fail the command
                print(f"cachectl: {text}", file=file or sys.stderr)

        warnings.showwarning = show
        yield
