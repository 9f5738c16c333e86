"""The product says what is, not how it came to be: no issue numbers, commit hashes or rounds of work in
the code, its comments and docstrings, the tests (names and docstrings included), the scripts, the
README or docs/. Git and the issue tracker keep the history.

Not history, so allowed: another project's pull request or issue named with that project ("jax
#35218", "jax PR #35218", "owner/repo#12"), and hexadecimal words that are no commit (keys, digests).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import ROOT

CODE_DIRS = ("kernel_cache", "cachectl", "compiler", "lowering", "scripts", "tests")
ISSUE = re.compile(r"\bissues? #?\d+", re.I)  # "issue 29", "Issue 20's", "issue #7"
ROUND = re.compile(r"\bround \d+", re.I)  # "round 3" of a piece of work
NUMBER_REF = re.compile(r"(?<![\w/&])#\d{2,}\b")  # "(#27)", "see #31"; not "a/b#27" nor "&#123;"
UPSTREAM = re.compile(r"\b(jax|jaxlib|triton|jax-triton|redis|redis-py|diskcache|cpython|python|pr|pull)\s*$", re.I)
COMMIT = re.compile(r"\b(commit(s|ted)?|revision|rev|cherry-picked|reverted)\b[^\n]{0,40}?\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)"
                    r"[0-9a-f]{7,40}\b|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b[^\n]{0,20}?\bcommit", re.I)


def history(text: str) -> list[str]:
    """Every mention of history in `text`, as found."""
    found = [m.group(0) for pattern in (ISSUE, ROUND, COMMIT) for m in pattern.finditer(text)]
    for m in NUMBER_REF.finditer(text):
        line_start = text.rfind("\n", 0, m.start()) + 1
        if not UPSTREAM.search(text[line_start:m.start()]):
            found.append(m.group(0))
    return found


def code_files() -> list[Path]:
    """The Python files of the product, its scripts and its tests (this one aside: its examples are
    history on purpose), and the shell scripts beside them."""
    files = [p for d in CODE_DIRS for p in sorted((ROOT / d).rglob("*.py"))
             if "__pycache__" not in p.parts and p != Path(__file__).resolve()]
    return files + sorted((ROOT / "scripts").rglob("*.sh")) + sorted((ROOT / "tests").rglob("*.sh")) + [ROOT / ".ci" / "run"]


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def found_in(paths: list[Path]) -> list[tuple[str, int, str]]:
    """(path, line, mention) for every mention of history in `paths`."""
    found = []
    for path in paths:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found += [(str(path.relative_to(ROOT)), n, mention) for mention in history(line)]
    return found


@pytest.mark.parametrize("text", [
    "the remote scaled out (issue 29)", "Issue 20's polish list", "fixed in issue #7", "see #31.", "(#27)",
    "round 3 of the work", "as of commit 26d6d10", "a90a2dd7 (the commit that", "reverted in 9218b69",
])
def test_each_kind_of_history_is_found(text):
    assert history(text), text


@pytest.mark.parametrize("text", [
    "jaxlib corrupts aliased inputs (jax #35218)", "a bug fix, jax PR #35218", "jax-ml/jax#35218",
    'KEY = "0123456789abcdef0123456789abcdef"', "the content key 6f37a1b2 of a kernel", "round-trips", "rounds=5",
    "# per round, the value", "&#123;", "a 16-char hex digest",
])
def test_what_is_no_history_is_not_found(text):
    assert not history(text), text


def test_no_history_in_the_code_tests_or_scripts():
    found = found_in(code_files())
    assert not found, "\n".join(f"{path}:{n}: {mention}" for path, n, mention in found)


def test_no_history_in_the_readme_or_docs():
    """Beside the marks above, documents compare with no earlier code: their figures are current."""
    found = found_in(documents())
    compared = re.compile(r"\bbefore this change\b|\bearlier code\b|\(was [^)]*\)", re.I)
    found += [(str(p.relative_to(ROOT)), 0, m.group(0)) for p in documents() for m in compared.finditer(p.read_text())]
    assert not found, "\n".join(f"{path}:{n}: {mention}" for path, n, mention in found)
