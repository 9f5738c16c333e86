"""A lowered call's key: a pure function of its plan (and facts of the installation), computed
without building a kernel spec, a content key or a proto. The key covers everything the payload is
built from:
  - the kernel function: its name, Triton's own cache key (source, called @jit functions, globals)
    and its parameters' flags (do_not_specialize, annotations);
  - the runtime arguments (pointer types, scalar values), the launch options, and per config its
    constexprs, warps, stages, CTAs, grid, zeroed outputs and description;
  - the call's name, aliases, operand shapes and dtypes, serialized metadata and debug flag;
  - the target, the toolchain fingerprint, jaxlib's version and module-image layout, the GPU model
    winners are looked up for (where they apply), and the source of this project's compiler and
    lowering packages (an edited module is a new key, never a stale payload).
The document is in the core's one canonical encoding (`kernel_cache.entries.canonical`, with the compiler's
Triton values and this floor's `Scalar` and `TensorDesc`) and hashed by its digest: the int 1, the
float 1.0, True and "1" differ; anything that has no canonical form (an object keyed by identity)
makes the call keyless, and it is lowered kernel by kernel, unrecorded.

What many calls share is encoded once and spliced in as text (JSON text is compositional): the
installation's part per target and the kernel function's own, for the process (`installation_text`,
`function_text`), joined per function and target in the record store's session memo (`static_text`);
Triton's environment with jaxlib's capabilities per JAX module (`module_text`).

A call's signature (`signature`) names its record as exactly, from what the rule is given, unplanned:
the plan is a pure function of the platform, the operands' and results' avals, the primitive's
parameters, the target, the installation and the kernel, so their digest, where each has a value
form (`value_form`), names one plan and so one key; the program's warm set keeps signature -> key
from the run before (`call_records.find_signed`). Planning is most of a warm lowering; the signature
costs a third of planning and keying. Only calls whose every input has a value form have one: the
@triton.jit function by Triton's fingerprint, its parameters' flags and its constexpr defaults (which
the plan reads and a global can set); an Autotuner around it by its keys, its configs' every field and
the GPU model its winners are looked up for; a grid and zeroed outputs written as functions by what
they evaluate to per config (all the plan keeps of them); no tuple parameters. A heuristic, a prune
hook or perf model and a pre_hook (functions whose effect only the plan evaluates) leave the call to
its plan.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import xxhash

import compiler
from compiler import Target, toolchain
from compiler import inputs as compile_inputs
from compiler import triton_compat as tc
from compiler.spec import compile_options, triton_value
from compiler.toolchain import installed_tools, triton_env
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
# A static part's memo: (kernel function, its Triton fingerprint, target, platform) -> (function, text)
StaticMemo = BoundedMemo[tuple[Any, ...], tuple[Any, str]]


def call_key(plan: KernelPlan, device: str | None, module: Any, config: Config, static: StaticMemo) -> str | None:
    """The key of `plan`'s record (None: something in it has no canonical form). `device`: the GPU
    model winners are looked up for (None: they do not apply to this call); `module`: the JAX module
    being lowered (`module_text`); `static`: the memo of `static_text`. Each config is keyed with its
    compile inputs (`compiler.inputs.digest_of` the options its spec is given): what the
    content keys of its kernels embed, so the two keys move together under any option or environment."""
    try:
        configs = [[dict(c.constexprs), c.num_warps, c.num_stages, c.num_ctas, launch.grid,
                    sorted(launch.zeroed_bytes.items()), c.description, sorted(launch.bound),
                    config_inputs(plan.target, c.num_warps, c.num_stages, c.num_ctas, plan.options)]
                   for c, launch in zip(plan.configs, plan.launches, strict=True)]
        head = static_text(plan.fn, plan.target, plan.platform, static)
        rest = [device, plan.args, plan.options, configs, list(plan.info), plan.shapes]
        return spliced_digest(head, rest, lowering_value, rest_head=module_text(module, plan.platform, config))
    except TypeError:
        return None


def config_inputs(target: Target, num_warps: int, num_stages: int, num_ctas: int, options: Mapping[str, Any]) -> str:
    """The compile inputs' digest of a config launched so (`compiler.inputs`): what its spec's content key embeds."""
    return compile_inputs.digest_of(target, compile_options(num_warps, num_stages, num_ctas, options))


def call_inputs(target: Target, call: BoundCall, env: object) -> str:
    """The compile inputs' digest of a call's options, unplanned: what its signature hashes. Its warps
    and stages are taken at their defaults: the signature holds the call's own (and its configs'),
    and what the environment decides is the same for every config, so the calls of a program share a
    handful of digests. `env`: Triton's environment as just read (`triton_compat.triton_env`), whose
    identity says whether a digest stands."""
    ident = (target, call.num_ctas, call.enable_fp_fusion, call.debug, call.backend_options)
    return _inputs_digest(ident, target, env, lambda: compile_options(
        DEFAULT_NUM_WARPS, DEFAULT_NUM_STAGES, call.num_ctas, call_options(call)))


# A call's options (and CTAs) -> (the environment's state then, the installed tools' generation
# then, the digest of its compile inputs): valid while both are unchanged (a fact of the
# process's environment and installation, so module-level; see `kernel_cache.session`). A signed
# call asks here without entering the compiler's modules.
_inputs: dict[tuple[Any, ...], tuple[object, int, str]] = {}


def _inputs_digest(ident: tuple[Any, ...], target: Target, env: object, options: Callable[[], dict[str, Any]]) -> str:
    found = _inputs.get(ident)  # TypeError for an unhashable option: the call is keyless
    if found is None or found[0] is not env or found[1] != toolchain.generation:
        found = (env, toolchain.generation, compile_inputs.digest_of(target, options()))
        if len(_inputs) >= 1024:
            _inputs.clear()
        _inputs[ident] = found
    return found[2]


SIGNATURE_FORMAT = 3  # 3: the call's compile inputs (compiler.inputs) at its own options


def signature(platform: str, avals_in: Sequence[Any], avals_out: Sequence[Any], params: Mapping[str, Any],
              module: Any, config: Config, static: StaticMemo, evaluation: Evaluation | None = None) -> str | None:
    """The call's signature (see the module's docstring), or None where some input has no value form.
    Its document starts otherwise than every key's, so the two never name one another. `evaluation`:
    the call's user functions, evaluated once for this lowering (its plan reads the same values)."""
    found = signed_call(platform, avals_in, avals_out, params, module, config, static, evaluation)
    return None if found is None else found[0]


