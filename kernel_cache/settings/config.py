"""Every KERNEL_CACHE_* setting in one table (`SETTINGS`), read once into a frozen Config that components
receive; the README's table and `cachectl config` are written from it. Nothing else reads these
variables (KERNEL_CACHE_INTERCEPT's start-up hook and the scripts' KERNEL_CACHE_STACK* aside).
This module is long because it is the whole table, each setting's parser and checks included.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from kernel_cache.coordination import LOCK_MODES
from kernel_cache.entries.entry import DEFAULT_MAX_ENTRY_BYTES
from kernel_cache.errors import KernelCacheError
from kernel_cache.interception import InterceptError, parse_clients
from kernel_cache.lazy import later
from kernel_cache.sanitize import echo, escaped
from kernel_cache.settings import remote_url
from kernel_cache.settings.remote_url import redacted
from kernel_cache.trust.safefs import resolve_group
from kernel_cache.value_class import FrozenValue

if TYPE_CHECKING:
    from kernel_cache.trust import signing
    from kernel_cache.trust.signing import Signer
else:
    signing = later("kernel_cache.trust.signing")  # read only where a signing key or a password file is set

# (patterns, compiled by `re` at their first use: most processes never parse a size or a duration)
_SIZE = r"(?i)^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$"
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DURATION = r"(?i)^\s*(\d+(?:\.\d+)?)\s*(ms|[smhdw]?)\s*$"
_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
LOG_LEVELS = ("", "off", "info", "debug")
MAX_COMPILE_WORKERS = 16  # default cap: beyond it, compiles of one module rarely overlap further
MEMO_SUBDIR = "kernel-cache"  # under $XDG_CACHE_HOME (or ~/.cache) when KERNEL_CACHE_DIR is unset
TOOLCHAIN_MEMO = "toolchain-memo.json"  # the toolchain fingerprint memo, in the cache directory
XLA_SUBDIR = "xla"  # JAX's persistent compilation cache under KERNEL_CACHE_DIR (KERNEL_CACHE_XLA=1)


class ConfigError(KernelCacheError, ValueError):
    """A malformed setting; the message names the variable or option."""


def parse_size(text: str, what: str = "size") -> int:
    """'512M', '10G', '1.5GiB', '4096' -> bytes (binary units)."""
    m = re.match(_SIZE, str(text))
    if not m:
        raise ConfigError(f"{what}: cannot read {echo(text)} as a size (examples: 4096, 512M, 10G)")
    size = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not size < 1 << 63:
        raise ConfigError(f"{what}: {echo(text)} is larger than any size kernel-cache can use")
    return int(size)


def parse_duration(text: str, what: str = "duration") -> float:
    """'30d', '12h', '90m', '45s', '250ms' -> seconds. A bare number other than 0 is refused: `prune
    --older-than 30` read as seconds selects every entry minutes old."""
    m = re.match(_DURATION, str(text))
    if not m:
        raise ConfigError(f"{what}: cannot read {echo(text)} as a duration (examples: 45s, 90m, 12h, 30d)")
    number, unit = float(m.group(1)), m.group(2).lower()
    if not unit and number:
        raise ConfigError(f"{what}: {echo(text)} has no unit: write it with one of ms, s, m, h, d, w "
                          f"(e.g. {m.group(1)}s, 12h, 30d)")
    return number * _SECONDS.get(unit, 1)


def parse_flag(text: str, what: str = "flag") -> bool:
    v = text.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("", "0", "false", "no", "off"):
        return False
    raise ConfigError(f"{what}={echo(text)}: expected 1/0, true/false, yes/no or on/off")


def _expanded(text: str, what: str) -> Path:
    """A path with `~` or `~user` expanded; an unknown user is a ConfigError, not pathlib's RuntimeError."""
    try:
        return Path(text).expanduser()
    except RuntimeError:
        head = text.split("/", 1)[0]
        raise ConfigError(f"{what}={echo(text)}: {echo(head)} names no user with a home directory here; "
                          f"write the path in full") from None


def _text(text: str, what: str) -> str:
    return text.strip()


def _word(text: str, what: str) -> str:
    """One of a setting's words, in any case (Config checks which)."""
    return text.strip().lower()


