"""The throughput part of `routescope bench experiment`: what the experiment's machinery costs a stream of calls.

Passes over the same calls with no experiment and with an A/A control at each fraction (B runs A's own kernel, so
the only difference between the passes is the machinery: choosing, timing, numerics samples, the flusher),
interleaved ABAB (each repeat takes the variants in turn, every other one in reverse order), each pass long enough
that the flusher (one thread, flushing the attached experiment, as a process runs one) flushes inside it. The cost
is the median over repeats of each pair's ratio, with its p25-p75 spread. On a GPU the kernels are the real ones;
on the CPU they are kernel doubles that write zeros (named so in the result), so the pass is host-bound and the
figure is the machinery's host cost per call, which a CPU kernel's own time would otherwise drown.
"""

from __future__ import annotations

import gc
import math
import statistics
import threading
import time
from typing import Any

import torch

from dispatcher import Dispatcher
from dispatcher.kernels import KernelImpl, KernelRegistry
from dispatcher.types import Kernel
from workloads.traffic import CallSpec

from .config import ExperimentConfig
from .control import Registry
from .covariate import predictor_for

ZERO_IMPL = "zero-double"


def sync(device: torch.device) -> None:
    """Wait for the device (a no-op on the CPU): the edges of a timed pass."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def drive(d: Dispatcher, ops: dict[str, Any], specs: list[CallSpec]) -> None:
    """Every call of ``specs`` through ``d`` on the operands of its model (``bench.Operands``)."""
    for spec in specs:
        args, kw = ops[spec.model].call(spec)
        d(*args, **kw)


def _zero(args: Any) -> None:
    """A kernel double: writes zeros, so A and B agree and every numerics sample passes."""
    args.output.zero_()


def zero_registry() -> KernelRegistry:
    """Every kernel name served by the zero-writing double (the CPU form: the machinery's cost, not a kernel's)."""
    reg = KernelRegistry()
    for kernel in Kernel:
        reg.register(KernelImpl(kernel, ZERO_IMPL, _zero))
    return reg


class _Flusher:
    """One flush thread for the registry attached now (none between passes, none in a pass without experiment)."""

    def __init__(self, interval_s: float) -> None:
        self.registry: Registry | None = None
        self.flushes = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(interval_s,), name="routescope-tp-flush",
                                        daemon=True)
        self._thread.start()

    def _loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            reg = self.registry
            if reg is None:
                continue
            try:
                reg.flush()
            except Exception:  # noqa: BLE001 - counted, as the Registry's own flusher counts
                self.errors += 1
            self.flushes += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _quartiles(values: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    return q[0], q[2]


def throughput(d: Dispatcher, ops: dict, specs: list[CallSpec], fractions: tuple[float, ...], device: torch.device,
               *, repeats: int, clock: str = "stamp", flush_s: float = 0.5, min_pass_s: float = 1.2,
               kernels: str = "auto") -> dict:
    """Calls per second with no experiment and with A/A at each fraction, interleaved passes; per-pair ratios.

    ``kernels``: "real" (``d``'s registry), "double" (``zero_registry``: a host-bound pass) or "auto" (real on a
    GPU, the double on the CPU). A pass repeats ``specs`` until it lasts ``min_pass_s``, so every A/A pass holds
    at least one flush at ``flush_s``."""
    use_double = kernels == "double" or (kernels == "auto" and device.type != "cuda")
    threads = torch.get_num_threads()
    if use_double:
        d = Dispatcher(platform=d.platform, policy=d.policy, registry=zero_registry())
        torch.set_num_threads(1)  # the doubles' zero_() on one thread: no intra-op pool waking per call
    flusher = _Flusher(flush_s)
    gc.collect()
    regs: dict[float, Registry] = {}
    try:
        for f in fractions:
            reg = Registry(d.platform, d.policy, torch_mod=torch, predictor=predictor_for(d.platform))
            reg.start(ExperimentConfig(id=f"aa-{f}", candidate="aa", fraction=f, harm_bound=1.0, budget=1.0,
                                       clock=clock))
            regs[f] = reg
            d.set_arms(reg.current)
            for _ in range(2):  # cells found and verified by their first numerics samples; a gated clock's gate built
                drive(d, ops, specs)
                sync(device)
                reg.flush()
                reg.flush()
            d.set_arms(None)
        t0 = time.perf_counter()
        drive(d, ops, specs)
        sync(device)
        rounds = max(1, math.ceil(min_pass_s / max(time.perf_counter() - t0, 1e-9)))
        keys = ["none", *(f"aa@{f}" for f in fractions)]
        wall: dict[str, list[float]] = {k: [] for k in keys}
        host: dict[str, list[float]] = {k: [] for k in keys}
        flushes: dict[str, list[int]] = {k: [] for k in keys}
        for r in range(repeats):
            order = [None, *fractions] if r % 2 == 0 else [*fractions, None]
            for f in order:
                key = "none" if f is None else f"aa@{f}"
                reg = None if f is None else regs[f]
                d.set_arms(None if reg is None else reg.current)
                flusher.registry = reg
                sync(device)
                before = flusher.flushes
                c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
                for _ in range(rounds):
                    drive(d, ops, specs)
                sync(device)
                t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
                flusher.registry = None
                d.set_arms(None)
                n = rounds * len(specs)
                wall[key].append((t1 - t0) / n)
                host[key].append((c1 - c0) / n)
                flushes[key].append(flusher.flushes - before)
    finally:
        torch.set_num_threads(threads)
        flusher.close()
        d.set_arms(None)
        for reg in regs.values():
            reg.close()
    out: dict[str, Any] = {
        "kernels": f"{ZERO_IMPL} (kernel doubles writing zeros: the machinery's host cost)" if use_double else "real",
        "calls_per_pass": rounds * len(specs), "repeats": repeats, "flush_s": flush_s, "clock": clock,
        "calls_per_s": {k: 1e9 / statistics.median(v) for k, v in wall.items()},
        "ns_per_call": {k: statistics.median(v) for k, v in wall.items()},
        "host_ns_per_call": {k: statistics.median(v) for k, v in host.items()},
        "flushes_per_pass": {k: min(v) for k, v in flushes.items() if k != "none"},
        "flush_errors": flusher.errors,
        # an A/A that stopped part-way (harm, on a host clock's noise) stops costing: the figure says so
        "states": {f"aa@{f}": reg.current.state_name + (f" ({reg.current.stop_reason})" if reg.current.stop_reason
                                                         else "") for f, reg in regs.items()},
    }
    out["cost"], out["cost_p25_p75"], out["extra_ns_per_call"], out["extra_host_ns_per_call"] = {}, {}, {}, {}
    for k in keys[1:]:
        ratios = [1.0 - a_none / a for a, a_none in zip(wall[k], wall["none"])]  # 1 - rate_aa / rate_none, per pair
        out["cost"][k] = statistics.median(ratios)
        out["cost_p25_p75"][k] = list(_quartiles(ratios))
        out["extra_ns_per_call"][k] = statistics.median(a - b for a, b in zip(wall[k], wall["none"]))
        out["extra_host_ns_per_call"][k] = statistics.median(a - b for a, b in zip(host[k], host["none"]))
    return out


def describe(tp: dict) -> str:
    """One line per A/A variant: the median cost, its p25-p75, and ns per call (what `bench experiment` prints)."""
    lines = [f"throughput against no experiment ({tp.get('kernels', 'real')} kernels; {tp.get('repeats')} "
             f"interleaved passes of {tp.get('calls_per_pass')} calls each; none at "
             f"{tp['ns_per_call']['none']:.0f} ns a call):"]
    for k, cost in tp["cost"].items():
        lo, hi = tp["cost_p25_p75"][k]
        lines.append(f"  {k}: cost {cost * 100:+.2f}% (p25-p75 {lo * 100:+.2f}% to {hi * 100:+.2f}%), "
                     f"{tp['extra_ns_per_call'][k]:+.0f} ns a call ({tp['extra_host_ns_per_call'][k]:+.0f} ns of the "
                     f"thread's CPU), {tp['flushes_per_pass'][k]}+ flushes a pass"
                     + ("" if tp.get("states", {}).get(k, "running") == "running" else f"; {tp['states'][k]}"))
    return "\n".join(lines)
