"""The "Exit codes" table of cachectl's reference is what cachectl does: every example it shows is run here.

The table is parsed from docs/cachectl.md; each row's examples (`cachectl ...` in its last column, with
optional VAR=value settings before) run through cachectl's main() in a fresh copy of a small
workspace: a cache of three synthetic entries (KERNEL_CACHE_DIR), a cache with a corrupt entry
(`damaged`), good, truncated and mixed bundles, files that are no bundle, a directory that is no
cache, a signing key. A row without an example must be one of NOT_REPRODUCED, with the reason it
cannot run on a CPU-only machine; every cachectl command must have rows.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest
from conftest import GPUS, ROOT
from test_cli_reference import subcommands
from test_import_fate import KEYS, TARGET, cut_bundle, entry_bytes, foreign_files, good_bundle

import kernel_cache
from cachectl.main import main
from cachectl.move.bundle_file import export_bundle
from kernel_cache import Config, Entry, Store

REFERENCE = (ROOT / "docs" / "cachectl.md").read_text()

# (command, code) of rows that name no example, and why they cannot be reproduced here
NOT_REPRODUCED = {
    ("any", 130): "an interrupt (Ctrl-C) mid-command",
    ("prune", 1): "an entry this user cannot remove (another owner, a read-only mount): tests run as root",
    ("clear", 1): "an entry this user cannot remove (another owner, a read-only mount): tests run as root",
    ("tune", 0): "a GPU (tests/gpu/test_gpu_tuning.py)",
    ("tune", 1): "a GPU on which every config of a call site fails",
}


def exit_code_rows() -> list[tuple[str, int, str, list[str]]]:
    """(command, code, when, [example command lines]) per row of docs/cachectl.md's Exit codes table."""
    section = REFERENCE[REFERENCE.index("\n## Exit codes\n"):]
    section = section[:section.index("\n#", 2)]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| ") else []
        if len(cells) != 4 or cells[0] == "command":
            continue
        command, code, when, examples = cells
        rows.append((command.strip("`"), int(code), when,
                     re.findall(r"`((?:[A-Z_]+=\S+ )*cachectl [^`]*)`", examples)))
    assert rows, "docs/cachectl.md has no Exit codes table"
    return rows


ROWS = exit_code_rows()
EXAMPLES = [pytest.param(command, code, example, id=example)
            for command, code, _, examples in ROWS for example in examples]


def test_the_table_covers_every_command_and_every_row_is_checked():
    commands = set(subcommands())
    named = {command for command, *_ in ROWS}
    assert named - {"any"} <= commands, f"rows for commands cachectl does not have: {sorted(named - commands)}"
    assert commands <= named, f"commands without a row in docs/cachectl.md's Exit codes table: {sorted(commands - named)}"
    bare = {(command, code) for command, code, _, examples in ROWS if not examples}
    assert bare == set(NOT_REPRODUCED), (
        "every row needs an example this test runs, or an entry in NOT_REPRODUCED saying why it cannot run here")
    assert {code for _, code, *_ in ROWS} <= {0, 1, 2, 130}


# The workspace ----------------------------------------------------------------------------------------
def _entry(key: str, **meta) -> Entry:
    return Entry(key=key, meta={"name": "synthetic_kernel", "kernel": "synthetic_kernel", "arch": "sm_90",
                                "created": 1.7e9, "target": TARGET, "toolchain": {"summary": "triton-0.0.0+x"},
                                **meta}, blobs={"cubin": bytes(range(256)) * 8})


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("exit-codes")
    store = Store(Config(dir=root / "cache"))
    store.put(_entry(KEYS[0], recipe={"kernel": "json:loads", "target": TARGET}))  # prewarm cannot build it
    for key in KEYS[1:3]:
        store.put(_entry(key))
    store.close()

    damaged = Store(Config(dir=root / "damaged"))
    damaged.put(_entry(KEYS[3]))
    tampered = bytearray(entry_bytes(KEYS[4]))
    tampered[-1] ^= 1
    damaged.close()
    (root / "damaged" / "entries" / KEYS[4][:2]).mkdir(exist_ok=True)
    (root / "damaged" / "entries" / KEYS[4][:2] / KEYS[4]).write_bytes(bytes(tampered))  # damaged in place

    warm = good_bundle(root / "warm.kcb")
    cut_bundle(warm, root / "cut.kcb", entry=3)
    bad = bytearray(entry_bytes(KEYS[1]))
    bad[-1] ^= 1
    export_bundle(root / "mixed.kcb", [(KEYS[0], entry_bytes(KEYS[0]), {}), (KEYS[1], bytes(bad), {})])
    foreign_files(root)
    (root / "my-project").mkdir()
    (root / "my-project" / "train.py").write_text("import jax\n")
    key = root / "team.key"
    key.write_text("exit-codes-signing-key-0123456789\n")
    key.chmod(0o600)
    return root


@pytest.mark.parametrize("command, code, example", EXAMPLES)
def test_the_example_exits_with_the_code_the_readme_gives(workspace, tmp_path, monkeypatch, capsys,
                                                          command, code, example):
    if command == "tune" and GPUS:
        pytest.skip("needs a host without a GPU: on this GPU host `tune` runs instead of refusing")
    here = tmp_path / "ws"
    shutil.copytree(workspace, here)
    monkeypatch.chdir(here)
    monkeypatch.setenv("KERNEL_CACHE_DIR", str(here / "cache"))
    monkeypatch.setattr(kernel_cache, "_default", None)  # a process store a command makes is dropped after it
    words = shlex.split(example)
    while words[0] != "cachectl":
        name, _, value = words.pop(0).partition("=")
        monkeypatch.setenv(name, value)
    try:
        got = main(words[1:])
    finally:
        if kernel_cache._default is not None:
            kernel_cache._default.close()
    out = capsys.readouterr()
    assert got == code, f"`{example}` ({command}) exited {got}, docs/cachectl.md says {code}\n{out.out}\n{out.err}"
    if code == 2 or (code == 1 and command != "doctor"):  # doctor names its problems in its report
        assert out.err.strip(), f"`{example}` exited {got} without a reason on stderr"
