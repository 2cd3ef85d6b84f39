"""`routescope bench host`: the host's time per call on the launch path, piece by piece, in one run.

What is timed, each as the wall time of issuing a batch of calls with nothing synchronising
inside it, median over batches. A batch is short (20 calls) and starts on an idle GPU, so even
a call whose kernels take longer than its launch does not fill the device's queue: the host's
own cost is what shows. The items take turns, one batch each a round (``per_call_us_interleaved``):
the shared host's speed drifts by tens of percent within a run, and in turns every item sees the
same drift, so the rows compare side by side. What is timed:

- ``torch_noop``: a one-element in-place add (the floor of any device op);
- ``triton_noop``: a trivial Triton kernel through the JIT launcher (the floor of a Triton launch);
- ``launch`` of each in-tree kernel, the implementation the registry picks for the device, and the same launch
  with the tensors themselves handed to Triton's launcher (``_tensor_args``: it then checks each pointer with the
  driver; ``launcher.RAW_POINTERS``); where the Hopper decode is one cooperative launch, its partials-then-reduce
  pair beside it (``_two_launches``);
- ``dispatcher``: the whole ``Dispatcher`` call (validate, classify, decide, launch), without and
  with telemetry at default sampling.

At 2, 16 and 1,024 rows, bf16, H=16, 512+64, top-k 2048, kv pool 8,192 rows. On a machine
without CUDA the device pieces are skipped and the torch kernels run (their time is then the
kernels' own, on the host).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from dispatcher import Dispatcher, Policy, detect
from dispatcher.kernels import launcher
from dispatcher.kernels.registry import default_registry
from dispatcher.sweep.grid import Layout
from dispatcher.sweep.inputs import make_sets
from dispatcher.types import Kernel

from ..config import TelemetryConfig
from ..core import Telemetry

ROWS = (2, 16, 1024)


def batch_us_interleaved(fns: dict[str, Callable[[], Any]], *, batch: int, batches: int,
                         sync: Callable[[], None]) -> dict[str, list[float]]:
    """Each item's wall µs per call of issuing ``batch`` calls back to back, one figure a batch, the items taking
    turns (each round times one batch of each, in order). Every batch follows a sync and three untimed calls, so the
    first launches after an idle moment are not in it."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    sync()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(batches):
        for name, fn in fns.items():
            for _ in range(3):
                fn()
            t0 = time.perf_counter_ns()
            for _ in range(batch):
                fn()
            times[name].append((time.perf_counter_ns() - t0) / batch / 1e3)
            sync()
    return times


def per_call_us_interleaved(fns: dict[str, Callable[[], Any]], *, batch: int, batches: int,
                            sync: Callable[[], None]) -> dict[str, float]:
    """Median over ``batches`` of each item's µs per call (``batch_us_interleaved``)."""
    return {name: statistics.median(t) for name, t in
            batch_us_interleaved(fns, batch=batch, batches=batches, sync=sync).items()}


def band(values: list[float]) -> float:
    """Half the interquartile range: the noise band of a median over batches."""
    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(values, n=4, method="inclusive")
    return (q[2] - q[0]) / 2


def differences(times: dict[str, list[float]]) -> list[dict[str, Any]]:
    """What one piece adds to another, batch by batch (the items take turns, so batch i of each saw the same
    moment of the host): telemetry on the dispatcher call, tensors handed to Triton's launcher, the decode's two
    launches. Each is a median of paired differences with its band (``overhead.paired``: never narrower than its
    gap to the difference of the medians printed above it), ``noise`` where the band is as wide as it."""
    from .overhead import paired, resolved

    out = []
    for name in times:
        if name.startswith("dispatcher_telemetry_"):
            base, what = "dispatcher_" + name.removeprefix("dispatcher_telemetry_"), "telemetry on the dispatcher call"
        elif name.endswith("_tensor_args"):
            base, what = name.removesuffix("_tensor_args"), "tensors handed to Triton's launcher"
        elif name.endswith("_two_launches"):
            base, what = name.removesuffix("_two_launches"), "partials + reduce instead of one launch"
        else:
            continue
        if base in times:
            d, b = paired(times[name], times[base])
            out.append({"what": what, "item": name, "minus": base, "us": d, "band_us": b,
                        "noise": not resolved(abs(d), b)})
    return out