def _target_arch(text: str, what: str) -> str:
    """Checked for shape here (the core knows no Triton): sm_NN / NN / gfxNNNN."""
    value = text.strip().lower()
    if not re.fullmatch(r"(sm_?|cuda:)?\d{2,3}a?|gfx[0-9a-f]{3,4}", value):
        raise ConfigError(f"{what}={echo(text)}: expected a GPU architecture such as sm_90, sm_80 or gfx942")
    return value


class Setting(NamedTuple):
    """One variable: where it lands in Config, how it is read, and what the README says of it."""

    env: str
    field: str
    parse: Callable[[str, str], Any]
    default: str  # a value in it is written as `spelled` writes it, as `cachectl config` prints it
    help: str


SETTINGS: tuple[Setting, ...] = (
    Setting("KERNEL_CACHE_DIR", "dir", _expanded, "unset: memory only",
            "node-local persistent store; setting it makes the cache warm across runs"),
    Setting("KERNEL_CACHE_SHARED_DIR", "shared_dir", _expanded, "unset",
            "shared directory for multi-node clusters (plain files)"),
    Setting("KERNEL_CACHE_DISABLE", "disabled", parse_flag, "`0`",
            "`1` (or `true`, `yes`, `on`) turns all caching off"),
    Setting("KERNEL_CACHE_MEMORY_BYTES", "memory_bytes", parse_size, "`256M`", "in-process LRU bound (`256M`, `1G`, …)"),
    Setting("KERNEL_CACHE_MEMORY_ITEMS", "memory_items", lambda t, w: int(parse_size(t, w)), "`4096`",
            "in-process LRU item bound"),
    Setting("KERNEL_CACHE_MAX_BYTES", "max_bytes", parse_size, "the bound stored in the cache directory, else `8G`",
            "local disk bound; least recently used entries are evicted; overrides the bound `cachectl config "
            "max-size` stores in the cache directory"),
    Setting("KERNEL_CACHE_LOG", "log", _word, "off",
            "`info` or `debug`: one line per lookup (key, kernel, arch, launch config, level, ms) on stderr; "
            "`off` or unset: nothing on stderr (the `kernel_cache` logger still reaches your logging setup)"),
    Setting("KERNEL_CACHE_LOCK", "lock", _word, "`auto`", "shared-level lock kind: `auto`, `flock`, `soft`"),
    Setting("KERNEL_CACHE_LOCK_TIMEOUT", "lock_timeout", parse_duration, "`10m`",
            "a process's budget of waiting for other processes' compiles, across all keys (a wait that ends "
            "with the kernel published costs nothing; once spent, it compiles without waiting), and the longest "
            "a remote compile lease is honoured"),
    Setting("KERNEL_CACHE_SOFT_LOCK_STALE", "soft_lock_stale", parse_duration, "`2m`",
            "a shared-level soft lock not refreshed for this long is taken over (its holder died)"),
    Setting("KERNEL_CACHE_TARGET_ARCH", "target_arch", _target_arch, "the device's",
            "GPU target (`sm_90`, `gfx942`) for calls without `compute_capability=`; it overrides the "
            "visible device, so leave it unset on GPU hosts (prewarm and cross-lowering set it)"),
    Setting("KERNEL_CACHE_MODULE_IMAGE", "module_image", parse_flag, "`1`",
            "`0` (or `false`, `no`, `off`) sends PTX only (jaxlib then runs ptxas at first launch) instead of "
            "the cached cubin"),
    Setting("KERNEL_CACHE_TRUSTED_GROUP", "trusted_group", _text, "unset",
            "a group (name or gid) whose members' cache files you accept, besides yours and root's "
            "(see [Trust model](#trust-model))"),
    Setting("KERNEL_CACHE_SIGNING_KEY_FILE", "signing_key", lambda t, w: _key_file(t), "unset",
            "a file (mode 600, yours) holding a key of ≥ 16 bytes: entries you write are signed with it, "
            "shared and bundled entries must carry its signature"),
    Setting("KERNEL_CACHE_SIGNING_KEY", "signing_key", lambda t, w: t.strip().encode(), "unset",
            "the key itself, for schedulers that pass secrets as variables (prefer the file)"),
    Setting("KERNEL_CACHE_XLA", "xla", parse_flag, "`0`",
            "`1` also keeps JAX's compiled XLA executables, in `xla/` under `KERNEL_CACHE_DIR` (JAX's persistent "
            "compilation cache, small programs included), only where nobody else can write (see "
            "[Trust model](#trust-model)); node-local: see [Shared cache](#shared-cache-for-clusters)"),
    Setting("KERNEL_CACHE_INTERCEPT", "intercept", lambda t, w: _clients(t, w), "unset",
            "`jax_triton`, `ejkernel`, `transformer_engine` (comma-separated) or `all`: those libraries' own "
            "`triton_call`s are served from the store, their code unchanged (see "
            "[Already using jax-triton, ejKernel or TE?](#already-using-jax-triton-ejkernel-or-te))"),
    Setting("KERNEL_CACHE_WINNERS", "winners", parse_flag, "`1`",
            "`0` (or `false`, `no`, `off`) ignores persisted autotune winners (`cachectl tune`): autotuned calls are "
            "lowered with all their configs and jaxlib autotunes them at first launch"),
    Setting("KERNEL_CACHE_CALL_RECORDS", "call_records", parse_flag, "`1`",
            "`0` (or `false`, `no`, `off`) keeps lowered-call records out of the store: a new process lowers every "
            "Triton call kernel by kernel (a call lowered again in the same process is still reused; see "
            "[Lowered-call records](#lowered-call-records))"),
    Setting("KERNEL_CACHE_WARM_SETS", "warm_sets", parse_flag, "`1`",
            "`0` (or `false`, `no`, `off`) neither reads nor writes warm sets: each record a new process needs is "
            "read from the store on its own (see [Lowered-call records](#lowered-call-records))"),
    Setting("KERNEL_CACHE_GPU_MODEL", "gpu_model", _text, "the device's",
            "the GPU model (JAX's `device_kind`, e.g. `NVIDIA H100 80GB HBM3`) whose tuned winners lowering uses; "
            "for cross-lowering where no GPU is visible, so leave it unset on GPU hosts"),
    Setting("KERNEL_CACHE_REMOTE", "remote", _text, "unset",
            "a Redis server every node shares (`redis://[user:pass@]host:port/db`, `rediss://` for TLS, "
            "`unix:///path/redis.sock`), or several nodes of one Redis Cluster separated by commas: the "
            "remote level, for clusters without a shared filesystem (see [Remote cache](#remote-cache-redis))"),
    Setting("KERNEL_CACHE_REMOTE_PASSWORD_FILE", "remote_password", lambda t, w: _password_file(t), "unset",
            "a file (yours, readable by no one else) holding the Redis password, kept out of the URL"),
    Setting("KERNEL_CACHE_REMOTE_NAMESPACE", "remote_namespace", _text, "`default`",
            "separates teams sharing one server (keys `kc:<namespace>:v2:…`)"),
    Setting("KERNEL_CACHE_REMOTE_TTL", "remote_ttl", parse_duration, "`14d`",
            "a remote entry not used for this long expires (every hit restarts it)"),
    Setting("KERNEL_CACHE_REMOTE_TIMEOUT", "remote_timeout", parse_duration, "`250ms`",
            "connect and read timeout per Redis call; after an error the server is skipped for 30 s"),
    Setting("KERNEL_CACHE_REMOTE_UNSIGNED", "remote_unsigned", parse_flag, "`0`",
            "`1` accepts unsigned remote entries: every client that can reach the server is trusted "
            "(otherwise the remote level needs KERNEL_CACHE_SIGNING_KEY_FILE)"),
    Setting("KERNEL_CACHE_JOB", "job", parse_flag, "`1`",
            "`0` (or `false`, `no`, `off`) leaves a multi-process JAX job's key-value store out: by default, where "
            "`jax.distributed` runs more than one process, they share kernels through it and compile each once "
            "(see [One job, many processes](#one-job-many-processes))"),
    Setting("KERNEL_CACHE_JOB_MAX_BYTES", "job_max_bytes", parse_size, "`256M`",
            "what one process puts into the job's key-value store at most (the coordinator holds it in memory "
            "until the job ends); past it, one warning and its later kernels are not shared"),
    Setting("KERNEL_CACHE_MAX_ENTRY_BYTES", "max_entry_bytes", parse_size, "`256M`",
            "a cache file larger than this is refused unread (real entries are KiB to a few MiB)"),
    Setting("KERNEL_CACHE_COMPILE_WORKERS", "compile_workers", lambda t, w: _workers(t, w), "usable cores, at most 16",
            "threads compiling kernels on a cold start: the first miss of a module starts every call traced "
            "with it; `1` compiles one kernel at a time, as each call lowers"),
)


