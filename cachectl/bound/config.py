"""cachectl config: every KERNEL_CACHE_* setting with its value and source, and `config max-size [SIZE]`,
the local bound stored in the cache directory (kernel_cache.settings.cache_settings), as `ccache -M` stores it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

from cachectl.context import (
    BOUND_ENVIRONMENT,
    BOUND_STORED,
    EXIT_OK,
    EXIT_PROBLEMS,
    CliError,
    Context,
    check_local_directory,
)
from cachectl.render import bound_source, human_size, table
from kernel_cache.levels import cache_marker
from kernel_cache.levels.cache_marker import NotACacheDirectory
from kernel_cache.settings import cache_settings
from kernel_cache.settings.config import DEFAULT_MAX_BYTES, ConfigError, parse_size, sources, spelled
from kernel_cache.settings.remote_url import redacted
from kernel_cache.trust.safefs import Owners, Tree, UnsafeFile

UNSET_WORDS = ("default", "none", "unset")  # `config max-size default`: remove the stored bound


class _SettingRow(TypedDict):
    """One setting's row of `cachectl config`."""

    variable: str
    value: str | None
    source: str
    meaning: str


def cmd_config(ctx: Context, args: Any) -> int:
    """Every KERNEL_CACHE_* setting: its effective value and whether the environment set it (the local
    bound: or the cache directory); `config max-size` shows or stores the bound."""
    if args.value is not None and getattr(args, "setting", None) is None:
        raise CliError("a value needs a setting to store it as: cachectl config max-size SIZE")
    if ctx.stored_problem is not None and args.value is None:  # `config max-size SIZE` alone rewrites it
        raise CliError(f"{ctx.stored_problem} (rewrite it with 'cachectl config max-size SIZE', or remove it)")
    if getattr(args, "setting", None) == "max-size":
        return _max_size(ctx, args.value)
    rows: list[_SettingRow] = []
    for setting, source in sources():
        value = getattr(ctx.config, setting.field)
        if setting.field == "max_bytes":
            source = ctx.bound_source
        elif setting.field in ctx.from_command_line:
            source = "command line"
        if source == "unused":
            text = None
        elif setting.field == "signing_key":
            signer = ctx.config.signer()  # None exactly when the key (value) is
            text = None if signer is None else f"set (key id {signer.key_id.hex()})"
        elif setting.field in ("remote", "remote_password"):
            text = None if value is None else redacted(value) if setting.field == "remote" else "set"
        else:
            text = spelled(setting, value)
        rows.append({"variable": setting.env, "value": text, "source": source, "meaning": setting.help})
    if ctx.json:
        ctx.emit_json({"settings": rows, "stored": ctx.stored.to_json()})
        return EXIT_OK
    shown = [["VARIABLE", "VALUE", "SOURCE"]] + [[r["variable"], r["value"] or "-", r["source"]] for r in rows]
    print("\n".join(table(shown, right=set())))
    if ctx.stored.max_bytes is not None and not ctx.quiet:
        print(f"\nstored in {ctx.stored.path}: max-size {human_size(ctx.stored.max_bytes)}"
              + (" (KERNEL_CACHE_MAX_BYTES overrides it here)" if ctx.bound_source == BOUND_ENVIRONMENT else ""))
    return EXIT_OK


def _max_size(ctx: Context, value: str | None) -> int:
    directory = ctx.config.dir
    if directory is None:
        raise CliError("no cache directory: pass --dir DIR or set KERNEL_CACHE_DIR (the bound is stored there)")
    if value is None:
        if ctx.json:
            ctx.emit_json({"max_bytes": ctx.config.max_bytes, "source": ctx.bound_source, "stored": ctx.stored.to_json()})
        else:
            print(f"max size  {human_size(ctx.config.max_bytes)} ({bound_source(ctx)})")
        return EXIT_OK
    bound = _bound(value)
    path = _store(Path(directory), bound, Owners.current(ctx.config.trusted_gid))
    overridden = ctx.bound_source == BOUND_ENVIRONMENT
    if ctx.json:
        ctx.emit_json({"max_bytes": bound, "source": BOUND_ENVIRONMENT if overridden else
                       BOUND_STORED if bound is not None else "default",
                       "stored": cache_settings.StoredSettings(bound, path).to_json()})
        return EXIT_OK
    if bound is None:
        ctx.say(f"removed the stored max size from {directory}: processes there bound it by KERNEL_CACHE_MAX_BYTES, "
                f"else {human_size(DEFAULT_MAX_BYTES)}")
    else:
        ctx.say(f"stored max size {human_size(bound)} in {path}: processes on this directory evict beyond it at "
                f"their next write (unless KERNEL_CACHE_MAX_BYTES is set), 'cachectl prune' applies it now")
    if overridden and not ctx.quiet:
        print(f"cachectl: KERNEL_CACHE_MAX_BYTES ({human_size(ctx.config.max_bytes)}) is set here and overrides "
              f"the stored bound in this environment")
    return EXIT_OK


def _bound(value: str) -> int | None:
    if value.strip().lower() in UNSET_WORDS:
        return None
    try:
        bound = parse_size(value, "max-size")
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    if bound < 1:
        raise CliError("max-size: a bound of 0 would evict every entry (give a size, or 'default' to remove "
                       "the stored bound)")
    return bound


def _store(directory: Path, bound: int | None, owners: Owners) -> Path:
    """Write the bound into the local cache `directory` (made one if new: as import and prewarm do);
    never into a directory that holds other files or is not yours."""
    check_local_directory(directory, create=True)
    try:
        tree = Tree(directory, owners, create=bound is not None)
    except FileNotFoundError:
        return directory / cache_settings.SETTINGS_FILE  # nothing stored where there is no directory
    except UnsafeFile as exc:
        raise CliError(f"cache directory {exc.path} {exc.reason}: not storing a bound there") from None
    except OSError as exc:
        raise CliError(f"cannot open the cache directory {directory}: {exc.strerror or exc}", EXIT_PROBLEMS) from None
    try:
        cache_marker.check(tree, cache_marker.LOCAL, cache_marker.LOCAL_NAMES, write=True)
        return cache_settings.write(tree, bound)
    except NotACacheDirectory as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(f"cannot store the bound in {directory}: {exc.strerror or exc}", EXIT_PROBLEMS) from None
    finally:
        tree.close()
