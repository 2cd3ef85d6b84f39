"""The throughput part of `routescope bench experiment`: what the experiment's machinery costs a stream of calls.

Passes over the same calls with no experiment and with an A/A control at each fraction (B runs A's own kernel, so
the only difference between the passes is the machinery: choosing, timing, numerics samples, the flusher),
interleaved; the median ratio per pair of passes is the cost.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from dispatcher import Dispatcher
from workloads.traffic import CallSpec

from .config import ExperimentConfig
from .control import Registry
from .covariate import predictor_for


def sync(device: torch.device) -> None:
    """Wait for the device (a no-op on the CPU): the edges of a timed pass."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def drive(d: Dispatcher, ops: dict[str, Any], specs: list[CallSpec]) -> None:
    """Every call of ``specs`` through ``d`` on the operands of its model (``bench.Operands``)."""
    for spec in specs:
        args, kw = ops[spec.model].call(spec)
        d(*args, **kw)


def throughput(d: Dispatcher, ops: dict, specs: list[CallSpec], fractions: tuple[float, ...], device: torch.device,
               *, repeats: int, clock: str = "stamp") -> dict:
    """Calls per second with no experiment and with A/A at each fraction, interleaved passes; median ratios."""
    regs = {}
    for f in fractions:
        reg = Registry(d.platform, d.policy, torch_mod=torch, predictor=predictor_for(d.platform))
        regs[f] = reg
        reg.start(ExperimentConfig(id=f"aa-{f}", candidate="aa", fraction=f, harm_bound=1.0, budget=1.0,
                                   clock=clock))
        reg.start_flusher(0.5)
        d.set_arms(reg.current)
        drive(d, ops, specs)  # an untimed pass: cells found and their first numerics samples verified
        sync(device)
        time.sleep(1.2)
    rates: dict[str, list[float]] = {"none": []} | {f"aa@{f}": [] for f in fractions}
    for r in range(repeats):
        order = [None, *fractions] if r % 2 == 0 else [*fractions, None]
        for f in order:
            d.set_arms(None if f is None else regs[f].current)
            sync(device)
            t0 = time.perf_counter()
            drive(d, ops, specs)
            sync(device)
            rates["none" if f is None else f"aa@{f}"].append(len(specs) / (time.perf_counter() - t0))
    d.set_arms(None)
    for reg in regs.values():
        reg.close()
    out = {"calls_per_s": {k: statistics.median(v) for k, v in rates.items()}}
    out["cost"] = {k: 1.0 - statistics.median(a / b for a, b in zip(v, rates["none"]))
                   for k, v in rates.items() if k != "none"}
    return out
