"""Turn a kernel (JITFunction, Autotuner, Heuristics, in any nesting) into the launch configs to compile.

Each config is evaluated here, per config, exactly as Triton would at launch: heuristics see the
named arguments plus `{**metaparams, **config.kwargs}`, and callable grids / zeroed_outputs are
evaluated with the same dictionary, so every config launches its own grid.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, cast

from compiler import Scalar, triton_compat

from .bound_call import BoundCall

DEFAULT_NUM_WARPS, DEFAULT_NUM_STAGES = 4, 3  # Triton's, where neither the call nor a config says


class LaunchConfig(NamedTuple):
    """One candidate launch: constexprs and launch parameters, plus how to describe it. While the
    wrappers resolve it, `constexprs` holds the config's own kwargs, where heuristics set their values."""

    constexprs: dict[str, Any]  # {**defaults, **metaparams, **config.kwargs, **heuristics}
    num_warps: int
    num_stages: int
    num_ctas: int
    description: str


def _autotuner_configs(tuner: Any, named_args: dict[str, Any], metaparams: Mapping[str, Any]) -> list[LaunchConfig]:
    configs = triton_compat.autotune_configs(tuner)
    for i, config in enumerate(configs):
        if getattr(config, "pre_hook", None) is not None:
            raise NotImplementedError(
                f"autotune config #{i} ({config}) of kernel '{kernel_name(tuner)}' has a pre_hook; "
                f"pre_hooks run Python on device buffers at launch, which a JAX custom call cannot do")
    kept = [c for c in configs if all(c.kwargs.get(k, v) == v for k, v in metaparams.items())]
    if not kept:
        raise ValueError(f"every autotune config of kernel '{kernel_name(tuner)}' conflicts with the "
                         f"metaparameters passed to triton_call: {dict(metaparams)}")
    prune, perf_model, top_k = triton_compat.prune_hooks(tuner)
    if prune is not None:
        kept = list(prune(kept, named_args))
    if perf_model is not None:  # the top_k configs it predicts fastest, as Triton's prune_configs keeps
        if isinstance(top_k, float) and top_k <= 1.0:
            top_k = int(len(kept) * top_k)
        if not isinstance(top_k, int):
            raise TypeError(f"autotune top_k of kernel '{kernel_name(tuner)}' must be an int or a fraction <= 1.0")
        if len(kept) > top_k:
            estimates = [perf_model(**named_args, **metaparams, **c.all_kwargs()) for c in kept]
            kept = [kept[i] for i in sorted(range(len(kept)), key=lambda i: estimates[i])[:max(top_k, 1)]]
    return [LaunchConfig(dict(c.kwargs), c.num_warps if c.num_warps is not None else DEFAULT_NUM_WARPS,
                         c.num_stages if c.num_stages is not None else DEFAULT_NUM_STAGES,
                         getattr(c, "num_ctas", 1) or 1, str(c)) for c in kept]


def set_by_wrappers(kernel: Any) -> set[str]:
    """Names the kernel's Autotuner configs and Heuristics set: constexprs, whatever the annotation."""
    names: set[str] = set()
    for wrapper in triton_compat.unwrapped(kernel)[0]:
        if triton_compat.is_autotuner(wrapper):
            names.update(k for config in triton_compat.autotune_configs(wrapper) for k in config.kwargs)
        else:
            names.update(triton_compat.heuristic_values(wrapper))
    return names


def runtime_param_names(kernel: Any, metaparams: Mapping[str, Any]) -> list[str]:
    """The kernel's parameters Triton binds the positional runtime arguments to, in order: those not
    constexprs (annotated, or set by the caller, an autotune config or a heuristic). Heuristics, perf
    models, prune functions and descriptions all see these names."""
    wrappers, fn = triton_compat.unwrapped(kernel)
    constexprs = set(metaparams) | set_by_wrappers(wrappers[0]) if wrappers else metaparams  # [0]: the outermost
    return [name for name, is_constexpr, *_ in triton_compat.param_flags(fn)
            if not is_constexpr and name not in constexprs]


def kernel_name(kernel: Any) -> str:
    """The kernel's function name under any Autotuner/Heuristics wrappers (its repr if not a kernel)."""
    try:
        return str(triton_compat.unwrap_jit(kernel).__name__)
    except TypeError:
        return repr(kernel)


