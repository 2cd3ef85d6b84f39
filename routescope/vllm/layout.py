"""What the plugin expects to find in vLLM, and a check that says exactly what is missing.

The names are vLLM's (docs/vllm.md and vLLM's public source); a test passes its own
:class:`Layout` or registers test doubles under these names. Nothing here imports vLLM at
module import: :func:`inspect_ops` looks at a module object it is given.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

from dispatcher.types import Kernel

PREFILL_PARAMS = (
    "q", "kv", "indices", "topk_length", "scale", "head_dim", "nope_head_dim",
    "rope_head_dim", "attn_sink", "output",
)
OPTIONAL_PREFILL_PARAMS = ("ragged_indices", "ragged_indptr")


@dataclass(frozen=True)
class Layout:
    """Where vLLM keeps what the plugin wraps or reads; every name can be overridden for a test."""

    ops_module: str = "vllm.v1.attention.ops.rocm_aiter_mla_sparse"
    prefill: str = "rocm_sparse_attn_prefill"
    decode_prefix: str = "rocm_sparse_attn_decode"
    # getter name -> the kernel whose callable it returns (or None when AITER lacks it)
    getters: tuple[tuple[str, Kernel], ...] = (
        ("_get_aiter_pa_prefill_sparse", Kernel.AITER_PA_PREFILL_SPARSE),
        ("_get_aiter_sparse_prefill_opus", Kernel.AITER_OPUS),
    )
    # vLLM's own predicate for a branch, called as vLLM calls it: (q, kv [skv, d], attn_sink [H] | None, output)
    gates: tuple[tuple[str, Kernel], ...] = (("_can_use_aiter_sparse_prefill_opus", Kernel.AITER_OPUS),)
    # vLLM's arch flag for a branch written inline, with no predicate to call (the seed's gfx942 branch tests
    # _ON_GFX942 in rocm_sparse_attn_prefill itself): a module global, read as that code reads it
    arch_flags: tuple[tuple[str, Kernel], ...] = (("_ON_GFX942", Kernel.AITER_PA_PREFILL_SPARSE),)
    gfx942_min_rows_names: tuple[str, ...] = ("_GFX942_AITER_PA_PREFILL_SPARSE_MIN_QUERIES",)
    gfx950_min_rows_names: tuple[str, ...] = ("_GFX950_AITER_SPARSE_PREFILL_OPUS_MIN_QUERIES",)
    forward_context: str = "vllm.forward_context:get_forward_context"
    forward_context_available: str = "vllm.forward_context:is_forward_context_available"
    # tried in order; the first that exists is used (the _or_none form never logs or raises)
    config_getters: tuple[str, ...] = (
        "vllm.config:get_current_vllm_config_or_none",
        "vllm.config:get_current_vllm_config",
    )
    rank_getters: tuple[str, ...] = ("vllm.distributed:get_tensor_model_parallel_rank",)
    # vLLM's batch-invariant switch (read once per process): while it is on, an experiment moves no call
    batch_invariant: str = "vllm.envs:VLLM_BATCH_INVARIANT"
    # where routescope's lazy AITER adapter finds pa_prefill_sparse for an experiment's gfx942 arm
    aiter_module: str = "aiter"


@dataclass
class OpsFound:
    """The result of inspecting vLLM's ROCm sparse MLA module: what to wrap, and what was absent."""

    module: ModuleType
    prefill: Callable[..., Any]
    param_index: dict[str, int]  # positional index of each parameter the observer reads
    param_default: dict[str, Any]
    getters: dict[str, tuple[Callable[..., Any], Kernel]] = field(default_factory=dict)
    decodes: dict[str, Callable[..., Any]] = field(default_factory=dict)
    gates: dict[str, Kernel] = field(default_factory=dict)  # name of vLLM's predicate -> its branch's kernel
    flags: dict[str, Kernel] = field(default_factory=dict)  # vLLM's arch flag -> its inline branch's kernel
    gfx942_min_rows: int | None = None
    gfx950_min_rows: int | None = None
    absent: list[str] = field(default_factory=list)  # optional pieces not found (logged, not fatal)


