"""A lowered call's key, a pure function of its plan and of the installation (our own source among
it: an edited module is a new key, never a stale payload), in the core's canonical encoding; and
its signature (`signed_call`), the same record named from what the rule is given, unplanned
(docs/design.md, "Signatures"). A value with no canonical form leaves the call keyless (lowered
kernel by kernel, unrecorded); one with no value form, unsigned (planned every time).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any, cast

import xxhash

import compiler
from compiler import Target, toolchain
from compiler import inputs as compile_inputs
from compiler import triton_compat as tc
from compiler.spec import compile_options, triton_value
from compiler.toolchain import installed_tools
from kernel_cache import Config
from kernel_cache.bounded_memo import BoundedMemo
from kernel_cache.entries.canonical import canonical, canonical_text, items_text, spliced_digest

from ..payload import jaxlib_compat as compat
from ..planning.bound_call import BoundCall
from ..planning.configs import DEFAULT_NUM_STAGES, DEFAULT_NUM_WARPS
from ..planning.plan import Evaluation, KernelPlan, call_options, target_of
from . import value_form
from .winners import gpu_model

FORMAT = 3  # 3: each config's compile inputs as the content key states them (compiler.inputs)


def call_key(plan: KernelPlan, device: str | None, module: Any, config: Config) -> str | None:
    """The key of `plan`'s record (None: something in it has no canonical form). `device`: the GPU
    model winners are looked up for (None: they do not apply). Each config is keyed with its compile
    inputs, as its kernels' content keys are, so the two keys move together."""
    try:
        configs = [[dict(c.constexprs), c.num_warps, c.num_stages, c.num_ctas, launch.grid,
                    sorted(launch.zeroed_bytes.items()), c.description, sorted(launch.bound),
                    compile_inputs.digest_of(plan.target, compile_options(c.num_warps, c.num_stages, c.num_ctas,
                                                                          plan.options))]
                   for c, launch in zip(plan.configs, plan.launches, strict=True)]
        head = static_text(plan.fn, plan.target, plan.platform)
        rest = [device, plan.args, plan.options, configs, list(plan.info), plan.shapes]
        return spliced_digest(head, rest, lowering_value, rest_head=module_text(module, plan.platform, config))
    except TypeError:
        return None


# A call's options -> (the environment, the installed tools' generation, its compile inputs' digest):
# valid while both are unchanged, so module-level. A signed call asks here without entering the compiler.
_inputs: dict[tuple[Any, ...], tuple[object, int, str]] = {}


def call_inputs(target: Target, call: BoundCall, env: object) -> str:
    """The compile inputs' digest of a call's options, unplanned, at the default warps and stages (the
    signature holds the call's own), so a program's calls share a handful of digests. `env`: Triton's
    environment as just read, whose identity says whether a digest stands."""
    ident = (target, call.num_ctas, call.enable_fp_fusion, call.debug, call.backend_options)
    found = _inputs.get(ident)  # TypeError for an unhashable option: the call is keyless
    if found is None or found[0] is not env or found[1] != toolchain.generation:
        options = compile_options(DEFAULT_NUM_WARPS, DEFAULT_NUM_STAGES, call.num_ctas, call_options(call))
        found = (env, toolchain.generation, compile_inputs.digest_of(target, options))
        if len(_inputs) >= 1024:
            _inputs.clear()
        _inputs[ident] = found
    return found[2]


SIGNATURE_FORMAT = 3  # 3: the call's compile inputs (compiler.inputs) at its own options


def signed_call(platform: str, avals_in: Sequence[Any], avals_out: Sequence[Any], params: Mapping[str, Any],
                module: Any, config: Config, evaluation: Evaluation | None = None) -> tuple[str, str] | None:
    """(the call's signature, its lineage), or None where some input has no value form (a signature's
    document starts otherwise than every key's, so the two never name one another). The lineage names
    the same call under any toolchain, environment, jaxlib or target (docs/design.md, "Cold start")."""
    if params.get("arg_tree") is not None:
        return None
    try:
        call = evaluation.call if evaluation is not None else BoundCall(**params)
        wrappers, fn = tc.unwrapped(call.kernel)
        target = target_of(platform, call.compute_capability, config.target_arch)
        head = static_text(fn, target, platform)
        env = tc.triton_env.get()  # one read of the environment for the whole signature
        modules = module_text(module, platform, config, env)
        inputs = call_inputs(target, call, env)
        device = gpu_model(platform, config) if wrappers and config.winners else None  # as `call_records.find` keys it
        evaluation = evaluation or Evaluation(avals_in, avals_out, call)
        own = value_form.call_form(avals_in, avals_out, fn, wrappers, device, params, evaluation)
    except TypeError:  # not a kernel (its plan says so), or some input has no value form
        return None
    python_fn = getattr(fn, "fn", fn)  # the decorated Python function: the name a recipe gives the kernel
    signature = ("kernel-cache call signature", str(SIGNATURE_FORMAT), head, modules, inputs, "")
    lineage = ("kernel-cache call lineage", str(SIGNATURE_FORMAT), platform, getattr(python_fn, "__module__", ""),
               getattr(python_fn, "__qualname__", ""), "")
    return (str(xxhash.xxh3_128_hexdigest("\0".join(signature).encode() + own)),
            str(xxhash.xxh3_128_hexdigest("\0".join(lineage).encode() + own)))


