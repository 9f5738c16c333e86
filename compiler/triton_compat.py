"""Every difference between Triton releases (3.6 – 3.9) that kernel-cache touches, in one place.

The compiler and the lowering reach Triton only through these helpers, so a new Triton release means
reading this file, not every package; capabilities are detected by attribute, not by version string.
The module is long because it is that one place: splitting it would scatter what a release changes.
Its memos are pure functions of their keys under the installed Triton: module-level, not the session's.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import inspect
import os
import sysconfig
import textwrap
import types
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import triton
from triton._C.libtriton import get_cache_invalidating_env_vars
from triton.language.core import constexpr
from triton.runtime.autotuner import Autotuner, Heuristics
from triton.runtime.cache import triton_key
from triton.runtime.jit import JITCallable, JITFunction  # JITCallable: a @jit or a constexpr function

from kernel_cache.bounded_memo import BoundedMemo
from kernel_cache.settings.environ_watch import EnvironMemo

if TYPE_CHECKING:
    from .target import Target

TRITON_VERSION: str = triton.__version__
BACKEND_DIRS = {"cuda": "nvidia", "hip": "amd"}  # a target's backend: its package under triton/backends
K = TypeVar("K")

def is_jit_function(obj: Any) -> bool:
    return isinstance(obj, JITFunction)


def unwrap_jit(obj: Any) -> JITFunction:
    """The JITFunction behind an Autotuner/Heuristics chain (they keep it in `.fn`)."""
    seen = 0
    while not isinstance(obj, JITFunction) and hasattr(obj, "fn") and seen < 8:
        obj, seen = obj.fn, seen + 1
    if not isinstance(obj, JITFunction):
        raise TypeError(f"kernel must be a @triton.jit function, got {type(obj).__name__}: {obj!r}")
    return obj


def is_autotuner(obj: Any) -> bool:
    """An @triton.autotune wrapper: its configs, keys and prune hooks below, what it wraps in `.fn`."""
    return isinstance(obj, Autotuner)


def unwrapped(kernel: Any) -> tuple[tuple[Any, ...], JITFunction]:
    """(the wrappers around `kernel`, outermost first; the JITFunction under them)."""
    wrappers = tuple(wrapper_chain(kernel))  # walked once: the JITFunction is under the innermost
    return wrappers, unwrap_jit(wrappers[-1].fn if wrappers else kernel)


def wrapper_chain(kernel: Any) -> Iterator[Any]:
    """The Autotuner and Heuristics wrappers around a kernel, outermost first (each wraps `.fn`)."""
    while isinstance(kernel, (Autotuner, Heuristics)):
        yield kernel
        kernel = kernel.fn


def autotune_configs(tuner: Any) -> list[Any]:
    """An Autotuner's configs (triton.Config: kwargs, num_warps, num_stages, num_ctas, pre_hook)."""
    return list(tuner.configs)


def autotune_keys(tuner: Any) -> list[str]:
    """The argument names an Autotuner keys its choice by."""
    return list(getattr(tuner, "keys", None) or [])


class PruneHooks(NamedTuple):
    """An Autotuner's `prune_configs_by`: the early prune, the perf model and its top_k."""

    early_config_prune: Callable[..., Any] | None
    perf_model: Callable[..., Any] | None
    top_k: Any  # an int, or a fraction of the configs <= 1.0


def prune_hooks(tuner: Any) -> PruneHooks:
    return PruneHooks(getattr(tuner, "early_config_prune", None), getattr(tuner, "perf_model", None),
                      getattr(tuner, "configs_top_k", 1.0))


def heuristic_values(heuristics: Any) -> dict[str, Callable[[dict[str, Any]], Any]]:
    """A Heuristics wrapper's {constexpr name: function of the launch's arguments}."""
    return dict(heuristics.values)


