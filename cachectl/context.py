"""What every cachectl command shares: the configuration, the store (opened read-only unless the
command writes), the chosen levels, and output helpers honouring --json / -q / -v."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernel_cache.errors import KernelCacheError
from kernel_cache.lazy import later
from kernel_cache.levels import cache_marker
from kernel_cache.levels.cache_marker import ENTRIES_DIR, NotACacheDirectory
from kernel_cache.levels.protocols import KeptLevel
from kernel_cache.settings import cache_settings
from kernel_cache.settings.cache_settings import StoredSettings, StoredSettingsError
from kernel_cache.settings.config import Config, ConfigError, check_remote
from kernel_cache.store import Store
from kernel_cache.telemetry.warnings_once import KernelCacheWarning
from kernel_cache.trust.safefs import Owners, Tree

if TYPE_CHECKING:
    import compiler.toolchain
else:
    compiler = later("compiler")  # it imports Triton: `list` and `stats` start without it

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2
# every --json document carries {"schema": JSON_SCHEMA}; bumped when a field changes meaning or name
# (2: the "tier" fields became "level")
JSON_SCHEMA = 2
WRITING_COMMANDS = ("prune", "clear", "import", "prewarm", "tune")
# where the local bound comes from: KERNEL_CACHE_MAX_BYTES, the cache directory (cachectl config max-size), 8G
BOUND_ENVIRONMENT, BOUND_STORED, BOUND_DEFAULT = "environment", "cache directory", "default"


# how a command line or the environment names a level that is not configured
_HOW_TO_NAME = {"shared": "pass --shared-dir DIR or set KERNEL_CACHE_SHARED_DIR",
                "remote": "pass --remote URL or set KERNEL_CACHE_REMOTE",
                "all": "pass --shared-dir DIR or --remote URL, or set KERNEL_CACHE_SHARED_DIR or KERNEL_CACHE_REMOTE"}


class CliError(KernelCacheError):
    """A one-line reason to stop, with its exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code