def _resolve(wrappers: tuple[Any, ...], configs: list[LaunchConfig], named_args: dict[str, Any],
             metaparams: Mapping[str, Any]) -> list[LaunchConfig]:
    """The configs once the wrappers (outermost first) had their say: an Autotuner's replace those
    given, a Heuristics sets its values in each config below it."""
    if not wrappers:
        return configs
    wrapper, inner = wrappers[0], wrappers[1:]
    if triton_compat.is_autotuner(wrapper):
        return _resolve(inner, _autotuner_configs(wrapper, named_args, metaparams), named_args, metaparams)
    configs = _resolve(inner, configs, named_args, metaparams)
    for config in configs:
        for name, heuristic in triton_compat.heuristic_values(wrapper).items():
            config.constexprs[name] = heuristic({**named_args, **metaparams, **config.constexprs})
    return configs


class Resolved(NamedTuple):
    """A call's kernel resolved; per config its grid and the outputs it zeroes (the user's indices,
    sorted). A tuple: built on every call, without a frozen dataclass's setattr per field."""

    named: dict[str, Any]
    fn: Any
    configs: list[LaunchConfig]
    grids: list[tuple[int, int, int]]
    zeroed: list[tuple[int, ...]]


def resolve(call: BoundCall, runtime_values: list[Any]) -> Resolved:
    """Everything the call's configs decide, evaluated per config as Triton's launch would."""
    meta = dict(call.metaparams.items())
    wrappers, fn = triton_compat.unwrapped(call.kernel)
    names = runtime_param_names(call.kernel, meta)
    if len(runtime_values) > len(names):
        raise TypeError(f"kernel '{fn.__name__}' takes {len(names)} runtime arguments ({', '.join(names)}), "
                        f"got {len(runtime_values)} (inputs, scalars and outputs together)")
    named = dict(zip(names, runtime_values))
    # a plain kernel's one config from the caller's launch parameters, then the wrappers'
    default = LaunchConfig({}, DEFAULT_NUM_WARPS if call.num_warps is None else call.num_warps,
                           DEFAULT_NUM_STAGES if call.num_stages is None else call.num_stages, call.num_ctas, "default")
    defaults = triton_compat.constexpr_defaults(fn)  # `BLOCK: tl.constexpr = 128` when nothing sets it
    configs = [c._replace(constexprs={**defaults, **meta, **c.constexprs})
               for c in _resolve(wrappers, [default], named, meta)]
    grid, zeroed_outputs = call.grid, call.zeroed_outputs
    if not (callable(grid) or callable(zeroed_outputs)):  # the same for every config: evaluated once
        return Resolved(named, fn, configs, [normalize_grid(grid, {})] * len(configs),
                        [tuple(sorted(zeroed_outputs or ()))] * len(configs))
    # a callable grid or zeroed_outputs sees the scalar runtime arguments beside the constexprs, as Triton's
    # launcher passes them: `meta["n_elements"]` reads a scalar keyword in jax-triton 0.4's reading and 0.3's
    scalars = {name: value.value if isinstance(value, Scalar) else value for name, value in named.items()
               if isinstance(value, (bool, int, float, Scalar))}
    metas = [{**scalars, **c.constexprs} for c in configs]
    return Resolved(named, fn, configs, [normalize_grid(grid, m) for m in metas],
                    [tuple(sorted(per_config(zeroed_outputs, m) or ())) for m in metas])


def per_config(value: Any, constexprs: Mapping[str, Any]) -> Any:
    return value(dict(constexprs)) if callable(value) else value


def normalize_grid(grid: Any, constexprs: Mapping[str, Any]) -> tuple[int, int, int]:
    grid = per_config(grid, constexprs)
    if isinstance(grid, int) or hasattr(grid, "__index__"):
        grid = (grid,)
    grid = tuple(int(g) for g in grid)
    if not 1 <= len(grid) <= 3:
        raise ValueError(f"grid must have 1 to 3 dimensions, got {grid}")
    if any(g < 0 for g in grid):
        raise ValueError(f"grid dimensions must be non-negative, got {grid}")
    return cast("tuple[int, int, int]", grid + (1,) * (3 - len(grid)))  # 1 to 3 ints, padded to 3