Reader = tuple[str, Any, tuple[str, ...]]  # a read the code depends on: (where, the namespace or module, the path)
_readers: BoundedMemo[int, tuple[Any, tuple[Reader, ...]]] = BoundedMemo.of(8192)  # id(fn) -> (fn, its readers)
_MAX_READERS = 256  # past this many reads in one kernel's call tree, the rest are not followed
_PLAIN = (int, float, str, bool, bytes, type(None))


def kernel_fingerprint(fn: Any) -> str:
    """Triton's cache key extended by the current values of the reads it is blind to (`helpers.FACTOR`,
    a plain global under TRITON_ALLOW_NON_CONSTEXPR_GLOBALS=1): found once per function, read on every
    call, so a global set at run time is a new kernel."""
    own = str(fn.cache_key)  # Triton's, memoized per function: its source, its @jit callees, constexpr globals
    readers = _readers_of(fn)
    if not readers:
        return own
    values = [(where, ".".join(path), value_text(_read(namespace, path))) for where, namespace, path in readers]
    return hashlib.sha256((own + repr(values)).encode()).hexdigest()


def _read(namespace: Any, path: tuple[str, ...]) -> Any:
    value = namespace.get(path[0]) if isinstance(namespace, dict) else getattr(namespace, path[0], None)
    for name in path[1:]:
        value = getattr(value, name, None)
    return value


def value_text(value: Any) -> str:
    """A value's `repr`, or its type's name where a repr could name an address (new in every process)."""
    if isinstance(value, constexpr):
        value = value.value
    if _is_value(value):
        return repr(value)
    kind = type(value)
    return f"<{kind.__module__}.{kind.__qualname__}>"


def _is_value(value: Any) -> bool:
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, tuple):
        return all(_is_value(item) for item in value)
    return type(value).__module__.startswith("triton.language")  # a dtype and its kin: repr is its name


def _readers_of(fn: Any) -> tuple[Reader, ...]:
    found = _readers.get(id(fn))
    if found is None or found[0] is not fn:
        collected: list[Reader] = []
        _collect(fn, collected, set())
        found = _readers.remember(id(fn), (fn, tuple(collected)))
    return found[1]


def _collect(fn: Any, out: list[Reader], seen: set[int]) -> None:
    """The reads Triton's key misses in `fn`'s body and in the @jit functions it calls."""
    if id(fn) in seen or len(out) >= _MAX_READERS:
        return
    seen.add(id(fn))
    try:
        source, globals_ = str(fn.src), fn.fn.__globals__  # what its body can name, its closure's too
        nonlocals = dict(inspect.getclosurevars(fn.fn).nonlocals)
        if not _may_read_blind(fn.fn.__code__, globals_, nonlocals, out, seen):
            return  # every name it uses is Triton's, a constexpr or a @jit function (followed): no parse
        tree = ast.parse(textwrap.dedent(source))
    except (AttributeError, OSError, SyntaxError, TypeError, ValueError):
        return  # nothing to read: Triton's key alone
    local = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
    local |= {arg.arg for node in ast.walk(tree) if isinstance(node, ast.arguments)
              for arg in (*node.posonlyargs, *node.args, *node.kwonlyargs)}
    where = getattr(fn, "__name__", "?")
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in local:
            scope = nonlocals if node.id in nonlocals else globals_ if node.id in globals_ else None
            if scope is not None:
                _consider(where, scope, (node.id,), _read(scope, (node.id,)), out, seen, named=True)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            path = _attribute_path(node)
            if path is None or path[0] in local:
                continue
            scope = nonlocals if path[0] in nonlocals else globals_ if path[0] in globals_ else None
            root = None if scope is None else _read(scope, path[:1])
            if isinstance(root, types.ModuleType) and not root.__name__.startswith("triton"):
                _consider(where, root, path[1:], _read(root, path[1:]), out, seen, named=False)


