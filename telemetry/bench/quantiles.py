"""`routescope bench quantiles`: exact latency quantiles against what the classic and the native buckets export.

Real kernels run through an instrumented ``Dispatcher`` with every call timed and kept (``keep_samples``): for each
model (DeepSeek's 448+64 head layout, GLM's 512+0) and each power-of-two rows bucket, ``calls`` calls with rows
drawn at random inside the bucket, shuffled. Per kernel x rows bucket x model (x clock) it prints the exact p50, p90
and p99 of the samples (nearest rank) beside ``histogram_quantile`` on the same samples' classic buckets (1-2.5-5 a
decade) and on their native buckets (schema 4): Prometheus' interpolation, computed here (tests/dashboards/
test_native_e2e.py shows a real Prometheus giving the same answer). The page and ``/routing`` read the native one.

Then the size of one scrape of the same registry in each exposition: series Prometheus stores, sample lines, bytes
and gzip bytes (what a scrape moves; Prometheus asks for gzip), for the whole exposition and the latency family
alone. On a CUDA device the kernels stamp their own span (the ``device`` clock) at full shapes; on CPU they run at
scaled shapes (heads and head dims / 8) timed on the host clock.
"""

from __future__ import annotations

import gzip
import math
import random
from typing import Any, Callable

import torch

from dispatcher import Dispatcher, Policy, detect
from dispatcher.sweep.grid import Layout
from dispatcher.sweep.inputs import topk_indices

from ..buckets import quantile as classic_quantile
from ..config import TelemetryConfig
from ..core import Telemetry
from ..exposition import PROTOBUF_CONTENT_TYPE, negotiate
from ..spec import HISTOGRAM

MODELS = (("DeepSeek-V4.1-Flash", Layout(448, 64)), ("GLM-5.3-Flash", Layout(512, 0)))
QUANTILES = (0.5, 0.9, 0.99)
BOUND_PCT = 5.0
FORMATS = (("text 0.0.4", "text/plain;version=0.0.4"),
           ("OpenMetrics 1.0", "application/openmetrics-text;version=1.0.0"),
           ("OpenMetrics 2.0", "application/openmetrics-text;version=2.0.0"),
           ("protobuf", PROTOBUF_CONTENT_TYPE))