def _workers(text: str, what: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if not 1 <= value <= 256:
        raise ConfigError(f"{what}={echo(text)}: expected a number of threads from 1 to 256")
    return value


def _clients(text: str, what: str) -> tuple[str, ...]:
    try:
        return parse_clients(text, what)
    except InterceptError as exc:
        raise ConfigError(str(exc)) from None


def check_remote(text: str, source: str = "KERNEL_CACHE_REMOTE") -> None:
    """One or more Redis URLs redis-py can use (else ConfigError, secrets hidden); `source`: the variable or option."""
    urls = remote_url.split_urls(text)
    if not urls:
        raise ConfigError(f"{source} names no server (redis://host:port/db, several "
                          "separated by commas)")
    for url in urls:
        try:
            remote_url.RemoteUrl(url)  # parsed only to be checked
        except remote_url.BadRemoteUrl as exc:
            raise ConfigError(f"{source}: {echo(redacted(url))}: {exc}") from None


def _password_file(text: str) -> str:
    """The Redis password, read as the signing key is (`signing.read_private_file`)."""
    path = _expanded(text.strip(), "KERNEL_CACHE_REMOTE_PASSWORD_FILE")
    try:
        raw = signing.read_private_file(path, "KERNEL_CACHE_REMOTE_PASSWORD_FILE", "password")
    except signing.SigningKeyError as exc:
        raise ConfigError(str(exc)) from None
    if not raw:
        raise ConfigError(f"KERNEL_CACHE_REMOTE_PASSWORD_FILE={echo(str(path))} is empty")
    try:
        return raw.decode()
    except UnicodeDecodeError:  # no byte of it in the message: they are the password's
        raise ConfigError(f"KERNEL_CACHE_REMOTE_PASSWORD_FILE={echo(str(path))} is not UTF-8 text "
                          "(Redis passwords are sent as UTF-8)") from None


def _key_file(text: str) -> bytes:
    try:
        return signing.load_key_file(_expanded(text.strip(), "KERNEL_CACHE_SIGNING_KEY_FILE"))
    except signing.SigningKeyError as exc:
        raise ConfigError(str(exc)) from None


_SIZE_FIELDS = frozenset({"memory_bytes", "memory_items", "max_bytes", "max_entry_bytes", "job_max_bytes"})
_DURATION_FIELDS = frozenset({"lock_timeout", "soft_lock_stale", "remote_ttl", "remote_timeout"})
_PATH_FIELDS = frozenset({"dir", "shared_dir", "toolchain_memo_dir"})


class _DefaultBound(int):
    """The local bound left at its default, told apart from the same number given: only a default gives
    way to the bound stored in the cache directory."""


DEFAULT_MAX_BYTES: int = _DefaultBound(8 << 30)


class Config(FrozenValue):
    """Where and how much to cache. `dir=None` means memory only (no persistence across runs)."""

    _hidden = frozenset({"signing_key", "remote", "remote_password"})  # secrets: never in repr
    dir: Path | None
    shared_dir: Path | None
    disabled: bool
    memory_bytes: int
    memory_items: int
    max_bytes: int  # left so: the bound stored in the cache directory, if any
    log: str
    lock: str
    lock_timeout: float
    soft_lock_stale: float  # a soft lock not refreshed for this long belongs to a dead holder
    target_arch: str | None  # None: the visible device's
    module_image: bool
    xla: bool  # also point JAX's persistent compilation cache at <dir>/xla
    winners: bool  # lower autotuned calls as their persisted winner when one is stored
    gpu_model: str | None  # None: the visible device's (for persisted autotune winners)
    call_records: bool  # serve a call seen before from its recorded payload (one store read)
    warm_sets: bool  # read a program's records in one go, as its last run kept them (kernel_cache.entries.warm_set)
    intercept: tuple[str, ...]  # client libraries whose Triton calls the store serves
    trusted_group: str | None  # besides yourself and root, whose cache files you accept
    signing_key: bytes | None
    max_entry_bytes: int
    toolchain_memo_dir: Path | None  # where the toolchain memo lives when `dir` is unset
    remote: str | None  # a Redis URL (may hold a password)
    remote_password: str | None
    remote_namespace: str
    remote_ttl: float
    remote_timeout: float
    remote_unsigned: bool
    compile_workers: int  # 0: usable cores, at most MAX_COMPILE_WORKERS
    job: bool  # share kernels through a multi-process JAX job's key-value store
    job_max_bytes: int  # what this process puts there at most
    memo_dir: Path | None  # derived (see __init__), not a field

    def __init__(self, dir: Path | None = None, shared_dir: Path | None = None, disabled: bool = False,
                 memory_bytes: int = 256 << 20, memory_items: int = 4096, max_bytes: int = DEFAULT_MAX_BYTES,
                 log: str = "", lock: str = "auto", lock_timeout: float = 600.0, soft_lock_stale: float = 120.0,
                 target_arch: str | None = None, module_image: bool = True, xla: bool = False, winners: bool = True,
                 gpu_model: str | None = None, call_records: bool = True, warm_sets: bool = True,
                 intercept: tuple[str, ...] = (),
                 trusted_group: str | None = None, signing_key: bytes | None = None,
                 max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES, toolchain_memo_dir: Path | None = None,
                 remote: str | None = None, remote_password: str | None = None, remote_namespace: str = "default",
                 remote_ttl: float = 14 * 86400.0, remote_timeout: float = 0.25, remote_unsigned: bool = False,
                 compile_workers: int = 0, job: bool = True, job_max_bytes: int = 256 << 20) -> None:
        given = dict(locals())  # the parameters, which are the fields
        del given["self"]
        self.__dict__.update(given)
        self._check()
        # the toolchain memo's directory (None: this process only); an attribute: read on every cold lookup
        self.__dict__["memo_dir"] = None if self.disabled else self.dir if self.dir is not None \
            else self.toolchain_memo_dir

    def _check(self) -> None:
        self._coerce()
        if self.log not in LOG_LEVELS:
            raise ConfigError(f"KERNEL_CACHE_LOG={echo(self.log)}: expected one of info, debug, off")
        if self.lock not in LOCK_MODES:
            raise ConfigError(f"KERNEL_CACHE_LOCK={echo(self.lock)}: expected one of {', '.join(LOCK_MODES)}")
        if self.soft_lock_stale <= 0 or self.lock_timeout <= 0:
            raise ConfigError("KERNEL_CACHE_SOFT_LOCK_STALE and KERNEL_CACHE_LOCK_TIMEOUT must be positive")
        for name in ("memory_bytes", "memory_items", "max_bytes", "job_max_bytes"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative")
        if self.max_entry_bytes < 1 << 16:
            raise ConfigError("KERNEL_CACHE_MAX_ENTRY_BYTES must be at least 64K")
        if self.trusted_group is not None:
            try:
                resolve_group(self.trusted_group)
            except (KeyError, ValueError):  # ValueError: a name no group can have (a NUL in it)
                raise ConfigError(f"KERNEL_CACHE_TRUSTED_GROUP={echo(self.trusted_group)}: no such group") from None
        if self.signing_key is not None:
            try:
                signing.Signer(self.signing_key)
            except signing.SigningKeyError as exc:
                raise ConfigError(f"KERNEL_CACHE_SIGNING_KEY: {exc}") from None
        if self.remote is not None:
            check_remote(self.remote)
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", self.remote_namespace):
            raise ConfigError(f"KERNEL_CACHE_REMOTE_NAMESPACE={echo(self.remote_namespace)}: letters, digits, "
                              f"'.', '_' and '-' only (at most 64)")
        if self.remote_ttl < 1 or self.remote_timeout <= 0:
            raise ConfigError("KERNEL_CACHE_REMOTE_TTL must be at least 1s and KERNEL_CACHE_REMOTE_TIMEOUT positive")

    def _coerce(self) -> None:
        """Sizes, durations and paths given as text (`Config(max_bytes="1G")`) are read as the environment's;
        any other wrong type is a ConfigError naming the field."""
        for name in self._fields:
            value = getattr(self, name)
            if name in _SIZE_FIELDS and isinstance(value, str):
                value = parse_size(value, name)
            elif name in _DURATION_FIELDS and isinstance(value, str):
                value = parse_duration(value, name)
            elif name in _PATH_FIELDS and isinstance(value, str):
                value = _expanded(value, name)
            if name in _SIZE_FIELDS and (not isinstance(value, int) or isinstance(value, bool)):
                raise ConfigError(f"{name}: expected a number of bytes or a size like '1G', got {echo(repr(value))}")
            if name in _DURATION_FIELDS and (not isinstance(value, (int, float)) or isinstance(value, bool)):
                raise ConfigError(f"{name}: expected seconds or a duration like '90s', got {echo(repr(value))}")
            object.__setattr__(self, name, value)

    def with_(self, **changes: Any) -> "Config":
        return Config(**{**{name: getattr(self, name) for name in self._fields}, **changes})

    @property
    def max_bytes_given(self) -> bool:
        return type(self.max_bytes) is not _DefaultBound

    @property
    def trusted_gid(self) -> int | None:
        return None if self.trusted_group is None else resolve_group(self.trusted_group)

    @property
    def xla_dir(self) -> Path | None:
        if self.disabled or not self.xla or self.dir is None:
            return None
        return self.dir / XLA_SUBDIR

    @property
    def compile_threads(self) -> int:
        if self.compile_workers > 0:
            return self.compile_workers
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cores = os.cpu_count() or 1
        return max(1, min(cores, MAX_COMPILE_WORKERS))

    def signer(self) -> Signer | None:
        return None if self.signing_key is None else signing.Signer(self.signing_key)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Config":
        env = os.environ if environ is None else environ
        if env.get("KERNEL_CACHE_SIGNING_KEY_FILE", "").strip() and env.get("KERNEL_CACHE_SIGNING_KEY", "").strip():
            raise ConfigError("set KERNEL_CACHE_SIGNING_KEY or KERNEL_CACHE_SIGNING_KEY_FILE, not both")
        values: dict[str, Any] = {}
        for setting in SETTINGS:
            raw = env.get(setting.env, "")
            if raw.strip():
                values[setting.field] = _parsed(setting, raw)
        return cls(**values, toolchain_memo_dir=_user_cache_home(env))


def _parsed(setting: Setting, raw: str) -> Any:
    """`setting.parse(raw)`; what its parser did not foresee is one line naming the variable, not its
    value (maybe a secret)."""
    try:
        return setting.parse(raw, setting.env)
    except ConfigError:
        raise
    except (ValueError, RuntimeError, ArithmeticError) as exc:
        raise ConfigError(f"{setting.env}: cannot be read ({type(exc).__name__}: {escaped(str(exc))[:200]})") from None


def sources(environ: Mapping[str, str] | None = None) -> list[tuple[Setting, str]]:
    """(setting, 'environment', 'default' or 'unused': the one of two variables for one value not set)."""
    env = os.environ if environ is None else environ
    given = {s.field for s in SETTINGS if env.get(s.env, "").strip()}
    return [(s, "environment" if env.get(s.env, "").strip() else "unused" if s.field in given else "default")
            for s in SETTINGS]


def spelled(setting: Setting, value: Any) -> str | None:
    """`value` as one would write it in `setting`'s variable (`256M`, `10m`, `1`, `jax_triton,ejkernel`)."""
    if value is None or value == () or (setting.field == "compile_workers" and not value):  # 0: the default
        return None
    if isinstance(value, bool):
        return "1" if value else "0"
    if setting.parse is parse_size:
        return _spelled_number(int(value), [("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)], "")
    if setting.parse is parse_duration:
        return _spelled_number(float(value), [("d", 86400), ("h", 3600), ("m", 60), ("s", 1),
                                              ("ms", 0.001)], "s")
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def _spelled_number(value: float, units: list[tuple[str, float]], plain: str) -> str:
    for unit, size in units:
        if value >= size and (value / size) == int(value / size):
            return f"{int(value / size)}{unit}"
    return f"{value:g}{plain}"


def render_table() -> str:
    rows = ["| variable | meaning | default |", "|---|---|---|"]
    rows += [f"| `{s.env}` | {s.help} | {s.default} |" for s in SETTINGS]
    return "\n".join(rows)


def _user_cache_home(env: Mapping[str, str]) -> Path | None:
    xdg = env.get("XDG_CACHE_HOME", "").strip()
    if xdg:
        return Path(xdg) / MEMO_SUBDIR
    try:
        return Path.home() / ".cache" / MEMO_SUBDIR
    except (RuntimeError, KeyError):  # no HOME and no passwd entry (containers with arbitrary uids)
        return None
