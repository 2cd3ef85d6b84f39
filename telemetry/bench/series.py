"""Series per rank in each histogram mode, as a Prometheus stores them, at a production-like traffic.

The traffic: two models, every rows bucket, prefill calls and pure decodes, on all four kernels. No platform routes
to all four (gfx942 has no OPUS gate, gfx950 no ``pa_prefill_sparse`` one), so one rank is two telemetry
processes writing one multiprocess directory under the same rank label, as a rank's processes do: one decides on
a what-if gfx942 (``intree.ragged_prefill``, ``aiter.pa_prefill_sparse``; decodes in prefill), the other on a
what-if gfx950 with the guard rerouting decodes (``aiter.pa_sparse_prefill_opus``, ``intree.sparse_decode``).
Kernels do not run (the dispatcher's decisions are real, the launches no-ops: a double for AITER and the GPU); every call is timed on the host.

The merged directory is encoded in each mode for each scraper: Prometheus 2.42 with native histograms (protobuf;
it stores a histogram with native buckets as native only) and without (OpenMetrics 1.0 text). Stored series are
counted from the bodies: a native histogram is one series, a classic one its buckets, ``_count`` and ``_sum``.
Routing sends each kernel only its rows buckets; the bound (every kernel at every rows bucket) adds, per latency
histogram more, what one costs in that mode and scraper.
"""

from __future__ import annotations

import tempfile
from typing import Any

import torch

from dispatcher import Dispatcher, Policy, what_if
from dispatcher.kernels import KernelImpl, KernelRegistry
from dispatcher.types import GuardMode, Kernel

from ..config import HISTOGRAM_MODES, TelemetryConfig
from ..core import Telemetry
from ..exposition import negotiate
from ..multiproc.reader import multiprocess_registry
from ..spec import HISTOGRAM
from .quantiles import _stored_series
from .workload import _noop, make_calls

MODELS = ("DeepSeek-V4.1-Flash", "GLM-5.3-Flash")
SCRAPERS = (
    ("protobuf", "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,"
                 "application/openmetrics-text;version=1.0.0;q=0.8,text/plain;version=0.0.4;q=0.5"),
    ("text", "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"),
)
PREFILL = {"num_decodes": 0, "num_decode_tokens": 0, "num_prefills": 1}


def no_launch_registry() -> KernelRegistry:
    """Every kernel a no-op, the AITER ones under AITER's impl name (telemetry takes another name on an OPUS call
    for a declined launch)."""
    reg = KernelRegistry()
    for k in Kernel:
        reg.register(KernelImpl(k, "aiter" if k.value.startswith("aiter.") else "noop", _noop))
    return reg


def production_mix(max_rows: int = 16384) -> tuple:
    """A prefill call at the lower edge of every rows bucket and 1-, 2- and 4-row pure decodes, for both models."""
    edges = [1]
    while edges[-1] < max_rows:
        edges.append(edges[-1] * 2)
    mix = []
    for model in MODELS:
        mix += [(rows, PREFILL, model) for rows in edges]
        mix += [(rows, {"num_decodes": rows, "num_decode_tokens": rows, "num_prefills": 0}, model) for rows in (1, 2, 4)]
    return tuple(mix)


def _text_series(body: bytes) -> tuple[int, int]:
    """(sample lines, of them the latency family's) of a text exposition: one stored series each."""
    total = latency = 0
    for line in body.split(b"\n"):
        if line and not line.startswith(b"#"):
            total += 1
            latency += line.startswith(HISTOGRAM.name.encode())
    return total, latency


def count(registry: Any) -> list[dict[str, Any]]:
    """Stored series of one rank per mode and scraper."""
    rows = []
    for mode in HISTOGRAM_MODES:
        for scraper, accept in SCRAPERS:
            encoder, _ = negotiate(accept, mode=mode)
            body = encoder(registry)
            series, latency = _stored_series(body) if scraper == "protobuf" else _text_series(body)
            rows.append({"mode": mode, "scraper": scraper, "series": series, "latency_series": latency,
                         "other_series": series - latency})
    return rows


def run(*, calls_per_kind: int = 3) -> dict[str, Any]:
    """The production-like rank's series in every mode; ``calls_per_kind`` calls of each mix entry."""
    mix = production_mix()
    with tempfile.TemporaryDirectory(prefix="routescope-series-") as directory:
        made = []
        for pid, (arch, guard) in enumerate((("gfx942", GuardMode.OBSERVE), ("gfx950", GuardMode.REROUTE))):
            platform, policy = what_if(arch), Policy(guard=guard)
            cfg = TelemetryConfig(models=MODELS, multiproc_dir=directory, rank="0", process_id=f"p{pid}",
                                  timing="host", sample_every=1, flush_on_exit=False, log_first_decode_in_prefill=False)
            tel = Telemetry(cfg, platform=platform, policy=policy)
            d = tel.instrument(Dispatcher(platform=platform, policy=policy, registry=no_launch_registry()))
            sink = torch.zeros(2, dtype=torch.float32) if arch == "gfx950" else None  # OPUS takes calls with a sink
            layout = dict(nope=64, rope=0) if arch == "gfx950" else {}  # OPUS: output lanes (and strides) as q's
            for args, kw in make_calls(calls_per_kind * len(mix), heads=2, mix=mix, **layout):
                d(*args[:8], sink, *args[9:], **kw)
            tel.flush()
            made.append(tel)
        registry = multiprocess_registry(directory)
        histograms = {}
        for fam in registry.collect():
            if fam.name == HISTOGRAM.name:
                histograms = {tuple(sorted((k, v) for k, v in s.labels.items() if k != "le")) for s in fam.samples
                              if s.name == HISTOGRAM.name + "_count"}
        kernels = sorted({dict(k)["kernel"] for k in histograms})
        buckets = len([b for b in made[0].snapshot()["rows_buckets"] if b != "0"])  # a call has at least one row
        rows = count(registry)
        bound = len(MODELS) * len(Kernel) * buckets  # every kernel at every rows bucket: more than routing makes
        for r in rows:
            per_histogram = r["latency_series"] / len(histograms)
            r["bound_latency_histograms"] = bound
            r["bound_series"] = round(r["other_series"] + bound * per_histogram)
        for tel in made:
            tel.close()
    return {"traffic": "production-like: 2 models x 4 kernels x every rows bucket (one rank)",
            "latency_histograms": len(histograms), "kernels": kernels, "models": list(MODELS), "rows_buckets": buckets,
            "rows": rows}


def render(result: dict[str, Any]) -> None:
    print(f"{result['traffic']}: {result['latency_histograms']} latency histograms over {', '.join(result['kernels'])}")
    bound = result["rows"][0]["bound_latency_histograms"]
    print(f"{'mode':8} {'scraper':9} {'series':>7} {'latency':>8} {'other':>6}  {'bound (' + str(bound) + ' histograms)':>24}")
    for r in result["rows"]:
        print(f"{r['mode']:8} {r['scraper']:9} {r['series']:7d} {r['latency_series']:8d} {r['other_series']:6d}  "
              f"{r['bound_series']:24d}")