def _raw_pointers(on: bool, fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` with ``launcher.RAW_POINTERS`` set to ``on`` around it."""
    def call() -> Any:
        launcher.RAW_POINTERS = on
        try:
            return fn()
        finally:
            launcher.RAW_POINTERS = True
    return call


def _two_launch_decode(a: Any) -> Callable[[Any], Any] | None:
    """The Hopper decode's partials-then-reduce recipe where its default for ``a`` is one cooperative launch."""
    from dispatcher.kernels import gluon_sm90

    if not (gluon_sm90.HAVE_GLUON and gluon_sm90.supports_decode(a)):
        return None
    return gluon_sm90.two_launch_recipe(a)


def _triton_noop() -> Callable[[torch.Tensor], Any] | None:
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def noop(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

    return lambda x: noop[(1,)](x, x.numel(), BLOCK=16)


def run(*, rows: tuple[int, ...] = ROWS, batch: int = 20, batches: int = 51, topk: int = 2048,
        layout: Layout = Layout(512, 64), heads: int = 16, kv_len: int = 8192) -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    dtype = torch.bfloat16 if cuda else torch.float32
    skipped: list[str] = []  # what was asked and not timed, each with why: the table never drops a row silently
    if not cuda:  # the torch kernels on CPU: keep their own time (and the run) small
        skipped.append(f"shapes: H={heads}, {layout}, top-k {topk}, kv {kv_len} asked; on the CPU H=2, 48+16, top-k 64, "
                       "kv 256 (torch kernels, float32)")
        heads, topk, kv_len, layout = 2, 64, 256, Layout(48, 16)
        kept = tuple(r for r in rows if r <= 16) or (2,)
        if kept != tuple(rows):
            left = [r for r in rows if r not in kept]
            skipped.append(f"rows {', '.join(map(str, left))}: left out on the CPU (its torch kernels take "
                           f"milliseconds there, which is not a host cost); timed rows {', '.join(map(str, kept))}")
        if batch > 5 or batches > 5:
            skipped.append(f"--batch {batch} --batches {batches}: capped at 5 and 5 on the CPU")
        rows, batch, batches = kept, min(batch, 5), min(batches, 5)
        torch.set_num_threads(1)  # one thread: no pool hand-offs in a host-cost figure
    out: dict[str, Any] = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
                           "layout": str(layout), "topk": topk, "heads": heads, "kv_len": kv_len,
                           "batch": batch, "batches": batches, "us_per_call": {}}
    us = out["us_per_call"]
    items: dict[str, Callable[[], Any]] = {}
    x = torch.zeros(16, device=device)
    items["torch_noop"] = lambda: x.add_(0)
    tri = _triton_noop() if cuda else None
    if tri is not None:
        items["triton_noop"] = lambda: tri(x)
    else:
        skipped.append("triton_noop: not timed (" + ("no CUDA device: a Triton kernel needs one)" if not cuda
                                                    else "triton is not importable here)"))
    out["skipped"] = skipped
    platform, policy = detect(), Policy()
    registry = default_registry()
    bare = Dispatcher(platform=platform, policy=policy, registry=registry)
    # the pure decodes sent through the prefill entry are the point here, not a bug to warn about
    tel = Telemetry(TelemetryConfig(models=("bench",), log_first_decode_in_prefill=False), platform=platform,
                    policy=policy)
    watched = tel.instrument(Dispatcher(platform=platform, policy=policy, registry=registry))
    try:
        for r in rows:
            # the launch is handed a call as the dispatcher prepares it: with its signature's memo
            a = make_sets(r, topk, heads, layout, max(kv_len, r), dtype=dtype, device=device)[0]._replace(memo={})
            for name, kernel in (("prefill", Kernel.INTREE_RAGGED_PREFILL), ("decode", Kernel.INTREE_SPARSE_DECODE)):
                impl = registry.resolve(kernel, device.type)
                launch = (lambda impl, a: lambda: impl.launch(a))(impl, a)
                items[f"launch_{name}_{r}"] = _raw_pointers(True, launch)  # both rows pay the same wrapper
                if cuda:
                    items[f"launch_{name}_{r}_tensor_args"] = _raw_pointers(False, launch)
                    two = _two_launch_decode(a) if name == "decode" else None
                    if two is not None:
                        items[f"launch_decode_{r}_two_launches"] = (lambda two, a: lambda: two(a))(two, a)
                out.setdefault("impls", {})[f"{name}_{r}"] = impl.launch(a) or impl.impl
            call = (a.q, a.kv, a.index.indices, None, a.scale, layout.head_dim, layout.nope, layout.rope, None,
                    a.output)
            kw = {"num_decodes": r, "num_decode_tokens": r, "num_prefills": 0, "model": "bench"}
            items[f"dispatcher_{r}"] = (lambda call, kw: lambda: bare(*call, **kw))(call, kw)
            items[f"dispatcher_telemetry_{r}"] = (lambda call, kw: lambda: watched(*call, **kw))(call, kw)
        times = batch_us_interleaved(items, batch=batch, batches=batches, sync=sync)
        us.update({name: statistics.median(t) for name, t in times.items()})
        out["band_us"] = {name: band(t) for name, t in times.items()}
        out["differences"] = differences(times)
    finally:
        tel.close()
    return out


def diff_cell(d: dict[str, Any]) -> str:
    """A paired difference as printed: µs ± band, "(noise)" where the band is as wide as it."""
    return f"{d['us']:+.1f} ± {d['band_us']:.1f} µs" + (" (noise)" if d["noise"] else "")


def render(result: dict[str, Any]) -> None:
    """The table of medians with their bands, the differences that matter with theirs, and what was not timed."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"host µs per call, {result['device']}, {result['layout']}, top-k {result['topk']} "
                        f"(median of {result['batches']} batches of {result['batch']})")
    table.add_column("what")
    table.add_column("µs/call", justify="right")
    table.add_column("± band", justify="right")
    table.add_column("ran", justify="left")
    impls = result.get("impls", {})
    bands = result.get("band_us", {})
    for key, value in result["us_per_call"].items():
        ran = impls.get(key.removeprefix("launch_").removesuffix("_tensor_args").removesuffix("_two_launches"), "")
        table.add_row(key, f"{value:.1f}", f"{bands[key]:.1f}" if key in bands else "", ran)
    console = Console(width=120)
    console.print(table)
    for d in result.get("differences", []):
        console.print(f"{d['what']}: {d['item']} - {d['minus']} = {diff_cell(d)}")
    if "band_us" in result:
        console.print("band: half the interquartile range over the batches; a difference is the median of per-batch "
                      "differences (the items take turns, a batch each), its band never narrower than its gap to "
                      "the difference of the medians; '(noise)' where the band is as wide as the difference")
    for line in result.get("skipped", []):
        console.print(f"not as asked: {line}")
