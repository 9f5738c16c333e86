"""cachectl's command line as it is read: one-line errors that name an option as it was typed, and
the types of its arguments, each checked as the line is read (before a command opens a cache,
imports a module or looks for a GPU)."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from typing import Any, NoReturn

from cachectl.context import CliError
from kernel_cache.sanitize import echo
from kernel_cache.settings.config import ConfigError, parse_duration, parse_size


class Parser(argparse.ArgumentParser):
    """One-line errors, not a usage dump, with a suggestion and the help page of the command at fault."""

    _given: list[str] = []  # the words this parser reads, to name an option as they spell it

    def error(self, message: str) -> NoReturn:
        match = re.search(r"^(?:argument (\S+): )?invalid choice: '([^']*)' \(choose from (.*)\)", message)
        message = re.sub(r"argument (-[^\s:]+)", lambda m: "argument " + self._as_typed(m.group(1)), message)
        if match:
            option, value, listed = match.groups()
            option = option and self._as_typed(option, value)
            choices = re.findall(r"'([^']*)'", listed) or [c.strip() for c in listed.split(",")]
            close = difflib.get_close_matches(value, choices, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; one of: {', '.join(choices)}"
            what = "command" if option in (None, "COMMAND") else f"value for {option}"
            raise CliError(f"unknown {what} '{value}'{hint} (see '{self.prog} --help')")
        raise CliError(f"{message} (see '{self.prog} --help')")

    def _as_typed(self, names: str, value: str | None = None) -> str:
        """Of an option's names ('--level/--tier', '-j/--jobs'), the one the command line used (the
        last, or the one given `value`; an abbreviation read as the name it stands for), else its
        first long name."""
        spelled = names.split("/")
        found = None
        for at, word in enumerate(self._given):
            typed, equals, given = word.partition("=")
            longer = [name for name in spelled if typed.startswith("--") and name.startswith(typed)]
            name = typed if typed in spelled else longer[0] if len(longer) == 1 else None
            if name is None:
                continue
            if not equals:
                given = self._given[at + 1] if at + 1 < len(self._given) else ""
            if value is None or given == value or found is None:
                found = name
        return found or next((name for name in spelled if name.startswith("--")), spelled[0])

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[Any, list[str]]:
        self._given = list(sys.argv[1:] if args is None else args)
        parsed, extra = super().parse_known_args(args, namespace)
        command = getattr(parsed, "command", None)
        if extra and command and self.prog == "cachectl":  # name the subcommand whose options were wrong
            raise CliError(f"unrecognized arguments: {' '.join(echo(a) for a in extra)} "
                           f"(see 'cachectl {command} --help')")
        return parsed, extra


def size(text: str) -> int:
    try:
        return parse_size(text, "size")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("size: ")) from None


def duration(text: str) -> float:
    """An age with its unit: a bare `30` is refused (read as seconds it selects every entry minutes old)."""
    try:
        return parse_duration(text, "age")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("age: ")) from None


def arch_list(text: str) -> list[str]:
    arches = [a.strip() for a in text.split(",") if a.strip()]
    if not arches:
        raise argparse.ArgumentTypeError("expected a comma-separated list like sm_80,sm_90")
    return arches


def count(text: str) -> int:
    return _at_least(0, text, "a number >= 0")


def positive(text: str) -> int:
    return _at_least(1, text, "a positive number")


def _at_least(lowest: int, text: str, what: str) -> int:
    """Every refusal says what is expected, whatever was given (0, -5, 'x')."""
    try:
        value = int(text)
    except ValueError:
        value = lowest - 1
    if value < lowest:
        raise argparse.ArgumentTypeError(f"expected {what}, got {echo(text)}")
    return value


def jobs(text: str) -> int:
    return _at_least(1, text, "a positive number of compiles at once")


def program(text: str) -> str:
    """MODULE:FUNCTION, its form checked as the command line is read: before tune looks for a GPU or
    prewarm opens the cache, and before anything is imported."""
    module, sep, function = text.partition(":")
    if sep and dotted(module) and dotted(function):
        return text
    path = "; a module name, not a file path" if "/" in module or module.endswith(".py") else ""
    raise argparse.ArgumentTypeError(f"expected a function in an importable module, as MODULE:FUNCTION "
                                     f"(e.g. myjob.programs:tuned_calls{path}), got {echo(text)}")


def dotted(name: str) -> bool:
    return bool(name) and all(part.isidentifier() for part in name.split("."))