def signed_call(platform: str, avals_in: Sequence[Any], avals_out: Sequence[Any], params: Mapping[str, Any],
                module: Any, config: Config, static: StaticMemo, evaluation: Evaluation | None = None
                ) -> tuple[str, str] | None:
    """(the call's signature, its lineage), or None where some input has no value form. The lineage
    names the same call under any toolchain, environment, jaxlib or target: the kernel by module and
    name, and the call's value form. It finds what the program compiled before an upgrade (a warm
    set's predecessor), a guess whose only cost when wrong is compile work."""
    if params.get("arg_tree") is not None:
        return None
    try:
        call = evaluation.call if evaluation is not None else BoundCall(**params)
        wrappers, fn = tc.unwrapped(call.kernel)
        target = target_of(platform, call.compute_capability, config)
        head = static_text(fn, target, platform, static)
        env = triton_env.get()  # one read of the environment for the whole signature
        modules = module_text(module, platform, config, env)
        inputs = call_inputs(target, call, env)
        device = gpu_model(platform, config) if wrappers and config.winners else None  # as `call_records.find` keys it
        evaluation = evaluation or Evaluation(avals_in, avals_out, call)
        own = value_form.call_form(avals_in, avals_out, fn, wrappers, device, params, evaluation)
    except TypeError:  # not a kernel (its plan says so), or some input has no value form
        return None
    hasher = xxhash.xxh3_128("\0".join(("kernel-cache call signature", str(SIGNATURE_FORMAT), head, modules, inputs,
                                        "")).encode())
    hasher.update(own)
    python_fn = getattr(fn, "fn", fn)  # the decorated Python function: the name a recipe gives the kernel
    lineage = xxhash.xxh3_128("\0".join(("kernel-cache call lineage", str(SIGNATURE_FORMAT), platform,
                                         getattr(python_fn, "__module__", ""), getattr(python_fn, "__qualname__", ""),
                                         "")).encode())
    lineage.update(own)
    return str(hasher.hexdigest()), str(lineage.hexdigest())


