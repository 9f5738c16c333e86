"""cachectl's entry point: the argument parser and the dispatch to one command module.

Exit codes: 0 success; 1 the command ran but found or left problems (bad entries, failed builds,
rejected bundle entries); 2 it could not run (bad argument, missing directory, unknown key).
Command modules are imported when their command runs: `cachectl list` must not pay for importing
Triton and JAX, which only prewarm and the stale checks need.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from cachectl import arguments, notices
from cachectl.context import EXIT_OK, EXIT_PROBLEMS, JSON_SCHEMA, CliError, Context
from cachectl.inventory import SORT_KEYS
from kernel_cache.errors import LevelUnavailable


def _version() -> str:
    try:
        return importlib.metadata.version("kernel-cache")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    common = arguments.Parser(add_help=False)
    common.add_argument("--dir", type=Path, default=argparse.SUPPRESS,
                        help="cache directory (default: $KERNEL_CACHE_DIR)")
    common.add_argument("--shared-dir", type=Path, default=argparse.SUPPRESS,
                        help="shared multi-node cache directory (default: $KERNEL_CACHE_SHARED_DIR)")
    common.add_argument("--remote", default=argparse.SUPPRESS, metavar="URL",
                        help="Redis remote cache (default: $KERNEL_CACHE_REMOTE)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print machine-readable JSON")
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="print only data and errors")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="print more detail (full keys, skipped kernels)")

    parser = arguments.Parser(prog="cachectl", parents=[common],
                     description="Inspect, bound, verify and prewarm a kernel-cache directory. Sizes are "
                                 "binary (1 KiB = 1024 bytes).",
                     epilog="exit codes: 0 ok, 1 problems found or left, 2 cannot run")
    parser.add_argument("--version", action="version", version=f"cachectl (kernel-cache) {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=arguments.Parser, required=True)

    def command(name: str, handler: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help_text, description=help_text)
        p.set_defaults(handler=handler)
        return p

    def filters(p: argparse.ArgumentParser, destructive: bool = False) -> None:
        p.add_argument("--kernel", metavar="GLOB", help="kernel name (glob, e.g. 'matmul*')")
        p.add_argument("--arch", type=arguments.arch_list, metavar="ARCHES", help="target arch(es), e.g. sm_90,sm_80")
        p.add_argument("--older-than", type=arguments.duration, metavar="AGE", help="not used for AGE (e.g. 30d, 12h)")
        p.add_argument("--stale", action="store_true", help="built by another toolchain than the installed one")
        _level_option(p, destructive)

    p = command("list", "see.listing.cmd_list", "list cached kernels")
    filters(p)
    p.add_argument("--sort", choices=SORT_KEYS, default="last_used", help="sort column (default: last_used)")

    p = command("show", "see.show.cmd_show", "show one entry's metadata and recipe")
    p.add_argument("key", help="key or unique key prefix")
    for blob in ("ptx", "ttir", "ttgir", "llir", "amdgcn"):
        p.add_argument(f"--{blob}", action="append_const", const=blob, dest="blobs",
                       help=f"print the stored {blob.upper()} text")

    p = command("stats", "see.stats.cmd_stats", "entries, bytes, hits, misses, compile time saved")
    p.add_argument("--zero", action="store_true", help="reset the counters")
    p.add_argument("--format", choices=("text", "json", "prometheus"), default=None,
                   help="text (default), json (as --json) or prometheus: node-exporter's textfile format, "
                        "written whole or not at all")

    p = command("prune", "bound.prune.cmd_prune", "remove entries (and debris of crashed writers)")
    p.add_argument("--max-size", type=arguments.size, metavar="SIZE",
                   help="evict least recently used entries until the level fits SIZE (e.g. 10G)")
    filters(p, destructive=True)
    p.add_argument("--dry-run", action="store_true", help="only print what would be removed")

    p = command("verify", "check.verify.cmd_verify",
                "check every entry's format and checksum (--rebuild: recompile kernels and compare the bytes)")
    p.add_argument("--repair", action="store_true",
                   help="remove bad entries (with --rebuild: replace those that differ with the rebuild, signed)")
    p.add_argument("--rebuild", action="store_true",
                   help="recompile kernel entries of the installed toolchain from their recipes, without "
                        "touching the cache, and compare the bytes with the stored ones")
    chosen = p.add_mutually_exclusive_group()
    chosen.add_argument("--sample", type=arguments.positive, metavar="N",
                        help="with --rebuild: check N kernel entries chosen at random (the default, with N=20)")
    chosen.add_argument("--all", action="store_true", help="with --rebuild: check every kernel entry")
    p.add_argument("--allow-module", action="append", default=[], metavar="PATTERN", dest="allow_module",
                   help="with --rebuild: rebuild recipes whose kernel module matches this glob, as prewarm "
                        "(repeatable); rebuilding imports the module, so entries of other modules are skipped")
    _level_option(p)

    p = command("clear", "bound.prune.cmd_clear", "remove every entry")
    p.add_argument("--yes", action="store_true", help="really remove everything")
    _level_option(p, destructive=True)

    p = command("prewarm", "warm.prewarm.cmd_prewarm", "build kernels ahead of a job, from recipes or from a program")
    p.add_argument("program", nargs="?", type=arguments.program, metavar="MODULE:FUNCTION",
                   help="lower this JAX program for cuda instead of rebuilding recipes")
    p.add_argument("--arch", type=arguments.arch_list, metavar="ARCHES",
                   help="build for these targets (default: each recipe's own; programs: sm_90)")
    p.add_argument("--kernel", metavar="GLOB", help="only recipes of these kernels")
    p.add_argument("--allow-module", action="append", default=[], metavar="PATTERN", dest="allow_module",
                   help="rebuild recipes whose kernel module matches this glob, e.g. 'mylib.*' (repeatable); "
                        "rebuilding imports the module, so recipes of other modules are skipped, and "
                        "with none given no recipe is rebuilt")
    p.add_argument("-j", "--jobs", type=arguments.jobs, default=os.cpu_count() or 1, metavar="N",
                   help="compiles at once (default: CPU count)")

    p = command("tune", "warm.tune.cmd_tune",
                "on this GPU, time every config of each autotuned call of a program and keep the fastest")
    p.add_argument("program", type=arguments.program, metavar="MODULE:FUNCTION",
                   help="a function returning programs with real arguments: [(fn, args), ...]")
    p.add_argument("--reps", type=arguments.positive, default=20, metavar="N", help="timed runs per config (default 20)")
    p.add_argument("--warmup", type=arguments.count, default=3, metavar="N", help="untimed runs first (default 3)")

    p = command("export", "move.export_import.cmd_export", "write selected entries to one compressed bundle")
    p.add_argument("file", type=Path)
    p.add_argument("--force", action="store_true", help="replace FILE if it exists")
    filters(p)

    p = command("config", "bound.config.cmd_config", "every KERNEL_CACHE_* setting, its value and where it came from; "
                "'config max-size SIZE' stores the local bound in the cache directory")
    p.add_argument("setting", nargs="?", choices=("max-size",),
                   help="max-size: the local cache's bound, stored in the cache directory for every process there "
                        "(KERNEL_CACHE_MAX_BYTES overrides it)")
    p.add_argument("value", nargs="?", metavar="SIZE",
                   help="with max-size: store SIZE (e.g. 10G); 'default' removes the stored bound")
    command("doctor", "check.doctor.cmd_doctor",
            "check directories, ownership, locks, signing key, toolchain, jaxlib and GPU; exit 1 with a fix per problem")

    p = command("import", "move.export_import.cmd_import", "validate a bundle and add its entries")
    p.add_argument("file", type=Path)
    p.add_argument("--allow-stale", action="store_true", help="also import entries of other toolchains")
    p.add_argument("--level", "--tier", choices=("disk", "shared", "remote"), default="disk",
                   help="where to put them (default: disk)")
    return parser


def _level_option(p: argparse.ArgumentParser, destructive: bool = False) -> None:
    """--level (--tier and --all-tiers: the former names, still accepted); for a command that removes
    entries the local disk alone by default: the team's shared directory and the remote change only
    when named (--level shared|remote, or --all-levels)."""
    if not destructive:
        p.add_argument("--level", "--tier", choices=("disk", "shared", "remote", "all"), default="all",
                       help="which persistent level (default: all configured)")
        return
    group = p.add_mutually_exclusive_group()
    group.add_argument("--level", "--tier", choices=("disk", "shared", "remote"), default=None,
                       help="which level to change (default: the local disk; with no --dir, the one "
                            "--shared-dir or --remote given)")
    group.add_argument("--all-levels", "--all-tiers", dest="level", action="store_const", const="all",
                       default=argparse.SUPPRESS, help="change every configured level: local, shared and remote")


def _handler(dotted: str) -> Any:
    """The command's function, its module imported with SIGINT and SIGTERM held until the import ends:
    one landing inside a C extension's set-up (Triton's, JAX's) can abort the process instead of stopping it."""
    module_name, _, function = dotted.rpartition(".")
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT, signal.SIGTERM))
    try:
        module = importlib.import_module(f"{__package__}.{module_name}")
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    return getattr(module, function)


