"""The metric contract of docs/metrics.md as data: every exporter and test reads names and labels from here."""

from __future__ import annotations

from typing import NamedTuple

STAGES = ("record", "timing", "flush", "export", "otel", "probe", "write", "read", "compact", "merge")
DROP_REASONS = ("buffer_full", "label_overflow", "timing_pool_empty", "timing_unresolved", "timing_gate_timeout",
                "timing_clock_pending")  # timing_clock_pending: a sampled call whose clock was not built yet
CLOCKS = ("device", "gated", "graph", "bracket", "events", "host")  # slots.Clock: what a latency series measured


class MetricSpec(NamedTuple):
    """One series family: ``name`` is the exposed name (counters end in ``_total``)."""

    name: str
    kind: str  # counter, histogram, gauge
    labels: tuple[str, ...]
    help: str
    field: str  # the Totals attribute holding its values, keyed by label tuples
    mp_mode: str = ""  # multiprocess gauge mode

    @property
    def base(self) -> str:
        """Name without ``_total``: prometheus_client's family name and the OpenTelemetry instrument name."""
        return self.name[: -len("_total")] if self.name.endswith("_total") else self.name


R = ("rank",)
# The row-free call shape a latency table is indexed by; kv_pool_bytes is the pool's power-of-two bucket of bytes
# (dispatcher.pools.pool_bucket: at most 21 values), "" where the call's shape does not know it.
TRAFFIC_LABELS = ("kernel", "rows_bucket", "model", "call_class", "topk", "layout", "q_dtype", "kv_dtype",
                  "kv_pool_bytes")
COUNTERS = (
    MetricSpec("routescope_calls_total", "counter",
               ("kernel", "impl", "rows_bucket", "model", "call_class", "arch") + R,
               "Sparse MLA prefill calls launched.", "calls"),
    MetricSpec("routescope_rows_total", "counter", ("kernel", "rows_bucket", "model", "call_class") + R,
               "Query rows launched (q.shape[0]).", "rows"),
    MetricSpec("routescope_decisions_total", "counter", ("kernel", "reason", "model") + R,
               "Routing decisions by kernel and reason code.", "decisions"),
    MetricSpec("routescope_decode_in_prefill_calls_total", "counter", ("kernel", "model", "call_class") + R,
               "Calls with decode rows that a prefill kernel (no split-K) ran.", "dip_calls"),
    MetricSpec("routescope_decode_in_prefill_rows_total", "counter", ("kernel", "model", "call_class") + R,
               "Decode rows in calls that a prefill kernel ran.", "dip_rows"),
    MetricSpec("routescope_guard_rerouted_calls_total", "counter", ("from_kernel", "to_kernel", "model") + R,
               "Pure-decode calls the guard sent to intree.sparse_decode.", "rerouted"),
    MetricSpec("routescope_guard_refused_calls_total", "counter", ("kernel", "model") + R,
               "Calls refused in guard mode raise.", "refused"),
    MetricSpec("routescope_would_route_calls_total", "counter", ("policy", "kernel", "rows_bucket", "model") + R,
               "What a counterfactual policy would have launched for the same calls.", "would_route"),
    MetricSpec("routescope_kernel_errors_total", "counter", ("kernel", "exception", "model") + R,
               "Kernel launches that raised (re-raised unchanged).", "kernel_errors"),
    MetricSpec("routescope_graph_captured_calls_total", "counter", ("kernel", "model") + R,
               "Calls seen while a CUDA/HIP graph was captured (each replay then counts them as calls).", "captured"),
    MetricSpec("routescope_graph_replayed_calls_total", "counter", ("kernel", "model") + R,
               "Of routescope_calls_total: calls counted from CUDA/HIP graph replays.", "replayed"),
    MetricSpec("routescope_graph_untimed_replayed_calls_total", "counter", ("kernel", "model") + R,
               "Of routescope_graph_replayed_calls_total: replayed calls no clock times (their kernels write no "
               "device stamp); the latency histogram holds none of them.", "replayed_untimed"),
    MetricSpec("routescope_traffic_calls_total", "counter",
               TRAFFIC_LABELS + R,
               "Calls launched, by the row-free call shape a latency table is indexed by.", "traffic_calls"),
    MetricSpec("routescope_traffic_rows_total", "counter",
               TRAFFIC_LABELS + R,
               "Query rows launched, by the row-free call shape.", "traffic_rows"),
    MetricSpec("routescope_traffic_decode_rows_total", "counter",
               TRAFFIC_LABELS + R,
               "Decode rows of those calls (mixed and pure-decode batches).", "traffic_decode_rows"),
    MetricSpec("routescope_decode_path_calls_total", "counter", ("model",) + R,
               "Calls of the decode entry.", "decode_path_calls"),
    MetricSpec("routescope_decode_path_rows_total", "counter", ("model",) + R,
               "Rows of decode-entry calls.", "decode_path_rows"),
    MetricSpec("routescope_telemetry_errors_total", "counter", ("stage",) + R,
               "Exceptions caught inside telemetry.", "telemetry_errors"),
    MetricSpec("routescope_telemetry_dropped_total", "counter", ("reason",) + R,
               "Records or samples telemetry dropped.", "dropped"),
)
HISTOGRAM = MetricSpec(
    "routescope_call_duration_seconds", "histogram", ("kernel", "rows_bucket", "model", "clock") + R,
    "Per-call latency of sampled calls; clock: device (the call's kernels, first program in to last out), "
    "gated (an event pair behind a stream gate), graph (an event pair captured into a graph), bracket (two stamp "
    "kernels captured into a graph), events (a GPU event pair around the launch) or host.", "latency",
)
GAUGES = (
    MetricSpec("routescope_telemetry_last_flush_timestamp_seconds", "gauge", R,
               "Unix time of the last completed flush.", "last_flush", "livemax"),
    MetricSpec("routescope_gate_threshold_rows", "gauge", ("gate", "policy"),
               "Active gate thresholds per policy.", "thresholds", "livemax"),
    MetricSpec("routescope_counterfactual_policy_info", "gauge", ("policy", "arch"),
               "Counterfactual policies and the arch each is decided on (value 1).", "cf_info", "livemax"),
    MetricSpec("routescope_clock_constant_seconds", "gauge", ("clock", "device") + R,
               "The constant of each clock on each device: added to device spans (the kernel frame), taken off "
               "gated, graph and bracket readings (bracket: calibrated once per device by empty brackets replayed "
               "on the flush thread).", "clock_constants", "livemax"),
    MetricSpec("routescope_build_info", "gauge", ("version", "arch", "vendor", "aiter", "timing"),
               "What this process is.", "build_info", "livemax"),
)
ALL = COUNTERS + (HISTOGRAM,) + GAUGES
BY_NAME = {s.name: s for s in ALL}