def static_text(fn: Any, target: Target, platform: str, memo: StaticMemo) -> str:
    """The key's text for what one kernel function (`fn`, the @jit function under any wrappers) on
    one target shares across its calls: the installation's part (`installation_text`) and the
    function itself (Triton's environment and jaxlib's capabilities are read per module:
    `module_text`). The function is kept with the text, so the memo never answers for another
    function that reuses its id."""
    fingerprint = tc.kernel_fingerprint(fn)
    memo_key = (id(fn), fingerprint, target, platform)
    found = memo.get(memo_key)
    if found is None or found[0] is not fn:
        own = function_text(fn, fingerprint)
        found = (fn, '{"list":[' + installation_text(platform, target) + "," + own + "]}")
        memo.remember(memo_key, found)
    return found[1]


@functools.lru_cache(maxsize=8192)  # (kernel function, its Triton fingerprint) -> its part of the key
def function_text(fn: Any, fingerprint: str) -> str:
    """The items' text of the kernel function's own part of the key: its name, Triton's fingerprint
    and its parameters' flags (encoded once: every lowering of the function asks). A pure function of the
    function and its fingerprint (its parameters are fixed at decoration, as `param_flags` keeps
    them), so kept for the process (a function is told apart from an equal one by identity)."""
    return items_text([fn.__name__, fingerprint, [list(flags) for flags in tc.param_flags(fn)]], lowering_value)


def installation_text(platform: str, target: Target) -> str:
    """The items' text of what every call on `target` shares in this installation: format, code,
    platform, target and installed toolchain. Kept for the process (a fact of the installed
    software), per reading of the installed tools (`toolchain.generation`: a test that reads them
    anew gets a new text)."""
    return _installation_text(platform, target, code_identity(), toolchain.generation)


@functools.lru_cache(maxsize=256)
def _installation_text(platform: str, target: Target, code: str, generation: int) -> str:
    return items_text(["kernel-cache lowered call", FORMAT, code, platform, target.json, installed_tools(target)],
                      lowering_value)


_MODULE_MEMO_KEY = "lowering.records.call_key"  # our entry in a JAX module's own per-module cache


def module_text(module: Any, platform: str, config: Config, env: dict[str, str] | None = None) -> str:
    """The text of Triton's cache-invalidating environment and jaxlib's capabilities, read and encoded
    once per JAX module lowered (a jit of hundreds of Triton calls reads them once; Triton's read,
    a getenv per variable, only where the C environment changed: `triton_compat.triton_env`). Nothing runs between the
    lowering rules of one module that could change them, and the next module reads them again. Kept
    in the module's own `lowering_cache` dict, so it lives and dies with the module: neither a strong
    reference to the module (which would keep it alive and slow every later lowering) nor its MLIR context (JAX
    0.12 reuses one context for up to 10 modules per thread)."""
    cache = getattr(module, "lowering_cache", None)
    memo_key = (_MODULE_MEMO_KEY, platform)
    if isinstance(cache, dict) and memo_key in cache:
        return cast(str, cache[memo_key])
    env_items = tuple(sorted((env if env is not None else triton_env.get()).items()))
    capabilities = compat.capabilities(platform, config)
    part = _module_part(env_items, tuple(capabilities), tuple(map(type, capabilities)))
    if isinstance(cache, dict):
        cache[memo_key] = part
    return part


@functools.lru_cache(maxsize=256)
def _module_part(env_items: tuple[tuple[str, str], ...], capabilities: tuple[Any, ...], types: tuple[type, ...]) -> str:
    """(Triton's environment, jaxlib's capabilities and their types) -> their text: what a module
    reads changes rarely, its encoding is kept (a pure function of the values; the types keep 1 and
    True apart)."""
    return canonical_text([list(env_items), *capabilities], lowering_value)


@functools.cache
def code_identity() -> str:
    """xxh3 of the compiler and lowering packages' sources, every module of every subpackage by its
    path: a payload is only reused by the code that would build it the same way (computed once per
    process: a fact of the installed files). Raises TypeError (the call is
    then not recorded) where the sources cannot be read, e.g. an install of compiled files only."""
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
    """The tagged form of the values only a lowering passes (a typed scalar, a TMA descriptor), then
    Triton's (`compiler.key.triton_value`): the canonical encoder's extension for a call's key."""
    kind = type(value)
    if kind is compiler.Scalar:
        return {"scalar": [value.type, canonical(value.value, lowering_value)]}
    if kind is compiler.TensorDesc:
        return {"tensordesc": canonical([value.type_name, list(value.shape), list(value.strides), value.padding,
                                         value.round_f32_to_tf32], lowering_value)}
    return triton_value(value)