class LayoutMismatch(Exception):
    """vLLM's module does not look like what the plugin was written against; the plugin stands down."""

    def __init__(self, missing: list[str]) -> None:
        super().__init__("; ".join(missing))
        self.missing = missing


def resolve(target: str, importer: Callable[[str], ModuleType]) -> Any:
    """'pkg.mod:attr' -> the attribute; raises ImportError/AttributeError naming what is missing."""
    module_name, _, attr = target.partition(":")
    module = importer(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise AttributeError(f"{module_name} has no {attr}") from None


def _unwrap(fn: Any) -> Any:
    """Our own wrappers carry the original: inspect that, so a second install sees the same layout."""
    return getattr(fn, "__routescope_original__", fn)


def _int_constant(module: ModuleType, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = getattr(module, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def _is_gate(fn: Any) -> bool:
    """A Python function whose first parameters are vLLM's (q, kv, attn_sink, output)."""
    if not inspect.isfunction(fn):
        return False
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return names[:4] == ["q", "kv", "attn_sink", "output"]


def arch_flags(module: ModuleType, layout: Layout, inline: set[Kernel]) -> dict[str, Kernel]:
    """vLLM's arch flags (bools in the module) of the branches that are present but have no predicate."""
    return {name: kernel for name, kernel in layout.arch_flags
            if kernel in inline and isinstance(getattr(module, name, None), bool)}


def inspect_ops(module: ModuleType, layout: Layout) -> OpsFound:
    """Check the module's layout; raise :class:`LayoutMismatch` listing every required piece missing."""
    missing: list[str] = []
    prefill = getattr(module, layout.prefill, None)
    original = _unwrap(prefill)
    if prefill is None:
        raise LayoutMismatch([f"{module.__name__} has no {layout.prefill}"])
    if not inspect.isfunction(original):
        raise LayoutMismatch([f"{module.__name__}.{layout.prefill} is a {type(original).__name__}, not a Python function"])
    try:
        params = list(inspect.signature(original).parameters.values())
    except (TypeError, ValueError) as exc:
        raise LayoutMismatch([f"cannot read the signature of {layout.prefill}: {exc}"]) from None
    names = [p.name for p in params]
    for name in PREFILL_PARAMS:
        if name not in names:
            missing.append(f"{layout.prefill} has no parameter {name!r} (has {', '.join(names)})")
    if missing:
        raise LayoutMismatch(missing)
    index: dict[str, int] = {}
    default: dict[str, Any] = {}
    for i, p in enumerate(params):
        if p.name in PREFILL_PARAMS or p.name in OPTIONAL_PREFILL_PARAMS:
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                index[p.name] = i
            if p.default is not p.empty:
                default[p.name] = p.default
    found = OpsFound(module=module, prefill=prefill, param_index=index, param_default=default)
    for name in OPTIONAL_PREFILL_PARAMS:
        if name not in names:
            found.absent.append(f"{layout.prefill} has no parameter {name!r}")
    for getter_name, kernel in layout.getters:
        getter = getattr(module, getter_name, None)
        if callable(getter):
            found.getters[getter_name] = (getter, kernel)
        else:
            found.absent.append(f"no {getter_name} (the {kernel} branch is taken to be absent)")
    branches = {k for _, k in found.getters.values()}
    for gate_name, kernel in layout.gates:
        if kernel in branches and _is_gate(getattr(module, gate_name, None)):
            found.gates[gate_name] = kernel
    found.flags = arch_flags(module, layout, branches - set(found.gates.values()))
    for name, value in sorted(vars(module).items()):
        if name.startswith(layout.decode_prefix) and inspect.isfunction(_unwrap(value)):
            found.decodes[name] = value
    if not found.decodes:
        found.absent.append(f"no {layout.decode_prefix}* function (decode-path calls are not counted)")
    found.gfx942_min_rows = _int_constant(module, layout.gfx942_min_rows_names)
    found.gfx950_min_rows = _int_constant(module, layout.gfx950_min_rows_names)
    return found