class Context:
    """One cachectl run: its options, configuration and (lazily) its store."""

    def __init__(self, args: Any):
        self.args = args
        self.json = getattr(args, "json", False)
        self.quiet = getattr(args, "quiet", False)
        self.verbose = getattr(args, "verbose", False)
        remote = getattr(args, "remote", None)
        environ: Mapping[str, str] = os.environ
        try:  # a malformed setting: a CliError naming where it was written
            if remote:  # checked as the flag's: it replaces KERNEL_CACHE_REMOTE, which is then not read
                check_remote(remote, "--remote")
                environ = {name: value for name, value in os.environ.items() if name != "KERNEL_CACHE_REMOTE"}
            config = Config.from_env(environ)
        except ConfigError as exc:
            raise CliError(str(exc)) from None
        # the settings this command line gave (--dir, --shared-dir, --remote), over the environment's
        self.from_command_line = {field for field in ("dir", "shared_dir", "remote") if getattr(args, field, None)}
        self.config = config.with_(**{field: getattr(args, field) for field in self.from_command_line}, disabled=False)
        self._store: Store | None = None
        self._toolchains: dict[str, str | None] = {}
        command = getattr(args, "command", "")
        self.stored, self.stored_problem = self._stored_settings(command)
        self.bound_source = BOUND_ENVIRONMENT if config.max_bytes_given else BOUND_DEFAULT
        if not config.max_bytes_given and self.stored.max_bytes is not None:  # as every process on the directory
            self.config = self.config.with_(max_bytes=self.stored.max_bytes)
            self.bound_source = BOUND_STORED
        self.writes = command in WRITING_COMMANDS or bool(
            getattr(args, "repair", False) or getattr(args, "zero", False))

    def _stored_settings(self, command: str) -> tuple[StoredSettings, str | None]:
        """What the cache directory stores (`cachectl config max-size`), and why its file is refused:
        a ConfigError (exit 2) but for `config`, which rewrites it, and `doctor`, which reports it."""
        directory = self.config.dir
        if directory is None:
            return StoredSettings(), None
        try:
            return cache_settings.load(Path(directory), Owners.current(self.config.trusted_gid)), None
        except StoredSettingsError as exc:
            if command not in ("config", "doctor"):
                raise CliError(f"{exc} (rewrite it with 'cachectl config max-size SIZE', or remove it)") from None
            return StoredSettings(path=Path(directory) / cache_settings.SETTINGS_FILE), str(exc)

    def store(self, create: bool = False) -> Store:
        """The store on --dir (and the shared directory and remote when configured; with no --dir, those
        alone). Opened read-only unless the command writes, so an operator can look at a cache that is
        full, on a read-only mount or busy.
        A missing directory is an error unless the command fills it; a directory that is not a
        kernel-cache one (no marker, other files in it, or the shared kind) is never turned into one."""
        if self._store is None:
            directory = self.config.dir
            if directory is None and self.config.shared_dir is None and self.config.remote is None:
                raise CliError("no cache directory: pass --dir DIR or set KERNEL_CACHE_DIR (a shared directory or "
                               "remote alone: --shared-dir DIR, --remote URL)")
            if directory is not None:
                check_local_directory(Path(directory), create)
            if self.config.shared_dir is not None and not Path(self.config.shared_dir).is_dir():
                raise CliError(f"no shared cache directory at {self.config.shared_dir}")
            with warnings.catch_warnings():  # the reasons are reported here, once, as errors
                warnings.simplefilter("ignore", KernelCacheWarning)
                self._store = Store(self.config, read_only=not self.writes)
            if directory is not None and self._store.disk is None:
                raise CliError(str(self._store.unavailable.get("disk") or f"cannot open the cache directory {directory}"))
            if self.config.remote is not None and self._store.level("remote") is None:
                raise CliError(f"cannot use the remote cache: {self._store.unavailable.get('remote', 'unknown reason')}")
            if self.config.shared_dir is not None and self._store.shared is None:
                raise CliError(f"cannot use the shared cache directory {self.config.shared_dir}: "
                               f"{self._store.unavailable.get('shared', 'unknown reason')}")
        return self._store

    def levels(self, which: str | None = "all") -> list[KeptLevel]:
        """The persistent levels `which` names ('all', 'disk', 'shared', 'remote') that keep entries an
        operator can list, verify and prune. None, a destructive command's default: the local disk, or
        where there is none, the one shared directory or remote named on this command line."""
        store = self.store()
        if which is None:
            which = self._default_level(store)
        chosen = [t for t in store.persistent_levels if which in ("all", t.name) and isinstance(t, KeptLevel)]
        if not chosen:
            if which == "disk":
                raise CliError("no local cache directory: pass --dir DIR or set KERNEL_CACHE_DIR (or name "
                               "another level with --level shared|remote)")
            raise CliError(f"no {which} level configured ({_HOW_TO_NAME.get(which, _HOW_TO_NAME['all'])})")
        return chosen

    def _default_level(self, store: Store) -> str:
        if store.disk is not None or self.config.dir is not None:
            return "disk"
        named = [name for name, flag in (("shared", "shared_dir"), ("remote", "remote"))
                 if getattr(self.args, flag, None) is not None]
        if len(named) == 1:
            return named[0]
        raise CliError("no local cache directory: name the level to change with --level shared|remote or "
                       "--all-levels")

    def installed_toolchain(self, target: dict[str, Any]) -> str | None:
        """The installed toolchain's summary for `target` (what `--stale` compares entries against), or
        None when that backend is not installed here."""
        ident = json.dumps(target, sort_keys=True)
        if ident not in self._toolchains:
            try:
                summary = compiler.toolchain.toolchain_summary(compiler.Target.from_json(target), self.config.memo_dir)
            except Exception:
                summary = None
            self._toolchains[ident] = summary
        return self._toolchains[ident]

    def say(self, text: str = "") -> None:
        """Human progress and summaries; silent with --json or -q."""
        if not self.json and not self.quiet:
            print(text)

    def emit_json(self, obj: Any) -> None:
        if isinstance(obj, dict):
            obj = {"schema": JSON_SCHEMA, **obj}
        print(json.dumps(obj, indent=2, sort_keys=True, default=str))

    def close(self) -> None:
        if self._store is not None:
            self._store.close()


def check_local_directory(directory: Path, create: bool) -> None:
    """CliError unless `directory` is a local kernel-cache directory, or (`create`) may become one."""
    if not directory.is_dir():
        if directory.exists():
            raise CliError(f"{directory} is not a directory: name the cache directory (--dir DIR or KERNEL_CACHE_DIR)")
        if create:
            return
        raise CliError(f"no cache directory at {directory}: a program run with KERNEL_CACHE_DIR={directory} "
                       f"creates it at its first cached kernel call, as 'cachectl prewarm' and 'cachectl import' "
                       f"with --dir do")
    try:
        tree = Tree(directory, None)
    except OSError as exc:
        raise CliError(f"cannot open the cache directory {directory}: {exc}") from None
    try:
        found = cache_marker.check(tree, cache_marker.LOCAL, cache_marker.LOCAL_NAMES, write=False)
        if not create and found is None and tree.lstat(ENTRIES_DIR) is None:
            raise CliError(f"{directory} is not a kernel-cache directory (no {cache_marker.MARKER}, no "
                           f"{ENTRIES_DIR}/): nothing cached there yet")
    except NotACacheDirectory as exc:
        raise CliError(str(exc)) from None
    finally:
        tree.close()
