"""cachectl's parser, its reference (docs/cachectl.md) and the --json documents agree.

The parser is the source: every command and option it has is in docs/cachectl.md, every command is
in the README's quick reference, every `$ cachectl ...` line the README or a page of docs/ shows
parses, and every field a --json document carries is named in docs/cachectl.md's "JSON output" table.
"""

from __future__ import annotations

import argparse
import re
import shlex

import pytest
from conftest import ROOT

from cachectl.inventory import EntryInfo
from cachectl.main import build_parser

README = (ROOT / "README.md").read_text()
REFERENCE = (ROOT / "docs" / "cachectl.md").read_text()
SECTION = REFERENCE  # the whole page is cachectl's reference
QUICK = README[README.index("## cachectl quick reference"):]
QUICK = QUICK[:QUICK.index("\n## ")]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMON = {"--dir", "--shared-dir", "--remote", "--json", "--quiet", "--verbose", "--help", "--version"}


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_every_command_and_option_is_in_the_reference(name):
    sub = subcommands()[name]
    assert re.search(rf"cachectl[^\n]*\b{name}\b", SECTION), f"docs/cachectl.md never shows `cachectl {name}`"
    assert re.search(rf"cachectl[^\n]*\b{name}\b", QUICK), f"README's cachectl quick reference never names `cachectl {name}`"
    options = {o for a in sub._actions for o in a.option_strings if o.startswith("--")} - COMMON
    missing = sorted(o for o in options if o not in SECTION)
    assert not missing, f"cachectl {name}: docs/cachectl.md does not mention {missing}"


def readme_command_lines() -> list[str]:
    """Every `$ cachectl ...` line in a text or bash block of the README or a page of docs/."""
    lines = []
    for path in DOCUMENTS:
        for block in re.findall(r"```(?:text|bash)\n(.*?)```", path.read_text(), re.S):
            for line in block.splitlines():
                if line.startswith("$ cachectl "):
                    lines.append(line[2:].split("  #")[0].strip())
    return lines


def test_the_reference_shows_commands():
    shown = readme_command_lines()
    assert len(shown) >= 20 and {shlex.split(line)[1] for line in shown} >= {"list", "prewarm", "tune", "export"}, shown


@pytest.mark.parametrize("line", readme_command_lines())
def test_every_command_the_readme_shows_parses(line):
    args = shlex.split(line)[1:]
    build_parser().parse_args(args)  # raises CliError (exit 2) on anything the parser does not know


def documented_fields(command: str) -> set[str]:
    table = REFERENCE[REFERENCE.index("\n## JSON output\n"):]
    row = re.search(rf"^\| `{command}[^`]*` \| (.*?) \|$", table, re.M)
    assert row, f"docs/cachectl.md's JSON output table has no row for {command}"
    return set(re.findall(r"`([a-z_]+)`", row.group(1)))


def test_list_entry_fields_are_documented():
    fields = set(EntryInfo(key="", level="", kernel="", arch="", size_bytes=0, created=0, last_used=0).to_json())
    assert fields <= documented_fields("list"), sorted(fields - documented_fields("list"))