def _may_read_blind(code: types.CodeType, globals_: dict[str, Any], nonlocals: dict[str, Any], out: list[Reader],
                    seen: set[int]) -> bool:
    """Whether the code names a module outside Triton or a plain value: only then is the body parsed
    (most kernels name only `tl`, constexprs and @jit helpers, which are followed either way)."""
    names, pending = set(code.co_freevars), [code]
    while pending:
        current = pending.pop()
        names.update(current.co_names)
        pending.extend(const for const in current.co_consts if isinstance(const, types.CodeType))
    blind = False
    for name in names:
        value: Any = nonlocals[name] if name in nonlocals else globals_.get(name)
        kind = _kind(value)
        if kind == "jit":
            _collect(value, out, seen)
        elif kind == "module":
            blind = blind or not value.__name__.startswith("triton")
        elif kind == "value" or (kind == "constexpr" and name not in globals_):  # a nonlocal constexpr too
            blind = True
    return blind


def _kind(value: Any) -> str | None:
    """How a value a kernel names bears on its key: "jit" (followed: Triton hashes its own key),
    "module", "constexpr", "value" (data Triton's key may miss), or None (a function, a class, nothing)."""
    if isinstance(value, JITCallable):
        return "jit"
    if isinstance(value, types.ModuleType):
        return "module"
    if isinstance(value, constexpr):  # callable, like a function: asked first
        return "constexpr"
    if value is None or isinstance(value, type) or callable(value):
        return None
    return "value"


def _attribute_path(node: ast.Attribute) -> tuple[str, ...] | None:
    """`a.b.c` as ("a", "b", "c"); None where the chain does not start at a name."""
    names: list[str] = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        names.append(current.attr)
        current = current.value
    if not isinstance(current, ast.Name):
        return None
    return (current.id, *reversed(names))


def _consider(where: str, namespace: Any, path: tuple[str, ...], value: Any, out: list[Reader], seen: set[int],
              named: bool) -> None:
    """Follow a @jit callee; keep a read of a value Triton's key does not cover (a constexpr global
    read by name is in Triton's own key; one read through a module attribute is not)."""
    kind = _kind(value)
    if kind == "jit":
        _collect(value, out, seen)
        return
    if kind != "value" and not (kind == "constexpr" and not named):
        return
    if len(out) < _MAX_READERS and not any(n is namespace and p == path for _, n, p in out):
        out.append(("global" if named else "attribute", namespace, path))


def backend_class(backend_name: str) -> Any:
    """The compiler class of a backend ('cuda'/'hip') without instantiating it or its driver."""
    from triton.backends import backends

    found = backends.get(BACKEND_DIRS.get(backend_name, backend_name))
    if found is None:
        raise ValueError(f"the installed Triton has no '{backend_name}' backend (available: {sorted(backends)})")
    return found.compiler


def gpu_target(target: Target) -> Any:
    from triton.backends.compiler import GPUTarget

    return GPUTarget(target.backend, target.arch, target.warp_size)


@functools.cache
def make_backend(target: Target) -> Any:
    """A Triton backend object for a named target: no driver, no GPU needed."""
    return backend_class(target.backend)(gpu_target(target))


def int_type(value: int) -> str:
    """The Triton type an unannotated Python int argument gets."""
    if -(2**31) <= value < 2**31:
        return "i32"
    if -(2**63) <= value < 2**63:
        return "i64"
    return "u64"


@functools.lru_cache(maxsize=4096, typed=True)  # typed: True and 1 specialize differently
def specialize(value: Any, *, specialize: bool = True, align: bool = True) -> tuple[str, Any]:
    """(triton type, specialization) of a Python scalar or a pointer "*fp32" as Triton's launcher gives
    them: its native `specialize_impl` rules, re-implemented because that imports torch and gluon
    (seconds); tests/compiler/test_compiler.py checks them against it."""
    if isinstance(value, str):
        return "*" + value.lstrip("*"), ("D" if align else "") if specialize else None
    if isinstance(value, bool):
        return "u1", None
    if isinstance(value, int):
        if specialize and value == 1:
            return "constexpr", 1
        return int_type(value), (("D" if align and value % 16 == 0 else "") if specialize else None)
    if isinstance(value, float):
        return "fp32", None
    raise TypeError(f"cannot specialize a {type(value).__name__} argument")


