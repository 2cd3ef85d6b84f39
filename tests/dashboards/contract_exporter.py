"""A stand-in exporter that speaks exactly docs/metrics.md, for testing dashboards and rules.

Not the service: it invents traffic (with prometheus_client, on a loopback port) so the
dashboard and rules can be proven against a real Prometheus before `routescope serve
--demo` exists, and so a drift between the contract and the queries shows up on its own.
`glm_bug=True` sends pure-decode and mixed calls through the in-tree prefill kernel, as the
GLM backend of the seed did.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

# 1 us ... 100 s, 1-2.5-5 per decade (docs/metrics.md)
BUCKETS = tuple(m * 10.0**e for e in range(-6, 2) for m in (1, 2.5, 5)) + (100.0,)
PREFILL = "intree.ragged_prefill"


@dataclass
class ContractExporter:
    model: str
    rank: str = "0"
    glm_bug: bool = False
    period: float = 0.1
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.calls = Counter("routescope_calls", "calls launched",
                             ["kernel", "impl", "rows_bucket", "model", "call_class", "arch", "rank"], registry=r)
        self.rows = Counter("routescope_rows", "query rows launched",
                            ["kernel", "rows_bucket", "model", "call_class", "rank"], registry=r)
        self.decisions = Counter("routescope_decisions", "decisions", ["kernel", "reason", "model", "rank"], registry=r)
        labels = ["kernel", "model", "call_class", "rank"]
        self.dip_calls = Counter("routescope_decode_in_prefill_calls", "dip calls", labels, registry=r)
        self.dip_rows = Counter("routescope_decode_in_prefill_rows", "dip rows", labels, registry=r)
        Counter("routescope_guard_rerouted_calls", "rerouted", ["from_kernel", "to_kernel", "model", "rank"], registry=r)
        Counter("routescope_guard_refused_calls", "refused", ["kernel", "model", "rank"], registry=r)
        self.duration = Histogram("routescope_call_duration_seconds", "latency",
                                  ["kernel", "rows_bucket", "model", "rank"], buckets=BUCKETS, registry=r)
        self.would = Counter("routescope_would_route_calls", "would-route",
                             ["policy", "kernel", "rows_bucket", "model", "rank"], registry=r)
        Counter("routescope_kernel_errors", "kernel errors", ["kernel", "exception", "model", "rank"], registry=r)
        Counter("routescope_graph_captured_calls", "captured", ["kernel", "model", "rank"], registry=r)
        self.path_calls = Counter("routescope_decode_path_calls", "decode entry calls", ["model", "rank"], registry=r)
        self.path_rows = Counter("routescope_decode_path_rows", "decode entry rows", ["model", "rank"], registry=r)
        errors = Counter("routescope_telemetry_errors", "telemetry errors", ["stage", "rank"], registry=r)
        drops = Counter("routescope_telemetry_dropped", "telemetry drops", ["reason", "rank"], registry=r)
        self.flush = Gauge("routescope_telemetry_last_flush_timestamp_seconds", "last flush", ["rank"], registry=r)
        gate = Gauge("routescope_gate_threshold_rows", "thresholds", ["gate", "policy"], registry=r)
        info = Gauge("routescope_build_info", "build", ["version", "arch", "vendor", "aiter", "timing"], registry=r)
        self._advice(r)
        # Known label sets exist at zero from the start.
        for stage in ("record", "timing", "flush", "export", "otel", "probe"):
            errors.labels(stage, self.rank)
        for reason in ("buffer_full", "label_overflow", "timing_pool_empty"):
            drops.labels(reason, self.rank)
        for cls in ("mixed", "pure_decode"):
            self.dip_calls.labels(PREFILL, self.model, cls, self.rank)
            self.dip_rows.labels(PREFILL, self.model, cls, self.rank)
        for policy, threshold in (("active", 512), ("gfx942_1024", 1024)):
            gate.labels("gfx942_min_rows", policy).set(threshold)
        gate.labels("gfx950_min_rows", "active").set(1024)
        info.labels("0.1.0", "cpu", "cpu", "false", "host").set(1)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._server = None
        self.port: int | None = None

    def _advice(self, r: CollectorRegistry) -> None:
        """The service's advice series (docs/metrics.md, its own section): fixed predictions, as an H200 table gives."""
        labels = ["model", "policy", "estimate"]
        kernel = Gauge("routescope_advice_kernel_seconds_per_hour", "predicted", labels, registry=r)
        saving = Gauge("routescope_advice_saving_seconds_per_hour", "predicted saving", labels, registry=r)
        dip = Gauge("routescope_advice_decode_in_prefill_seconds_per_hour", "dip cost", ["model", "estimate"], registry=r)
        table = Gauge("routescope_advice_table_info", "tables", ["table", "device", "arch", "date", "provenance"],
                      registry=r)
        table.labels("h200-sweep-cupti", "NVIDIA H200", "sm90", "2026-12-01", "measured here").set(1)
        for est, f in (("mid", 1.0), ("low", 0.9), ("high", 1.2)):
            kernel.labels(self.model, "active", est).set(30.0 * f)
            kernel.labels(self.model, "split_below_128", est).set(28.0 * f)
            saving.labels(self.model, "split_below_128", est).set(2.0 * f)
            if self.glm_bug:
                dip.labels(self.model, est).set(1.5 * f)

    def _call(self, rows: int, bucket: str, cls: str, decode_rows: int, seconds: float) -> None:
        m, r = self.model, self.rank
        self.calls.labels(PREFILL, "torch", bucket, m, cls, "cpu", r).inc()
        self.rows.labels(PREFILL, bucket, m, cls, r).inc(rows)
        self.decisions.labels(PREFILL, "arch_not_gated", m, r).inc()
        self.duration.labels(PREFILL, bucket, m, r).observe(seconds)
        gfx942 = "aiter.pa_prefill_sparse" if rows >= 512 else PREFILL
        self.would.labels("gfx942_512", gfx942, bucket, m, r).inc()
        self.would.labels("no_row_gate", "aiter.pa_prefill_sparse", bucket, m, r).inc()
        if decode_rows:
            self.dip_calls.labels(PREFILL, m, cls, r).inc()
            self.dip_rows.labels(PREFILL, m, cls, r).inc(decode_rows)

    def step(self) -> None:
        """One scheduler step: a prefill chunk, then decodes (through prefill if buggy)."""
        self._call(2048, "2048-4095", "prefill", 0, 0.0021)
        if self.glm_bug:
            self._call(2052, "2048-4095", "mixed", 4, 0.0023)
            self._call(2, "2-3", "pure_decode", 2, 0.000293)
        else:
            self.path_calls.labels(self.model, self.rank).inc()
            self.path_rows.labels(self.model, self.rank).inc(2)
        self.flush.labels(self.rank).set(time.time())

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.step()

    def start(self, port: int) -> "ContractExporter":
        self.step()
        self._server, _ = start_http_server(port, addr="127.0.0.1", registry=self.registry)
        self.port = port
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
