"""KernelSpec: everything that decides a kernel's binary, built the way Triton's launcher would.

`make_spec` derives Triton's signature, constexprs and specialization attributes from what a caller
knows with Triton's own rules: 16-byte-aligned pointers and integers divisible by 16 get
`tt.divisibility`, integers equal to 1 become constexprs, `do_not_specialize` parameters are left alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from kernel_cache.entries.canonical import canonical
from kernel_cache.entries.canonical import canonical_text as encode
from kernel_cache.sanitize import echo
from kernel_cache.value_class import FrozenValue

from . import triton_compat as tc
from .target import Target, parse_target

SCALAR_TYPES = frozenset({"i1", "i8", "i16", "i32", "i64", "u1", "u8", "u16", "u32", "u64", "fp16", "bf16",
                          "fp32", "fp64"})
POINTER_DTYPES = SCALAR_TYPES | {"fp8e4nv", "fp8e5", "fp8e4b15", "fp8e4b8", "fp8e5b16"}  # a pointer may carry fp8 too
_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1

DEFAULT_OPTIONS: Mapping[str, Any] = MappingProxyType({"enable_fp_fusion": True, "debug": False})  # read-only


class Pointer(FrozenValue):
    """A device buffer argument: element type and whether it is 16-byte aligned."""

    _fields = ("dtype", "aligned")
    dtype: str
    aligned: bool

    def __init__(self, dtype: str, aligned: bool = True) -> None:
        if dtype.lstrip("*") not in POINTER_DTYPES:
            raise ValueError(f"unknown pointer element type {echo(dtype)}; expected one of {sorted(POINTER_DTYPES)}")
        self.__dict__.update(dtype=dtype.lstrip("*"), aligned=aligned)


class Scalar(FrozenValue):
    """A scalar argument with an explicit Triton type (e.g. a float beyond fp32's range as fp64);
    never specialized on its value."""

    _fields = ("type", "value")
    type: str
    value: bool | int | float

    def __init__(self, type: str, value: bool | int | float) -> None:
        if type not in SCALAR_TYPES:
            raise ValueError(f"unknown scalar type {echo(type)}; expected one of {sorted(SCALAR_TYPES)}")
        self.__dict__.update(type=type, value=value)


class TensorDesc(FrozenValue):
    """A host-side TMA descriptor argument (jax-triton 0.4's TensorDescriptor, Triton >= 3.7): compiled
    as Triton's `tensordesc<dtype[block]>` type; `shape`, `strides`, `padding` and `round_f32_to_tf32`
    are launch values, the kernel does not depend on them."""

    _fields = ("dtype", "block_shape", "layout", "shape", "strides", "padding", "round_f32_to_tf32")
    dtype: str
    block_shape: tuple[int, ...]
    layout: str | None  # the layout's repr, as jax-triton 0.4 spells it in the type
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    padding: str
    round_f32_to_tf32: bool

    def __init__(self, dtype: str, block_shape: tuple[int, ...], layout: str | None = None, shape: tuple[int, ...] = (),
                 strides: tuple[int, ...] = (), padding: str = "zero", round_f32_to_tf32: bool = False) -> None:
        self.__dict__.update(dtype=dtype, block_shape=block_shape, layout=layout, shape=shape, strides=strides,
                             padding=padding, round_f32_to_tf32=round_f32_to_tf32)

    @property
    def type_name(self) -> str:
        block = ",".join(str(int(b)) for b in self.block_shape)
        return f"tensordesc<{self.dtype}[{block}]" + (f",{self.layout}>" if self.layout is not None else ">")


def triton_value(value: Any) -> Any:
    """The tagged form of a value only Triton knows (the core's `canonical` extension): a @jit
    function passed as a constexpr, a triton.language dtype, a constexpr wrapper."""
    if tc.is_jit_function(value):
        return {"jit": tc.kernel_fingerprint(value)}
    if type(value).__name__ == "dtype" and hasattr(value, "name"):  # triton.language dtype
        return {"tl.dtype": str(value)}
    if type(value).__name__ == "constexpr" and hasattr(value, "value"):
        return canonical(value.value, triton_value)
    raise TypeError(f"cannot build a cache key from {type(value).__name__}: {echo(value)}")


class KernelSpec(FrozenValue):
    """The complete description of one compiled kernel, with one form: its canonical text
    (`canonical_text`), by which specs are equal and hashed."""

    _fields = ("kernel", "signature", "constexprs", "attrs", "target", "num_warps", "num_stages", "num_ctas", "options",
               "keep_ir")
    kernel: Any  # triton JITFunction
    signature: Mapping[str, Any]  # param -> triton type ("*fp32", "i32", "constexpr"; a tuple parameter: a tuple of them)
    constexprs: Mapping[str, Any]  # param -> value
    attrs: Mapping[tuple[Any, ...], list[Any]]  # (param index,) -> [["tt.divisibility", 16]]
    target: Target
    num_warps: int
    num_stages: int
    num_ctas: int
    options: Mapping[str, Any]  # other backend options
    keep_ir: bool  # keep TTIR/TTGIR/LLIR text in the artifact (debugging)

    def __init__(self, kernel: Any, signature: Mapping[str, Any], constexprs: Mapping[str, Any],
                 attrs: Mapping[tuple[Any, ...], list[Any]], target: Target, num_warps: int, num_stages: int,
                 num_ctas: int, options: Mapping[str, Any], keep_ir: bool) -> None:
        self.__dict__.update(kernel=kernel, signature=signature, constexprs=constexprs, attrs=attrs, target=target,
                             num_warps=num_warps, num_stages=num_stages, num_ctas=num_ctas, options=options,
                             keep_ir=keep_ir)

    @property
    def name(self) -> str:
        return str(self.kernel.__name__)

    @property
    def canonical_text(self) -> str:
        """This spec in the one canonical encoding, built once; TypeError for a value nothing can key."""
        found: str | None = self.__dict__.get("_canonical_text")
        if found is None:
            found = encode({
                "kernel": [self.name, self.kernel],
                "signature": [list(self.signature), list(self.signature.values())],  # in parameter order
                "constexprs": dict(self.constexprs),
                "attrs": dict(self.attrs),
                "target": self.target.json,
                "launch": [self.num_warps, self.num_stages, self.num_ctas],
                "options": dict(self.options),
                "keep_ir": self.keep_ir,
            }, triton_value)
            object.__setattr__(self, "_canonical_text", found)  # a cache of the fields, not a field
        return found

    def __eq__(self, other: object) -> bool:
        """Specs built alike from the same kernel source are one spec (the content key sees no more)."""
        if not isinstance(other, KernelSpec):
            return NotImplemented
        return self is other or self.canonical_text == other.canonical_text

    def __hash__(self) -> int:
        return hash(self.canonical_text)

    def triton_options(self) -> dict[str, Any]:
        return compile_options(self.num_warps, self.num_stages, self.num_ctas, self.options)

    def describe(self) -> str:
        """Log lines' form: `add_kernel sm_90 warps=4 stages=3 ctas=1 BLOCK=1024` (then non-default options)."""
        parts = [self.name, self.target.name, f"warps={self.num_warps}", f"stages={self.num_stages}",
                 f"ctas={self.num_ctas}"]
        parts += [f"{k}={_short(v)}" for k, v in self.constexprs.items()]
        parts += [f"{k}={_short(v)}" for k, v in self.options.items() if DEFAULT_OPTIONS.get(k, None) != v]
        return " ".join(parts)

    def summary(self) -> str:
        sig = ",".join(f"{k}:{v}" for k, v in self.signature.items() if v != "constexpr")
        cst = ",".join(f"{k}={_short(v)}" for k, v in self.constexprs.items())
        return (f"{self.target.name} warps={self.num_warps} stages={self.num_stages} ctas={self.num_ctas}"
                f" sig=[{sig}] constexprs=[{cst}]")


def _short(v: Any) -> str:
    text = getattr(v, "__name__", None) or repr(v)
    return text if len(text) <= 24 else text[:21] + "..."


def _check_scalar(name: str, value: Any) -> None:
    if not isinstance(value, (int, float)):  # a bool is an int
        raise TypeError(f"argument '{name}' must be a pointer type like '*fp32', a Pointer, or a Python "
                        f"int/float/bool scalar; got {type(value).__name__}: {echo(value)}")
    if isinstance(value, int) and not _INT64_MIN <= value <= _UINT64_MAX:
        raise ValueError(f"integer argument '{name}'={value} does not fit in 64 bits")


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {echo(value)}")
    return value


def _leaf_type(name: str, value: Any, no_spec: bool, no_align: bool, ann: str) -> tuple[str, Any]:
    """(Triton type, specialization attribute) of one runtime value, as Triton's launcher types it."""
    if isinstance(value, str):
        value = Pointer(value)
    if isinstance(value, Pointer):
        return tc.specialize(value.dtype, specialize=not no_spec, align=value.aligned and not no_align)
    if isinstance(value, Scalar):
        _check_scalar(name, value.value)
        return value.type, None
    if isinstance(value, TensorDesc):  # specialized as an aligned pointer to its elements, as jax-triton 0.4 does
        return value.type_name, tc.specialize(value.dtype, specialize=not no_spec, align=not no_align)[1]
    _check_scalar(name, value)
    floating = ann == "u1" or ann[:2] in ("fp", "bf")  # Triton never specializes annotated float/bool scalars
    ty, spec_attr = tc.specialize(value, specialize=not (no_spec or floating), align=not no_align)
    return (ann or ty), spec_attr  # an annotated scalar keeps its declared type, as in Triton's launcher


def _tuple_types(name: str, value: tuple[Any, ...], path: tuple[int, ...], no_spec: bool,
                 no_align: bool, attrs: dict[tuple[Any, ...], Any]) -> tuple[Any, ...]:
    """The nested signature of a tuple parameter, each leaf's attribute keyed by its path. An int equal
    to 1 stays a runtime value (jax-triton 0.4 specializes only top-level parameters on it)."""
    types: list[Any] = []
    for i, item in enumerate(value):
        where = (*path, i)
        if isinstance(item, tuple):
            types.append(_tuple_types(name, item, where, no_spec, no_align, attrs))
            continue
        ty, spec_attr = _leaf_type(name, item, no_spec, no_align, "")
        if ty == "constexpr":
            ty, spec_attr = tc.specialize(item, specialize=False, align=not no_align)
        types.append(ty)
        if isinstance(spec_attr, str):
            attrs[where] = spec_attr  # parsed with the others, in one call (`make_spec`)
    return tuple(types)


def compile_options(num_warps: int, num_stages: int, num_ctas: int, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options Triton's compile is given for a kernel launched so: a spec's, and a lowered call's."""
    return {"num_warps": num_warps, "num_stages": num_stages, "num_ctas": num_ctas, **DEFAULT_OPTIONS, **options}


def make_spec(kernel: Any, args: Sequence[Any], constexprs: Mapping[str, Any] | None = None, *,
              target: "Target | str | int", num_warps: int = 4, num_stages: int = 3, num_ctas: int = 1,
              keep_ir: bool = False, **options: Any) -> KernelSpec:
    """The spec for `kernel` called with `args` (each runtime argument in parameter order: a pointer
    type such as "*fp32", a Pointer, Scalar, TensorDesc or Python scalar) and `constexprs` (by name)."""
    fn = tc.unwrap_jit(kernel)
    tgt = parse_target(target)
    constexprs = dict(constexprs or {})
    flags = tc.param_flags(fn)
    names = [f[0] for f in flags]
    unknown = sorted(set(constexprs) - set(names))
    if unknown:
        raise ValueError(f"kernel '{fn.__name__}' has no parameter(s) {unknown}; parameters: {names}")
    for name, is_constexpr, *_ in flags:
        if is_constexpr and name not in constexprs:
            raise ValueError(f"constexpr parameter '{name}' of kernel '{fn.__name__}' needs a value")
    runtime_params = [f for f in flags if f[0] not in constexprs]
    if len(args) != len(runtime_params):
        raise ValueError(
            f"kernel '{fn.__name__}' takes {len(runtime_params)} runtime argument(s) "
            f"{[f[0] for f in runtime_params]} besides constexprs {sorted(constexprs)}, got {len(args)}")

    signature: dict[str, Any] = {}
    attrs: dict[tuple[Any, ...], Any] = {}  # path -> its specialization text, parsed below
    all_constexprs: dict[str, Any] = {}
    arg_iter = iter(args)
    for index, (name, _is_constexpr, no_spec, no_align, ann) in enumerate(flags):
        if name in constexprs:
            signature[name] = "constexpr"
            all_constexprs[name] = constexprs[name]
            continue
        value = next(arg_iter)
        if isinstance(value, tuple):  # a Triton tuple parameter: one type and attribute per leaf
            signature[name] = _tuple_types(name, value, (index,), no_spec, no_align, attrs)
            continue
        ty, spec_attr = _leaf_type(name, value, no_spec, no_align, ann)
        if ty == "constexpr":  # an int equal to 1, as Triton's launcher specializes it
            signature[name] = "constexpr"
            all_constexprs[name] = value
            continue
        signature[name] = ty
        if isinstance(spec_attr, str):
            attrs[(index,)] = spec_attr
    attrs = tc.parse_attrs(tgt.backend, attrs)  # each specialization text as Triton's attributes
    return KernelSpec(kernel=fn, signature=signature, constexprs=all_constexprs, attrs=attrs, target=tgt,
                      num_warps=_positive_int("num_warps", num_warps),
                      # Triton accepts 0 (no software pipelining; ejKernel's flash-attention backward uses it)
                      num_stages=_positive_int("num_stages", num_stages, minimum=0),
                      num_ctas=_positive_int("num_ctas", num_ctas), options={**DEFAULT_OPTIONS, **options},
                      keep_ir=keep_ir)