def tma_host_elem_type(device_elem_type: int, round_f32_to_tf32: bool = False) -> int:
    """The CUtensorMapDataType a host builds a TMA descriptor with, from the element type Triton's
    compile metadata records (`tensordesc_meta`), as Triton's own launcher maps it."""
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST, TMA_TF32

    return int(TMA_DTYPE_DEVICE_TO_HOST[TMA_TF32 if round_f32_to_tf32 else device_elem_type])


def parse_attrs(backend_name: str, descs: dict[K, str]) -> dict[K, list[Any]]:
    """The backend's `parse_attr` of each specialization text in `descs`."""
    backend = backend_class(backend_name)
    return {where: list(backend.parse_attr(desc)) for where, desc in descs.items()}


# id(fn) -> (the function, kept so its id is not reused meanwhile, its flags, its defaults)
Flags = tuple[tuple[str, bool, bool, bool, str], ...]
_params: BoundedMemo[int, tuple[JITFunction, Flags, dict[str, Any]]] = BoundedMemo.of(8192)


def param_flags(fn: JITFunction) -> Flags:
    """Per parameter: (name, is_constexpr, do_not_specialize, do_not_specialize_on_alignment,
    annotation type or ""). Memoized per function (every lowered call asks)."""
    return _params_of(fn)[1]


def constexpr_defaults(fn: JITFunction) -> dict[str, Any]:
    """Default values declared for constexpr parameters (`BLOCK: tl.constexpr = 128`), a copy each time."""
    return dict(_params_of(fn)[2])


def _params_of(fn: JITFunction) -> tuple[JITFunction, Flags, dict[str, Any]]:
    found = _params.get(id(fn))
    if found is not None and found[0] is fn:
        return found
    flags, defaults = [], {}
    for p in fn.params:
        ann = getattr(p, "annotation_type", "") or ""
        flags.append((p.name, bool(p.is_constexpr), bool(getattr(p, "do_not_specialize", False)),
                      bool(getattr(p, "do_not_specialize_on_alignment", False)),
                      ann if isinstance(ann, str) else ""))
        if p.is_constexpr and getattr(p, "has_default", False):
            default = p.default
            defaults[p.name] = getattr(default, "value", default) if type(default).__name__ == "constexpr" else default
    return _params.remember(id(fn), (fn, tuple(flags), defaults))


# Triton's cache-invalidating environment, read again only where the C environment changed: a new
# object then, so its identity tells the memos of what Triton reads from the environment whether they stand.
triton_env = EnvironMemo(lambda: dict(get_cache_invalidating_env_vars()))


TRITON_DIR = os.path.dirname(str(triton.__file__))  # the installed package (a process's Triton never moves)
LIBTRITON = os.path.join(TRITON_DIR, "_C", f"libtriton.{sysconfig.get_config_var('EXT_SUFFIX').split('.')[-1]}")


# `triton_key_source_digest()` of each triton_key that `_triton_key_from` composes exactly (Triton
# 3.9's, the same text before it); another is run as Triton's own function, hashing every byte.
KNOWN_TRITON_KEYS = frozenset({"4e968c6ee769dee92e4ffbd0579aa4168bb1347d2d05c26939d22ab9ab5f0471"})