def exact_quantile(values: list[float], q: float) -> float:
    """Nearest rank: the sample at rank ceil(q * n), the one whose bucket histogram_quantile interpolates in."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def rows_buckets(max_rows: int) -> list[tuple[int, int]]:
    """(lowest, highest) rows of each power-of-two bucket up to the one holding ``max_rows``."""
    out, lo = [], 1
    while lo <= max_rows:
        out.append((lo, 2 * lo - 1))
        lo *= 2
    return out


def workload(*, calls: int, max_rows: int, heads: int, topk: int, kv_len: int, scale_down: int,
             dtype: torch.dtype, device: torch.device, seed: int = 0) -> list[tuple[tuple, dict[str, Any]]]:
    """``calls`` calls per model and rows bucket, rows uniform inside the bucket, shuffled; each call is a view of
    one full-size set of tensors per model (a leading slice, contiguous)."""
    rng = random.Random(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    buckets = rows_buckets(max_rows)
    top = buckets[-1][1]
    out = []
    for model, full in MODELS:
        layout = Layout(full.nope // scale_down, full.rope // scale_down)
        d = layout.head_dim
        q = torch.randn((top, heads, d), device=device, generator=gen, dtype=torch.float32).to(dtype)
        kv = torch.randn((kv_len, 1, d), device=device, generator=gen, dtype=torch.float32).to(dtype)
        idx = topk_indices(top, topk, kv_len, device, gen)
        o = torch.empty((top, heads, layout.nope), device=device, dtype=dtype)
        meta = {"num_decodes": 0, "num_decode_tokens": 0, "num_prefills": 1, "model": model}
        for lo, hi in buckets:
            for _ in range(calls):
                rows = rng.randint(lo, hi)
                args = (q[:rows], kv, idx[:rows], None, 1.0 / math.sqrt(d), d, layout.nope, layout.rope, None,
                        o[:rows])
                out.append((args, meta))
    rng.shuffle(out)
    return out


def _error_pct(got: float | None, exact: float) -> float | None:
    return None if got is None else 100.0 * (got - exact) / exact


def compare(samples: list[dict[str, Any]], totals: Any, *, min_samples: int) -> list[dict[str, Any]]:
    """Per series with ``min_samples``: exact, classic and native quantiles (seconds) and their errors (%)."""
    by_key: dict[tuple[str, ...], list[float]] = {}
    for s in samples:
        by_key.setdefault((s["kernel"], s["rows_bucket"], s["model"], s["clock"]), []).append(s["seconds"])
    rows = []
    for key, values in sorted(by_key.items(), key=lambda kv: (kv[0][0], kv[0][2], _bucket_order(kv[0][1]))):
        if len(values) < min_samples or key not in totals.latency:
            continue
        counts, _sum = totals.latency[key]
        native = totals.latency_native.get(key)
        row: dict[str, Any] = dict(zip(("kernel", "rows_bucket", "model", "clock"), key), samples=len(values),
                                   native_buckets=sum(1 for n in native.buckets.values() if n) if native else 0)
        for q in QUANTILES:
            name = f"p{round(q * 100)}"
            exact = exact_quantile(values, q)
            classic = classic_quantile(counts, q)
            nat = native.quantile(q) if native is not None else None
            row[f"exact_{name}_s"] = exact
            row[f"classic_{name}_s"] = classic
            row[f"native_{name}_s"] = nat
            row[f"classic_{name}_error_pct"] = _error_pct(classic, exact)
            row[f"native_{name}_error_pct"] = _error_pct(nat, exact)
        rows.append(row)
    return rows


def _bucket_order(label: str) -> int:
    return int(label.split("-")[0].rstrip("+"))


def _stored_series(body: bytes) -> tuple[int, int]:
    """(series a Prometheus with native histograms stores, of them the latency family's) from a protobuf body."""
    from ..exposition import metrics_pb2 as pb
    from ..exposition.protobuf import decode_delimited

    total = latency = 0
    for fam in decode_delimited(body):
        for metric in fam.metric:
            if fam.type in (pb.HISTOGRAM, pb.GAUGE_HISTOGRAM):
                native = metric.histogram.HasField("schema") and (
                    metric.histogram.zero_threshold > 0 or len(metric.histogram.positive_delta) > 0)
                n = 1 if native else len(metric.histogram.bucket) + 3
            elif fam.type == pb.SUMMARY:
                n = len(metric.summary.quantile) + 2
            else:
                n = 1
            total += n
            latency += n if fam.name == HISTOGRAM.name else 0
    return total, latency


def _latency_lines(body: bytes) -> tuple[int, int]:
    """(sample lines, bytes) of the latency family in a text exposition."""
    lines = [line for line in body.split(b"\n") if line.startswith(HISTOGRAM.name.encode())]
    return len(lines), sum(len(line) + 1 for line in lines)


def remote_write_bytes(body: bytes, *, native: bool) -> tuple[int, int]:
    """(series, bytes before compression) one scrape adds to a remote-write stream, from a protobuf scrape.

    Remote write sends each stored series as its labels (``__name__`` included) and its samples (value and a
    millisecond timestamp). Each stored series is sized here as the same ``Metric`` message holding its labels and
    its value (a classic bucket, ``_count`` and ``_sum`` are one series each; a native histogram is one series
    holding its spans and deltas) plus 8 bytes of timestamp: the shape and size of remote write 1.0's
    ``TimeSeries`` (an estimate: its snappy framing and the request's own fields are left out).
    """
    from ..exposition import metrics_pb2 as pb
    from ..exposition.protobuf import decode_delimited

    def size(name: str, labels: Any, extra: tuple[str, str] | None = None, hist: Any = None) -> int:
        m = pb.Metric()
        m.label.add(name="__name__", value=name)
        for lp in labels:
            m.label.add(name=lp.name, value=lp.value)
        if extra is not None:
            m.label.add(name=extra[0], value=extra[1])
        if hist is None:
            m.untyped.value = 1.0
        else:
            h = m.histogram
            h.CopyFrom(hist)
            del h.bucket[:]
        return len(m.SerializeToString()) + 8

    series = total = 0
    for fam in decode_delimited(body):
        for metric in fam.metric:
            if fam.type == pb.HISTOGRAM and native:
                series, total = series + 1, total + size(fam.name, metric.label, hist=metric.histogram)
            elif fam.type == pb.HISTOGRAM:
                les = [repr(b.upper_bound) for b in metric.histogram.bucket] + ["+Inf"]
                for le in les:
                    total += size(fam.name + "_bucket", metric.label, ("le", le))
                total += size(fam.name + "_count", metric.label) + size(fam.name + "_sum", metric.label)
                series += len(les) + 2
            else:
                series, total = series + 1, total + size(fam.name, metric.label)
    return series, total


def scrape_sizes(registry: Any) -> list[dict[str, Any]]:
    """One scrape of ``registry`` in each format: sample lines, stored series, bytes, gzip bytes."""
    from ..exposition.protobuf import decode_delimited, encode_messages

    out = []
    for name, accept in FORMATS:
        encoder, content_type = negotiate(accept)
        body = encoder(registry)
        row: dict[str, Any] = {"format": name, "content_type": content_type, "bytes": len(body),
                               "gzip_bytes": len(gzip.compress(body, 6))}
        if name == "protobuf":
            row["series"], row["latency_series"] = _stored_series(body)
            row["latency_bytes"] = len(encode_messages(f for f in decode_delimited(body) if f.name == HISTOGRAM.name))
            for kind in ("classic", "native"):
                row[f"remote_write_{kind}_series"], row[f"remote_write_{kind}_bytes"] = remote_write_bytes(
                    body, native=kind == "native")
        else:
            lines = [line for line in body.split(b"\n") if line and not line.startswith(b"#")]
            row["series"] = len(lines)
            row["latency_series"], row["latency_bytes"] = _latency_lines(body)
        out.append(row)
    return out


def within_bound(rows: list[dict[str, Any]]) -> dict[str, bool | None]:
    """Per bucket kind, whether every series' p50/p90/p99 lies within BOUND_PCT of the exact one (None: no series
    was compared, so there is nothing to claim)."""
    def ok(r: dict[str, Any], key: str) -> bool:
        err = r[key]
        return err is not None and abs(err) <= BOUND_PCT

    return {kind: all(ok(r, f"{kind}_p{round(q * 100)}_error_pct") for r in rows for q in QUANTILES) if rows else None
            for kind in ("classic", "native")}


def run(*, calls: int = 150, max_rows: int = 2048, device: str | None = None, min_samples: int = 100,
        full_scale: bool | None = None, seed: int = 0, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The whole benchmark; ``device`` defaults to CUDA when present (device clock, full shapes), else CPU."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    full = dev.type == "cuda" if full_scale is None else full_scale
    shape = dict(heads=16, topk=2048, kv_len=8192, scale_down=1) if full else dict(heads=2, topk=32, kv_len=256,
                                                                                  scale_down=8)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    platform, policy = detect(), Policy()
    calls_list = workload(calls=calls, max_rows=max_rows, dtype=dtype, device=dev, seed=seed, **shape)
    warm = Dispatcher(platform=platform, policy=policy)  # not instrumented: compiles land nowhere
    for args, kw in calls_list[:16]:
        warm(*args, **kw)
    cfg = TelemetryConfig(models=tuple(m for m, _ in MODELS), sample_first=1 << 30, sample_every=1,
                          keep_samples=True, decisions_maxlen=0, timing="auto", timing_pool=1024)
    tel = Telemetry(cfg, platform=platform, policy=policy)
    try:
        d = tel.instrument(Dispatcher(platform=platform, policy=policy))
        samples: list[dict[str, Any]] = []
        for i, (args, kw) in enumerate(calls_list):
            d(*args, **kw)
            if i % 64 == 63 or i == len(calls_list) - 1:
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                samples.extend(tel.drain_samples())
            if progress and (i % 1000 == 999 or i == len(calls_list) - 1):
                progress(f"{i + 1} of {len(calls_list)} calls timed")
        totals = tel.totals
        rows = compare(samples, totals, min_samples=min_samples)
        sizes = scrape_sizes(tel.registry)
        dropped = {k[0]: v for k, v in totals.dropped.items() if v}
    finally:
        tel.close()
    return {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "arch": platform.arch,
        "dtype": str(dtype).removeprefix("torch."), "shapes": shape, "calls_per_bucket": calls, "max_rows": max_rows,
        "min_samples": min_samples, "calls": len(calls_list), "samples": len(samples), "dropped": dropped,
        "histogram_series": len(totals.latency), "series": rows, "scrape": sizes,
        "within_bound": within_bound(rows),
    }


def render(result: dict[str, Any]) -> None:
    """Two tables: quantiles per series (µs and % off the exact one), then the scrape in each format."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 170))
    console.print(f"{result['device']} ({result['arch']}), {result['dtype']}, shapes {result['shapes']}: "
                  f"{result['calls']} calls, {result['samples']} timed, {result['calls_per_bucket']} per model and "
                  f"rows bucket (rows at random inside it); series with >= {result['min_samples']} samples")
    table = Table(title="exact p50 / p90 / p99 (µs), and histogram_quantile's error on the classic and native buckets (%)")
    for col in ("kernel", "rows", "model", "clock", "n", "exact", "classic error", "native error"):
        table.add_column(col, justify="left" if col in ("kernel", "rows", "model", "clock") else "right")
    names = [f"p{round(q * 100)}" for q in QUANTILES]
    for r in result["series"]:
        table.add_row(r["kernel"], r["rows_bucket"], r["model"], r["clock"], str(r["samples"]),
                      " / ".join(f"{r[f'exact_{n}_s'] * 1e6:,.1f}" for n in names),
                      " / ".join(f"{r[f'classic_{n}_error_pct']:+.1f}" for n in names),
                      " / ".join(f"{r[f'native_{n}_error_pct']:+.1f}" for n in names))
    console.print(table)
    bound = result["within_bound"]
    if bound["classic"] is None:
        console.print(f"no series has >= {result['min_samples']} samples: nothing compared (more --calls, or a "
                      "lower --min-samples)")
    else:
        console.print(f"within {BOUND_PCT:g}% at p50/p90/p99 in every series above: classic {bound['classic']}, "
                      f"native {bound['native']}")
    buckets = sorted(r["native_buckets"] for r in result["series"])
    if buckets:
        console.print(f"populated native buckets a series: median {buckets[len(buckets) // 2]}, max {buckets[-1]}")
    sizes = Table(title=f"one scrape of this process ({result['histogram_series']} latency histogram series)")
    for col in ("format", "series stored", "bytes", "gzip bytes", "latency series", "latency bytes"):
        sizes.add_column(col, justify="left" if col == "format" else "right")
    for s in result["scrape"]:
        sizes.add_row(s["format"], f"{s['series']:,}", f"{s['bytes']:,}", f"{s['gzip_bytes']:,}",
                      f"{s['latency_series']:,}", f"{s['latency_bytes']:,}")
    console.print(sizes)
    proto = next(s for s in result["scrape"] if s["format"] == "protobuf")
    for kind in ("classic", "native"):
        console.print(f"remote write, stored {kind}: {proto[f'remote_write_{kind}_series']:,} series, "
                      f"{proto[f'remote_write_{kind}_bytes']:,} bytes a scrape before compression")
    if result["dropped"]:
        console.print(f"dropped: {result['dropped']}")