def main(argv: list[str] | None = None) -> int:
    ctx = None
    with notices.in_cachectl_words():
        try:
            args = build_parser().parse_args(argv)
            # prewarm stops on SIGINT however it was started: a script's `cachectl prewarm &` starts it ignoring SIGINT
            if args.command == "prewarm" and signal.getsignal(signal.SIGINT) is signal.SIG_IGN and \
                    threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, signal.default_int_handler)
            ctx = Context(args)
            return int(_handler(args.handler)(ctx, args))
        except CliError as exc:
            return _failed(argv, str(exc), exc.code)
        except LevelUnavailable as exc:  # a level failed mid-command (a remote server fault): said, never "0 entries"
            return _failed(argv, notices.explained(str(exc)), EXIT_PROBLEMS)
        except BrokenPipeError:  # `cachectl list | head`
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_OK
        except KeyboardInterrupt as exc:  # prewarm turns SIGTERM into one too (interrupts.Terminated: 143)
            print("cachectl: interrupted", file=sys.stderr)
            return int(getattr(exc, "exit_code", 130))
        finally:
            if ctx is not None:
                ctx.close()


def _failed(argv: list[str] | None, why: str, code: int) -> int:
    print(f"cachectl: {why}", file=sys.stderr)
    if "--json" in (argv if argv is not None else sys.argv[1:]):  # scripts read errors where they read data
        print(json.dumps({"schema": JSON_SCHEMA, "error": why, "exit_code": code}))
    return code
