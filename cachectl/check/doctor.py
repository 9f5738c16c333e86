"""cachectl doctor: is this host set up for kernel-cache? One row per check, each ok, warn or problem,
with the fix for what is not ok; exit 1 when any problem was found.

Read-only: the cache directories are looked at with stat/lstat, never through a Store (which would
create the layout); nothing is probed by writing (so the shared lock kind is the one `auto` picks
from the filesystem type, before its flock probe). It imports
Triton and JAX (command modules load only when their command runs) but initialises a JAX backend
only to look for a GPU, and not at all where JAX_PLATFORMS leaves CUDA out.

This module is long because it is one flat list of independent checks, each with its own wording and
fix; split up, the rows an operator reads together would live apart.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
import shutil
import site
import stat
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import jax

from cachectl import notices
from cachectl.context import EXIT_OK, EXIT_PROBLEMS, Context
from cachectl.render import human_size, table
from compiler import parse_target
from compiler import triton_compat as tc
from kernel_cache import configure, interception
from kernel_cache.coordination.locks import filesystem_of, flock_is_coherent
from kernel_cache.entries.entry import is_key
from kernel_cache.levels.cache_marker import ENTRIES_DIR, LOCKS_DIR, QUARANTINE_DIR, STATS_DIR
from kernel_cache.levels.remote import level as remote_level
from kernel_cache.settings.config import Config
from kernel_cache.settings.remote_url import redacted
from kernel_cache.trust.safefs import Owners
from lowering.clients import ejkernel as ejkernel_client
from lowering.clients import jax_triton as jax_triton_client
from lowering.clients.served import UnsupportedClient, check_version
from lowering.payload import jaxlib_compat

OK, WARN, PROBLEM = "ok", "warn", "problem"
HOOK = "kernel_cache_intercept.pth"
# client -> (distribution, lowest version known, first version not known); TE is gated by signature
CLIENT_VERSIONS = {
    "jax_triton": (jax_triton_client.V03.distribution, jax_triton_client.V03.lowest, jax_triton_client.V04.below),
    "ejkernel": (ejkernel_client.CLIENT.distribution, ejkernel_client.CLIENT.lowest, ejkernel_client.CLIENT.below),
    "transformer_engine": ("transformer-engine", (), ()),
}
SCHEMA = 1
# kernel-cache is not on PyPI: it installs from a checkout or a built wheel (README, "Install into your
# environment"); `pip install kernel-cache` asks the index, which has no such package or somebody else's.
INSTALL_HINT = ("install kernel-cache with pip from a checkout or a built wheel (pip install /path/to/kernel-cache; "
                "README: Install into your environment), not only on PYTHONPATH")
# flock is not coherent on all of these: the local level is for local disks.
NETWORK_FILESYSTEMS = {"nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "ceph", "9p", "beegfs",
                       "glusterfs", "afs", "orangefs"}
# the kernel's views of its own state: a cache directory can never be made there
PSEUDO_FILESYSTEMS = {"proc", "sysfs", "devpts", "cgroup", "cgroup2", "securityfs", "debugfs", "tracefs", "pstore",
                      "bpf", "configfs", "efivarfs", "mqueue", "binfmt_misc", "fusectl"}


@dataclass
class Check:
    check: str
    status: str
    detail: str
    fix: str | None = None


def cmd_doctor(ctx: Context, args: Any) -> int:
    """Changes nothing: what the checks derive (a plugin's schema, the toolchain's fingerprint) is memoized
    in a session without levels, so no directory is created and nothing is written to a remote."""
    configure(Config(disabled=True))
    config = ctx.config
    owners = Owners.current(config.trusted_gid)
    stored = [Check("cache-bound", PROBLEM, f"{ctx.stored_problem}: the local cache keeps its default bound",
                    "cachectl config max-size SIZE (rewrites it), or remove the file")] if ctx.stored_problem else []
    checks = [*_local(config, owners), *stored, *_shared(config, owners), *_remote(config, owners), _signing(config),
              *_toolchain(config), *_jaxlib(config), _gpu(config), *_intercept(config)]
    problems = sum(c.status == PROBLEM for c in checks)
    warnings = sum(c.status == WARN for c in checks)
    if ctx.json:
        ctx.emit_json({"schema": SCHEMA, "checks": [asdict(c) for c in checks]})
    else:
        rows = table([["CHECK", "STATUS", "DETAIL"]] + [[c.check, c.status, c.detail] for c in checks], right=set())
        indent = " " * (rows[0].index("DETAIL"))
        print(rows[0])
        for check, line in zip(checks, rows[1:]):
            print(line)
            if check.fix and check.status != OK:
                print(f"{indent}fix: {check.fix}")
        ctx.say(f"doctor: {len(checks)} checks, {problems} problem{'s' * (problems != 1)}, "
                f"{warnings} warning{'s' * (warnings != 1)}")
    return EXIT_PROBLEMS if problems else EXIT_OK


# The local cache directory -------------------------------------------------------------------------
def _local(config: Config, owners: Owners) -> list[Check]:
    directory = config.dir
    if directory is None:
        return [Check("cache-dir", WARN, "not set: caching in memory only (kernels are compiled again in every "
                      "new process)", "set KERNEL_CACHE_DIR (or pass --dir) to a directory on a local disk")]
    directory = Path(directory)
    rows = [_local_dir(directory, owners), _filesystem_row("cache-fs", directory, local=True)]
    if rows[0].status == OK:
        rows.append(_size(directory, config))
    return rows


def _local_dir(directory: Path, owners: Owners) -> Check:
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        parent = _existing_parent(directory)
        if parent is not None and os.access(parent, os.W_OK | os.X_OK):
            why = _cannot_hold_directories(parent)
            if why:
                return Check("cache-dir", PROBLEM, f"{directory} does not exist and cannot be created: {parent} {why}",
                             "point KERNEL_CACHE_DIR at a directory on a local disk")
            return Check("cache-dir", OK, f"{directory} does not exist yet: created on first use")
        return Check("cache-dir", PROBLEM, f"{directory} does not exist and cannot be created here "
                     f"({parent or '/'} is not writable)", f"mkdir -m 700 -p {directory} as a user who may")
    except OSError as exc:
        return Check("cache-dir", PROBLEM, f"{directory}: {exc.strerror}", "check the path and its permissions")
    if not stat.S_ISDIR(st.st_mode):
        return Check("cache-dir", PROBLEM, f"{directory} is not a directory", "point KERNEL_CACHE_DIR at a directory")
    found = _untrusted(directory, st, owners) + [
        problem for sub in (ENTRIES_DIR, LOCKS_DIR, STATS_DIR) for problem in _level(directory / sub, owners)]
    if found:
        return _ownership_problem("cache-dir", found, "another user could plant kernels there, so kernel-cache "
                                  "does not use it (memory only)")
    if not (directory / ENTRIES_DIR).is_dir():
        if any(directory.iterdir()):
            return Check("cache-dir", WARN, f"{directory} holds other files and is not a kernel-cache directory "
                         f"(no {ENTRIES_DIR}/)", "point KERNEL_CACHE_DIR at an empty or new directory")
        return Check("cache-dir", OK, f"{directory} is empty: becomes a cache on first use")
    writable = os.access(directory, os.W_OK) and os.access(directory / ENTRIES_DIR, os.W_OK)
    note = "" if writable else "; read-only to you: hits are served, new kernels stay in memory"
    return Check("cache-dir", OK if writable else WARN, f"{directory}: {_trusted(owners)}{note}",
                 None if writable else f"give yourself write access to {directory}")


def _size(directory: Path, config: Config) -> Check:
    """How many entries the local level holds and their bytes, as stats, list and prune count them."""
    count = size = 0
    for path in (directory / ENTRIES_DIR).glob("??/*"):
        with contextlib.suppress(OSError):
            st = path.lstat()
            if is_key(path.name) and stat.S_ISREG(st.st_mode):
                count, size = count + 1, size + st.st_size
    over = size > config.max_bytes
    return Check("cache-size", WARN if over else OK,
                 f"{count} {'entry' if count == 1 else 'entries'}, {human_size(size)} of "
                 f"{human_size(config.max_bytes)} allowed" + (" (over the bound: the next write evicts)" if over else ""),
                 "cachectl prune (evicts down to the bound), or cachectl config max-size SIZE" if over else None)


# The shared directory -----------------------------------------------------------------------------
def _shared(config: Config, owners: Owners) -> list[Check]:
    directory = config.shared_dir
    if directory is None:
        return [Check("shared-dir", OK, "not configured (KERNEL_CACHE_SHARED_DIR): one node's cache only")]
    directory = Path(directory)
    signed = config.signing_key is not None
    if not directory.is_dir():
        return [Check("shared-dir", PROBLEM, f"{directory} does not exist (or is not a directory); kernel-cache "
                      "never creates it", f"mkdir -m 2770 {directory} && chgrp GROUP {directory} (README: 'Shared "
                      "cache for clusters')")]
    if not os.access(directory, os.R_OK | os.X_OK):
        return [Check("shared-dir", PROBLEM, f"{directory} is not readable by you", f"chmod g+rx {directory} "
                      "and share its group")]
    levels = [directory / sub for sub in (ENTRIES_DIR, LOCKS_DIR, QUARANTINE_DIR)]
    for sub in (ENTRIES_DIR, LOCKS_DIR):
        with contextlib.suppress(OSError):
            levels += sorted(p for p in (directory / sub).iterdir() if len(p.name) == 2)[:512]
    trusted = None if signed else owners  # signed entries vouch for themselves, whoever owns them
    st = os.stat(directory)
    found = _untrusted(directory, st, trusted) + [problem for level in levels for problem in _level(level, trusted)]
    if found:
        alternative = " (or sign entries: KERNEL_CACHE_SIGNING_KEY_FILE)" if not signed else ""
        row = _ownership_problem("shared-dir", found, "anyone who can write there could plant kernels you "
                                 "would run, so kernel-cache skips the shared level", alternative)
    else:
        detail = f"{directory}: " + ("entries must carry this key's signature (owners not checked)" if signed
                                     else _trusted(owners))
        detail += "" if os.access(directory, os.W_OK) else "; read-only to you: serves hits, new kernels stay local"
        row = Check("shared-dir", OK, detail)
        if signed and st.st_mode & stat.S_IWOTH:
            row = Check("shared-dir", WARN, detail + "; writable by every user: anyone can delete entries",
                        f"share it with a group instead: chgrp GROUP {directory} && chmod 2770 {directory}")
    return [row, _filesystem_row("shared-fs", directory, local=False), _lock_row(directory, config)]


def _lock_row(directory: Path, config: Config) -> Check:
    if not os.access(directory, os.W_OK):
        return Check("shared-lock", OK, "none: the shared directory is read-only to you (compiles are "
                     "single-flight on this node only)")
    fs_type, options = filesystem_of(directory / LOCKS_DIR if (directory / LOCKS_DIR).is_dir() else directory)
    coherent = flock_is_coherent(fs_type, options)
    if config.lock == "auto":
        kind = "flock" if coherent else "soft"
        why = ("flock is exclusive across nodes on it" if coherent
               else "flock there would lock on this node only; soft locks expire after KERNEL_CACHE_SOFT_LOCK_STALE")
        return Check("shared-lock", OK, f"auto chooses {kind} on {fs_type}: {why}"
                     + (" (if the flock probe succeeds at first use)" if coherent else ""))
    if config.lock == "flock" and not coherent:
        return Check("shared-lock", WARN, f"KERNEL_CACHE_LOCK=flock on {fs_type}, where flock may lock on this "
                     "node only: two nodes can compile the same kernel at once (never a wrong kernel)",
                     "unset KERNEL_CACHE_LOCK (auto picks soft locks here)")
    return Check("shared-lock", OK, f"{config.lock} (KERNEL_CACHE_LOCK) on {fs_type}")


def _cannot_hold_directories(parent: Path) -> str:
    """Why nothing can be created under `parent` (a kernel's pseudo-filesystem, a read-only mount);
    empty where it can, as far as can be told without creating anything."""
    fs_type, options = filesystem_of(parent)
    if fs_type in PSEUDO_FILESYSTEMS:
        return f"is on {fs_type}, a view of the kernel's state that holds no files of ours"
    try:
        read_only = bool(os.statvfs(parent).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    return "is on a read-only mount" if read_only or "ro" in options else ""


def _filesystem_row(name: str, directory: Path, local: bool) -> Check:
    where = _existing_parent(directory) or directory
    fs_type, options = filesystem_of(where)
    network = fs_type in NETWORK_FILESYSTEMS or fs_type.startswith("fuse")
    if local and network:
        return Check(name, WARN, f"{fs_type}: a network filesystem, where the local level's flock locks may "
                     "not be coherent", "put KERNEL_CACHE_DIR on a node-local disk; share kernels through "
                     "KERNEL_CACHE_SHARED_DIR")
    ro = " (mounted read-only)" if "ro" in options else ""
    return Check(name, OK, f"{fs_type}{ro}")


# Ownership -------------------------------------------------------------------------------------------
def _untrusted(path: Path, st: os.stat_result, owners: Owners | None) -> list[tuple[Path, str, str]]:
    """[(path, why, fix)] when `st` fails the ownership rule (safefs.Owners: what the levels enforce)."""
    problem = owners.problem(st) if owners is not None else None
    if not problem:
        return []
    if st.st_mode & stat.S_IWOTH:
        fix = f"chmod o-w {path}"
    elif st.st_mode & stat.S_IWGRP and owners is not None and st.st_gid not in owners.writer_gids:
        group = re.search(r"group (\S+),", problem)
        fix = (f"chmod g-w {path}, or trust that group: export KERNEL_CACHE_TRUSTED_GROUP="
               f"{group.group(1) if group else st.st_gid}")
    else:
        fix = "use a directory you own (mkdir -m 700 DIR), or trust its group with KERNEL_CACHE_TRUSTED_GROUP"
    return [(path, problem, fix)]


def _trusted(owners: Owners) -> str:
    who = owners.describe() + (" or root" if os.geteuid() != 0 else "")
    return f"owned by {who}, writable by no one else"


def _level(path: Path, owners: Owners | None) -> list[tuple[Path, str, str]]:
    """A level below the top: never a symbolic link, a directory, and (with `owners`) trusted."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return []
    except OSError as exc:
        return [(path, f"cannot be examined ({exc.strerror})", f"check the permissions of {path.parent}")]
    if stat.S_ISLNK(st.st_mode):
        return [(path, "is a symbolic link (never followed below a cache directory)",
                 f"replace {path} with a real directory")]
    if not stat.S_ISDIR(st.st_mode):
        return [(path, "is not a directory", f"remove {path} (kernel-cache recreates it)")]
    return _untrusted(path, st, owners)


def _ownership_problem(name: str, found: list[tuple[Path, str, str]], consequence: str,
                       alternative: str = "") -> Check:
    detail = "; ".join(f"{path} {why}" for path, why, _ in found[:3])
    if len(found) > 3:
        detail += f"; and {len(found) - 3} more"
    fixes = list(dict.fromkeys(fix for _, _, fix in found))
    return Check(name, PROBLEM, f"{detail}; {consequence}", "; ".join(fixes[:3]) + alternative)


def _existing_parent(path: Path) -> Path | None:
    return next((candidate for candidate in (path, *path.parents) if candidate.exists()), None)


# The remote level and the signing key -----------------------------------------------------------------
def _remote(config: Config, owners: Owners) -> list[Check]:
    """The Redis remote level: trusted (signing key or the operator's opt-in), reachable, its
    password accepted, TLS where asked, and an eviction policy that lets a full server make room."""
    if config.remote is None:
        return []
    url = redacted(config.remote)
    try:
        level = remote_level.open_from_config(config, owners, config.signer(), True)
    except Exception as exc:
        return [Check("remote", PROBLEM, f"{url}: {exc}", "set KERNEL_CACHE_SIGNING_KEY_FILE (every job that "
                      "reads or writes the remote), or KERNEL_CACHE_REMOTE_UNSIGNED=1 if every client is trusted")]
    assert level is not None
    try:
        info = level.describe()
    finally:
        level.close()
    if not info["reachable"]:
        error = notices.without_retry(str(info.get("error", "")))
        return [Check("remote", PROBLEM, f"{url}: unreachable ({error}); jobs compile and cache locally",
                      notices.fix_for(error))]
    tls = " over TLS" if config.remote.startswith("rediss://") else ""
    deployment = (f" (a cluster of {info.get('masters')} masters)" if info.get("cluster") else  # else one primary
                  " (a read-only replica: jobs read, write nothing there)" if info.get("role") == "slave" else "")
    checks = [Check("remote", OK, f"{url}{tls}: Redis {info['server_version']}{deployment}, "
                    f"{info['round_trip_ms']} ms round trip, namespace {info['namespace']}, "
                    + ("entries must be signed" if level.signer is not None else "unsigned entries accepted"))]
    policy = info.get("maxmemory_policy")
    if policy == "noeviction":
        checks.append(Check("remote-eviction", WARN, f"{url}: maxmemory-policy is noeviction: a full server "
                            f"refuses new kernels instead of dropping old ones",
                            "redis-cli CONFIG SET maxmemory-policy allkeys-lru (and set maxmemory)"))
    return checks


def _signing(config: Config) -> Check:
    signer = config.signer()
    return Check("signing-key", OK, "not set: shared entries are trusted by who owns them" if signer is None else
                 f"key id {signer.key_id.hex()}: entries written are signed; shared and bundled entries must "
                 "carry its signature")


# Interception -------------------------------------------------------------------------------------------
def _intercept(config: Config) -> list[Check]:
    """KERNEL_CACHE_INTERCEPT: the start-up hook and the adapters it needs, and the clients it names."""
    if not config.intercept:
        return [Check("intercept", OK, "KERNEL_CACHE_INTERCEPT unset: jax-triton, ejKernel and TE keep their own "
                      "compile paths (kernel_cache.intercept() in code still works)")]
    adapters = {ep.name for ep in importlib.metadata.entry_points(group=interception.ENTRY_POINT_GROUP)}
    hooks = [d for d in {*site.getsitepackages(), site.getusersitepackages()}
             if os.path.isfile(os.path.join(d, HOOK))]
    hook = Check("intercept-hook", OK, f"{HOOK} in {hooks[0]}") if hooks else Check(
        "intercept-hook", PROBLEM, f"{HOOK} is in no site-packages directory: nothing reads KERNEL_CACHE_INTERCEPT "
        "when Python starts", f"{INSTALL_HINT}, or call kernel_cache.intercept(...) before the model is traced")
    return [hook, *(_client(name, name in adapters, bool(hooks)) for name in config.intercept)]


def _client(name: str, adapter: bool, hooked: bool) -> Check:
    """One client KERNEL_CACHE_INTERCEPT names: its adapter registered, installed, a version it knows."""
    distribution, lowest, below = CLIENT_VERSIONS[name]
    row = f"intercept-{name}"
    if not adapter:
        return Check(row, PROBLEM, f"no '{name}' adapter in the {interception.ENTRY_POINT_GROUP} entry points "
                     "(kernel-cache only on PYTHONPATH?)", f"{INSTALL_HINT}: that registers its entry points")
    try:
        version = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return Check(row, WARN, f"{distribution} is not installed: nothing to intercept",
                     f"install {distribution}, or leave {name} out of KERNEL_CACHE_INTERCEPT")
    try:
        if below:  # the adapter's own gate, as it runs when the client loads
            check_version(name, distribution, lowest, below)
    except UnsupportedClient as exc:
        return Check(row, WARN, f"{exc}; its calls keep their own path, with one warning",
                     f"use a version of {distribution} kernel-cache knows")
    if hooked:
        return Check(row, OK, f"{distribution} {version}: its Triton calls are served from the store")
    # the adapter is ready but nothing installs it at start-up: not served by the variable alone
    return Check(row, WARN, f"{distribution} {version}: adapter ready, but served only where the program calls "
                 "kernel_cache.intercept() (see intercept-hook)")


# Toolchain ----------------------------------------------------------------------------------------------
def _toolchain(config: Config) -> list[Check]:
    rows = [Check("triton", OK, f"triton {tc.TRITON_VERSION}")]
    target = parse_target(config.target_arch or "sm_90")
    if target.backend != "cuda":
        return rows
    candidates = tc.ptxas_candidates(target)
    found = [p for p in candidates if os.path.isfile(p) and os.access(p, os.X_OK)]
    if not found:
        return [*rows, Check("ptxas", PROBLEM, f"no ptxas found (looked at {', '.join(candidates)}): Triton cannot "
                             "build cubins", "reinstall triton (its wheel ships ptxas) or set TRITON_PTXAS_PATH")]
    return [*rows, Check("ptxas", OK, f"{found[0]} ({_ptxas_version(found[0])})")]


def _ptxas_version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"--version failed: {exc}"
    match = re.search(r"release (\S+?),", out)
    return f"release {match.group(1)}" if match else "version unknown"


# jaxlib and the GPU ---------------------------------------------------------------------------------------
def _jaxlib(config: Config) -> list[Check]:
    version = ".".join(str(v) for v in jaxlib_compat.jaxlib_version())
    why = ""
    try:
        installed = jaxlib_compat.plugin_installed("cuda")
    except Exception as exc:
        installed, why = False, f" ({exc})"
    if not installed:
        # README, "Install into your environment": a GPU host takes jax's CUDA runtime with the plugin; a
        # host without a GPU the plugin alone (its dependencies are that runtime, useless there, and every
        # JAX start would print a cuDNN traceback)
        fix = (f'pip install "jax[cuda13]=={jax.__version__}"' if _nvidia_smi_lists_gpus() else
               f'pip install --no-deps "jax-cuda13-plugin=={version}" (no GPU here: the plugin alone, at '
               "jaxlib's exact version, without the CUDA runtime it depends on)")
        return [Check("jaxlib", PROBLEM, f"jaxlib {version} without a CUDA plugin with Triton support{why}: "
                      "lowering Triton calls for cuda fails", fix)]
    rows = [Check("jaxlib", OK, f"jaxlib {version} with its CUDA plugin")]
    if jaxlib_compat.ffi_target_registered("cuda"):
        rows.append(Check("jaxlib-ffi", OK, f"{jaxlib_compat.FFI_TARGET} registered: plain calls are "
                          "CUDA-graph compatible"))
    else:
        rows.append(Check("jaxlib-ffi", WARN, f"no {jaxlib_compat.FFI_TARGET}: calls use the legacy target, "
                          "which CUDA graphs cannot capture", "upgrade jaxlib and its CUDA plugin together"))
    if not jaxlib_compat.plugin_takes_module_image("cuda"):
        rows.append(Check("module-image", OK, "not in this jaxlib (needs > 0.11.0): jaxlib runs ptxas on the "
                          "cached PTX at each process's first launch"))
    elif not config.module_image:
        rows.append(Check("module-image", WARN, "supported, but KERNEL_CACHE_MODULE_IMAGE=0 sends PTX only "
                          "(ptxas runs at first launch)", "unset KERNEL_CACHE_MODULE_IMAGE"))
    else:
        rows.append(Check("module-image", OK, "the cached cubin travels in the kernel proto: no ptxas at first "
                          "launch"))
    return rows


def _gpu(config: Config) -> Check:
    platforms = os.environ.get("JAX_PLATFORMS", "").strip()
    if platforms and not {"cuda", "gpu"} & {p.strip() for p in platforms.lower().split(",")}:
        return Check("gpu", WARN, f"not probed: JAX_PLATFORMS={platforms} hides any GPU from JAX (kernels are "
                     "cross-lowered, never run)", "unset JAX_PLATFORMS (or include cuda) to run kernels on a GPU")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # a look, not a claim on a busy GPU
    try:
        devices = jax.devices("cuda")
    except Exception:
        devices = []
    if not devices:
        listed = _nvidia_smi_lists_gpus()
        why = ("nvidia-smi lists a GPU but JAX has no CUDA runtime (jax-cuda13-pjrt)" if listed
               else "no CUDA device visible to JAX")
        fix = (f'pip install "jax[cuda13]=={jax.__version__}"' if listed else
               "none needed to prewarm or cross-lower (KERNEL_CACHE_TARGET_ARCH or compute_capability=)")
        return Check("gpu", WARN, f"{why}: kernels can be built and lowered here, not run", fix)
    device = devices[0]
    kind = getattr(device, "device_kind", "GPU")
    major, _, minor = str(getattr(device, "compute_capability", "")).partition(".")
    arch = f"sm_{major}{minor or 0}" if major.isdigit() else "sm_?"
    detail = f"{len(devices)} x {kind} ({arch})"
    if config.target_arch and parse_target(config.target_arch).name != arch:
        return Check("gpu", WARN, f"{detail}, but KERNEL_CACHE_TARGET_ARCH={config.target_arch} makes kernels for "
                     f"{parse_target(config.target_arch).name} instead", "unset KERNEL_CACHE_TARGET_ARCH on GPU hosts")
    return Check("gpu", OK, detail)


def _nvidia_smi_lists_gpus() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU " in out.stdout
