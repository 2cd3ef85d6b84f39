"""Times every kernel at every grid point on shared inputs; knows nothing of terminals or files."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..kernels.common import KernelArgs
from ..pools import format_bytes
from ..kernels.registry import KernelImpl, KernelRegistry, default_registry
from .analysis import Result
from .grid import HEADS, KernelSpec, Layout, SweepArgError, default_kv_len, pool_slots
from .inputs import make_pool, make_sets
from .timing import GpuTimer, HostTimer, KernelTimer, Timing

Step = Callable[[str], None]
TIMERS = ("events", "cupti")  # a CUDA event pair around each call; the call's kernel time from CUPTI


class KernelFailed(RuntimeError):
    """A kernel raised while being timed (a missing AITER symbol, a launch error): exit status 1."""


@dataclass
class SweepPlan:
    """Everything one sweep needs, already parsed and checked."""

    kernels: tuple[KernelSpec, ...]
    rows: tuple[int, ...]
    topk: tuple[int, ...]
    layouts: tuple[Layout, ...]
    device: torch.device
    dtype: torch.dtype = torch.bfloat16
    kv_dtype: torch.dtype | None = None  # None: the pool in q's dtype
    heads: int = HEADS
    repeats: int = 30
    warmup: int = 3
    kv_len: int | None = None  # None: default_kv_len(rows, topk), unless ``pools`` sets the pool
    timer: str = "events"  # one of TIMERS; the CPU has only the host clock
    registry: KernelRegistry = field(default_factory=default_registry)
    pools: tuple[int, ...] = ()  # kv pool sizes in bytes, each one pool all of a point's sets share; () : kv_len's
    flush_l2: bool | None = None  # None: flush before each call for per-point pools, not for shared ``pools``

    @property
    def points(self) -> int:
        return len(self.rows) * len(self.topk) * len(self.layouts) * max(1, len(self.pools))

    @property
    def flushes(self) -> bool:
        return not self.pools if self.flush_l2 is None else self.flush_l2


def resolve_impl(registry: KernelRegistry, spec: KernelSpec, device_type: str) -> KernelImpl:
    """The implementation a spec names, checked to run on this device type."""
    if spec.impl is None:
        return registry.resolve(spec.kernel, device_type)
    for impl in registry.impls(spec.kernel):
        if impl.impl == spec.impl:
            if not impl.runs_on(device_type):
                raise SweepArgError(f"{spec} does not run on {device_type} here")
            return impl
    raise SweepArgError(f"{spec}: no such implementation registered")


def check_timer(timer: str, device_type: str) -> None:
    """Refuse a timer this device cannot run: CUPTI's kernel time needs CUDA; a CPU has the host clock."""
    if timer not in TIMERS:
        raise SweepArgError(f"--timer must be one of {', '.join(TIMERS)}; got {timer!r}")
    if timer != "events" and device_type != "cuda":
        raise SweepArgError(f"--timer {timer} needs a CUDA device (kernel time comes from CUPTI); "
                            f"on {device_type} the host clock times")


def make_timer(plan: SweepPlan) -> GpuTimer | HostTimer:
    """The plan's GPU timer; the host clock on a CPU (its kernels are synchronous)."""
    check_timer(plan.timer, plan.device.type)
    if plan.device.type != "cuda":
        return HostTimer()
    flush = plan.flushes
    return KernelTimer(plan.device, flush_l2=flush) if plan.timer == "cupti" else GpuTimer(plan.device, flush_l2=flush)


def run_sweep(plan: SweepPlan, *, on_step: Step | None = None) -> list[Result]:
    """Time each kernel at each (layout, pool, top-k, rows) point; inputs are built once per point and shared.

    With ``plan.pools`` each (layout, pool) gets one kv pool of that many bytes, made once; without, each point
    its own (``plan.kv_len`` slots, or ``default_kv_len``)."""
    impls = [resolve_impl(plan.registry, s, plan.device.type) for s in plan.kernels]
    labels = [f"{i.kernel.value}:{i.impl}" for i in impls]
    if len(set(labels)) != len(labels):
        raise SweepArgError(f"--kernels resolve to the same implementation twice here: {', '.join(labels)}")
    timer = make_timer(plan)
    dtype_name = str(plan.dtype).removeprefix("torch.")
    kv_dtype_name = str(plan.kv_dtype or plan.dtype).removeprefix("torch.")
    results: list[Result] = []
    kv_dtype = plan.kv_dtype or plan.dtype
    for layout in plan.layouts:
        for pool_size in plan.pools or (None,):
            pool = None if pool_size is None else make_pool(
                pool_slots(pool_size, layout, kv_dtype.itemsize), layout.head_dim, dtype=kv_dtype, device=plan.device)
            where = "" if pool_size is None else f" pool {format_bytes(pool_size)}"
            results += _time_pool(plan, impls, timer, layout, pool, where, dtype_name, kv_dtype_name, on_step)
            del pool
    return results


def _time_pool(plan: SweepPlan, impls: list[KernelImpl], timer: GpuTimer | HostTimer, layout: Layout,
               pool: torch.Tensor | None, where: str, dtype_name: str, kv_dtype_name: str,
               on_step: Step | None) -> list[Result]:
    """Every (top-k, rows) point of one layout and pool."""
    results: list[Result] = []
    for topk in plan.topk:
        for rows in plan.rows:
            kv_len = pool.shape[0] if pool is not None else (plan.kv_len or default_kv_len(rows, topk))
            sets = make_sets(rows, topk, plan.heads, layout, kv_len, dtype=plan.dtype, device=plan.device,
                             kv_dtype=plan.kv_dtype, pool=pool)
            for spec, impl in zip(plan.kernels, impls):
                if on_step is not None:
                    on_step(f"{layout}{where} top-k {topk} rows {rows}: {spec}")
                t, ran = _time_one(timer, impl, spec, sets, plan)
                results.append(Result(
                    impl.kernel.value, ran, str(layout), rows, topk, plan.heads, layout.head_dim,
                    layout.nope, layout.rope, dtype_name, kv_len, t.median_us, t.p20_us, t.p80_us, t.min_us,
                    t.repeats, t.timer, kv_dtype_name,
                ))
            del sets
            if plan.device.type == "cuda":
                torch.cuda.empty_cache()
    return results


def _time_one(
    timer: GpuTimer | HostTimer, impl: KernelImpl, spec: KernelSpec, sets: list[KernelArgs], plan: SweepPlan
) -> tuple[Timing, str]:
    """The timing, and the implementation that ran (a launch may hand a call it does not take to another)."""
    try:
        # One untimed call first: it says which implementation ran, and it also puts every kernel's run
        # at the same level of the event pair's cost, which differs by ~0.7 µs with what ran just before
        # (docs/benchmarks.md, "Clocks: kernel time and the event pair"): with it, the same kernel timed as A
        # and as B reads the same.
        ran = impl.launch(sets[0]) or impl.impl
        return timer.time(impl.launch, sets, warmup=plan.warmup, repeats=plan.repeats), ran
    except Exception as exc:
        raise KernelFailed(f"{spec} failed on {plan.device.type}: {exc.__class__.__name__}: {exc}") from exc