# (id of a kernel function, its Triton fingerprint, target, platform, installed tools' generation) ->
# (the function, its text): keyed by id, as the function's own hash is Triton's cache key, computed per ask
_static: BoundedMemo[tuple[Any, ...], tuple[Any, str]] = BoundedMemo()


def static_text(fn: Any, target: Target, platform: str) -> str:
    """The key's text for what one @jit function on one target shares across its calls in this
    installation: the code, target and tools, the function's name, fingerprint and parameters' flags
    (fixed at decoration). The function is kept with the text, so the memo never answers for another
    function that reuses its id."""
    fingerprint = tc.kernel_fingerprint(fn)
    memo_key = (id(fn), fingerprint, target, platform, toolchain.generation)
    found = _static.get(memo_key)
    if found is None or found[0] is not fn:
        installation = items_text(["kernel-cache lowered call", FORMAT, code_identity(), platform, target.json,
                                   installed_tools(target)], lowering_value)
        own = items_text([fn.__name__, fingerprint, [list(flags) for flags in tc.param_flags(fn)]], lowering_value)
        found = _static.remember(memo_key, (fn, '{"list":[' + installation + "," + own + "]}"))
    return found[1]


def module_text(module: Any, platform: str, config: Config, env: dict[str, str] | None = None) -> str:
    """The text of Triton's cache-invalidating environment and jaxlib's capabilities, once per JAX
    module lowered (nothing between one module's lowering rules can change them). Kept in the module's
    own `lowering_cache` dict, so it dies with the module: not keyed by the module (a strong reference
    slows every later lowering) nor by its MLIR context (JAX 0.12 reuses one for up to 10 modules)."""
    cache = getattr(module, "lowering_cache", None)
    memo_key = ("lowering.records.call_key", platform)  # our entry in the module's own per-module cache
    if isinstance(cache, dict) and memo_key in cache:
        return cast(str, cache[memo_key])
    env_items = tuple(sorted((env if env is not None else tc.triton_env.get()).items()))
    capabilities = compat.capabilities(platform, config)
    part = _module_part(env_items, tuple(capabilities), tuple(map(type, capabilities)))
    if isinstance(cache, dict):
        cache[memo_key] = part
    return part


@functools.lru_cache(maxsize=256)
def _module_part(env_items: tuple[tuple[str, str], ...], capabilities: tuple[Any, ...], types: tuple[type, ...]) -> str:
    """Their text, kept: it changes rarely (the types keep 1 and True apart in the memo)."""
    return canonical_text([list(env_items), *capabilities], lowering_value)


@functools.cache
def code_identity() -> str:
    """xxh3 of the compiler and lowering packages' sources: a payload is only reused by the code that
    would build it the same way. TypeError (calls not recorded) where the sources cannot be read."""
    hasher, read = xxhash.xxh3_128(), 0
    for package in (compiler, __import__((__package__ or "lowering").partition(".")[0])):
        root = os.path.dirname(package.__file__ or "")
        for folder, dirs, files in sorted(os.walk(root)):
            dirs.sort()
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                hasher.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as f:
                    hasher.update(f.read())
                read += 1
    if not read:
        raise TypeError("the compiler and lowering sources are not readable: calls are not recorded")
    return hasher.hexdigest()


def lowering_value(value: Any) -> Any:
    """The canonical encoder's extension for a call's key: a typed scalar, a TMA descriptor, then Triton's values."""
    kind = type(value)
    if kind is compiler.Scalar:
        return {"scalar": [value.type, canonical(value.value, lowering_value)]}
    if kind is compiler.TensorDesc:
        return {"tensordesc": canonical([value.type_name, list(value.shape), list(value.strides), value.padding,
                                         value.round_f32_to_tf32], lowering_value)}
    return triton_value(value)