def triton_key_source_digest() -> str:
    """Which text of triton_key the installed Triton has ("" where its source cannot be read)."""
    try:
        lines = inspect.getsource(triton_key).splitlines()
    except (OSError, TypeError):
        return ""
    kept = [line.rstrip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return hashlib.sha256("\n".join(kept).encode()).hexdigest()


def triton_build_key(sha256_of: Callable[[list[str]], list[str]] | None = None) -> str:
    """The text `triton_key()` returns, composed from `sha256_of` (paths -> hex sha256, cheaper than
    reading them) where this shim knows the triton_key; otherwise Triton's own: only on a memo miss."""
    if sha256_of is not None and triton_key_source_digest() in KNOWN_TRITON_KEYS:
        return _triton_key_from(sha256_of)
    return str(triton_key())


def _triton_key_from(sha256_of: Callable[[list[str]], list[str]]) -> str:
    """Triton 3.9's triton_key (runtime/cache.py) with each file's sha256 taken from `sha256_of`."""
    import pkgutil

    import triton.runtime.cache as cache

    triton_path = os.path.dirname(os.path.dirname(os.path.abspath(cache.__file__)))

    def origins(sub: str) -> list[str]:  # every module pkgutil walks under triton/<sub>, in its order
        walked: Any = pkgutil.walk_packages([os.path.join(triton_path, sub)], prefix=f"triton.{sub}.")
        return [str(lib.module_finder.find_spec(lib.name).origin) for lib in walked]

    libtriton = os.path.join(triton_path, "_C", os.path.basename(LIBTRITON))
    files = [str(cache.__file__), *origins("compiler"), *origins("backends"), libtriton, *origins("language")]
    return f"{cache.__version__}" + "-".join(sha256_of(files))


def backend_toolchain_hash(target: Target) -> str:
    """The backend's own toolchain hash (runs `ptxas --version` on CUDA): call only on a memo miss."""
    return str(make_backend(target).hash())


def ptxas_candidates(target: Target) -> list[str]:
    """Every ptxas Triton may run for a CUDA target, found by name only: asking Triton's knobs would
    run `ptxas --version`, which a warm process must not do."""
    if target.backend != "cuda":
        return []
    bin_dir = os.path.join(TRITON_DIR, "backends", "nvidia", "bin")
    names = ("ptxas", "ptxas-blackwell")
    overrides = [os.environ.get(f"TRITON_{n.upper().replace('-', '_')}_PATH", "") for n in names]
    return [p for p in overrides if p] + [os.path.join(bin_dir, n) for n in names]


def parse_options(target: Target, options: dict[str, Any]) -> Any:
    """The backend's options object as Triton's compile parses it (defaults read the environment). Not
    memoized: a miss compiles for seconds, and a warm lowering's inputs are (`compiler.inputs`)."""
    return make_backend(target).parse_options(dict(options))


def options_to_json(parsed: Any) -> dict[str, Any]:
    return {k: [list(x) if isinstance(x, tuple) else x for x in v] if isinstance(v, tuple) else v
            for k, v in sorted(parsed.__dict__.items())}


def ast_source(fn: JITFunction, signature: dict[str, Any], constexprs: dict[str, Any], attrs: dict[str, Any]) -> Any:
    from triton.compiler import ASTSource

    return ASTSource(fn, signature=signature, constexprs=constexprs, attrs=attrs)


def run_stages(src: Any, target: Target, parsed_options: Any,
               on_stage: Callable[[str], None] | None = None, *, keep: Collection[str] | None = None,
               front_end: contextlib.AbstractContextManager[Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """triton.compile's pipeline without its cache: (outputs by extension, those in `keep`: a module not
    kept is never printed; metadata). `on_stage(ext)` before each stage lets errors name it; `front_end`
    is held around AST to TTIR (`compile.FRONT_END`)."""
    from triton._C.libtriton import ir

    backend = make_backend(target)
    metadata: dict[str, Any] = {
        "hash": "kernel-cache",
        "target": gpu_target(target),
        **parsed_options.__dict__,
        **triton_env.get(),
        "triton_version": TRITON_VERSION,
    }
    stages: dict[str, Any] = {}
    backend.add_stages(stages, parsed_options, src.language)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    codegen_fns = backend.get_codegen_implementation(parsed_options)
    module_map = backend.get_module_map()
    if on_stage:
        on_stage("ast")
    with front_end or contextlib.nullcontext():
        module = src.make_ir(gpu_target(target), parsed_options, codegen_fns, module_map, context)
    outputs: dict[str, Any] = {}
    for ext, compile_ir in stages.items():
        if on_stage:
            on_stage(ext)
        module = compile_ir(module, metadata)
        if keep is None or ext in keep:
            outputs[ext] = module if isinstance(module, (bytes, str)) else str(module)
    return outputs, metadata
