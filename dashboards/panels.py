"""The dashboard's panels, row by row: every query reads docs/metrics.md or recording.yml."""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.builders import table, timeseries
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")

# Alert thresholds drawn on panels; tests/dashboards checks them against alerts.yml.
DECODE_IN_PREFILL_THRESHOLD = 0  # DecodeInPrefill / DecodeRowsInPrefill: any is too many
FLUSH_LAG_THRESHOLD_SECONDS = 120  # RoutescopeTelemetryFlushStalled

# Appended to queries over counters that exist only once an event happened (errors,
# drops, guard actions): the panel shows 0 instead of "No data" on a healthy fleet.
FALLBACK = " or on() vector(0)"

# Label matchers per series family (telemetry health series carry only rank).
# cluster and node come from a fleet's agents (dashboards/prometheus-agent.yml); "All" (.*) also matches series
# without them, so the same panels read a single Prometheus.
FLEET = 'cluster=~"$cluster", node=~"$node"'
SEL = 'model=~"$model", ' + FLEET + ', instance=~"$instance", rank=~"$rank", kernel=~"$kernel"'
SEL_MODEL = 'model=~"$model", ' + FLEET + ', instance=~"$instance", rank=~"$rank"'
SEL_PROC = FLEET + ', instance=~"$instance", rank=~"$rank"'


def _q(expr: str, legend: str = "", ref: str = "A", *, instant: bool = False) -> prom.Dataquery:
    q = prom.Dataquery().expr(expr).ref_id(ref).datasource(DS)
    if legend:
        q = q.legend_format(legend)
    if instant:
        q = q.instant().format("table")
    return q


def _legend() -> cb.VizLegendOptions:
    return (
        cb.VizLegendOptions()
        .display_mode(cm.LegendDisplayMode.TABLE)
        .placement(cm.LegendPlacement.RIGHT)
        .show_legend(True)
        .calcs(["mean", "lastNotNull", "max"])
    )


def _threshold_line(value: float, color: str = "red") -> db.ThresholdsConfig:
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(
        [dm.Threshold(value=None, color="transparent"), dm.Threshold(value=value, color=color)]
    )


def _ts(
    title: str,
    description: str,
    unit: str,
    targets: list[prom.Dataquery],
    *,
    width: int = 12,
    stack: cm.StackingMode | None = None,
    log: bool = False,
    threshold: float | None = None,
    threshold_area: bool = False,
) -> timeseries.Panel:
    p = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .height(8)
        .span(width)
        .legend(_legend())
        .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING))
        .fill_opacity(25 if stack else 8)
        .line_width(1)
        .targets(targets)
    )
    if stack is not None:
        p = p.stacking(cb.StackingConfig().mode(stack))
    if log:
        p = p.scale_distribution(cb.ScaleDistributionConfig().type(cm.ScaleDistribution.LOG).log(10))
    else:
        p = p.min(0)
    if threshold is not None:
        mode = cm.GraphTresholdsStyleMode.DASHED_AND_AREA if threshold_area else cm.GraphTresholdsStyleMode.DASHED
        p = p.thresholds(_threshold_line(threshold)).thresholds_style(
            cb.GraphThresholdsStyleConfig().mode(mode)
        ).axis_soft_max(threshold + 1)
    return p


def _table(
    title: str,
    description: str,
    targets: list[prom.Dataquery],
    *,
    width: int = 12,
    columns: dict[str, tuple[str, str]] | None = None,
) -> table.Panel:
    """An instant-query table; `columns` maps a refId to (column title, unit)."""
    columns = columns or {}
    rename = {f"Value #{ref}": name for ref, (name, _) in columns.items()}
    merge = [
        dm.DataTransformerConfig(id_val="merge", options={}),
        dm.DataTransformerConfig(
            id_val="organize", options={"excludeByName": {"Time": True}, "renameByName": rename}
        ),
    ]
    p = (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .height(8)
        .span(width)
        .targets(targets)
        .transformations(merge)
        .show_header(True)
    )
    for ref, (name, unit) in columns.items():
        p = p.override_by_name(name, [dm.DynamicConfigValue(id_val="unit", value=unit)])
    return p


def _routing_panels() -> list[Any]:
    calls = f"routescope:calls:rate5m{{{SEL}}}"
    return [
        _ts(
            "Launches per second by kernel",
            "Calls launched per second on each attention kernel (recording rule routescope:calls:rate5m).",
            "ops",
            [_q(f"sum by (kernel) ({calls})", "{{kernel}}")],
        ),
        _ts(
            "Rows share by kernel × rows bucket",
            "Share of query rows (q.shape[0]) each kernel ran, by rows bucket. "
            "The gfx942 gate moves the 512+ buckets from intree.ragged_prefill to aiter.pa_prefill_sparse.",
            "percentunit",
            [_q(f"sum by (kernel, rows_bucket) (routescope:rows:rate5m{{{SEL}}})", "{{kernel}} {{rows_bucket}}")],
            stack=cm.StackingMode.PERCENT,
        ),
        _ts(
            "Decisions by reason",
            "Routing decisions per second by reason_code and the kernel chosen.",
            "ops",
            [
                _q(
                    f"sum by (reason, kernel) (rate(routescope_decisions_total{{{SEL}}}[$__rate_interval]))",
                    "{{reason}} → {{kernel}}",
                )
            ],
            stack=cm.StackingMode.NORMAL,
        ),
        _table(
            "Calls by kernel × rows bucket (dashboard range)",
            "Calls launched over the selected time range: the routing matrix.",
            [
                _q(
                    f"sum by (kernel, rows_bucket) (increase(routescope_calls_total{{{SEL}}}[$__range]))",
                    instant=True,
                )
            ],
        ),
    ]


def _latency_panels() -> list[Any]:
    """Quantiles from the native histogram where Prometheus stores one, else from the classic buckets (recording.yml)."""
    native = f"routescope:call_duration_seconds:rate5m{{{SEL}}}"
    buckets = f"routescope:call_duration_seconds_bucket:rate5m{{{SEL}}}"

    def quantile(q: float) -> str:
        return (f"histogram_quantile({q}, sum by (kernel, rows_bucket, clock) ({native})) or "
                f"histogram_quantile({q}, sum by (kernel, rows_bucket, clock, le) ({buckets}))")

    return [
        _ts(
            "Per-call latency p50 by kernel × rows bucket",
            "Median per-call latency of sampled calls, one series per clock (device: the call's own kernels; "
            "events: a GPU event pair; host: CPU).",
            "s",
            [_q(quantile(0.5), "{{kernel}} {{rows_bucket}} ({{clock}})")],
            log=True,
        ),
        _ts(
            "Per-call latency p99 by kernel × rows bucket",
            "p99 per-call latency; RoutescopeLatencyRegression compares the fleet-wide value "
            "with the median of the last day.",
            "s",
            [_q(quantile(0.99), "{{kernel}} {{rows_bucket}} ({{clock}})")],
            log=True,
        ),
        _table(
            "Latency now: p50, p99, timed calls/s by kernel × rows bucket",
            "The seed's per-call table, live: p50 and p99 over 5m and how many timed calls they rest on.",
            [
                _q(quantile(0.5), ref="p50", instant=True),
                _q(quantile(0.99), ref="p99", instant=True),
                _q(
                    f'sum by (kernel, rows_bucket, clock) (routescope:call_duration_seconds_bucket:rate5m{{{SEL}, le="+Inf"}})'
                    f" or sum by (kernel, rows_bucket, clock) (histogram_count({native}))",
                    ref="timed_per_s",
                    instant=True,
                ),
            ],
            width=24,
            columns={"p50": ("p50", "s"), "p99": ("p99", "s"), "timed_per_s": ("timed calls/s", "ops")},
        ),
    ]


def _decode_panels() -> list[Any]:
    def dip(metric: str) -> str:
        return f"sum by (model, call_class) (rate({metric}{{{SEL}}}[$__rate_interval]))"

    dip_rows = f"sum by (model) (rate(routescope_decode_in_prefill_rows_total{{{SEL}}}[$__rate_interval]))"
    path_rows = f"sum by (model) (rate(routescope_decode_path_rows_total{{{SEL_MODEL}}}[$__rate_interval]))"
    guard = f"{FLEET}, instance=~\"$instance\", rank=~\"$rank\", model=~\"$model\""
    return [
        _ts(
            "Decode-in-prefill calls/s by model",
            "Calls with decode rows that a prefill kernel (no split-K) ran. Above the dashed line: "
            "pure_decode fires DecodeInPrefill (critical), mixed fires DecodeRowsInPrefill (warning).",
            "ops",
            [_q(dip("routescope_decode_in_prefill_calls_total") + FALLBACK, "{{model}} {{call_class}}")],
            threshold=DECODE_IN_PREFILL_THRESHOLD,
        ),
        _ts(
            "Decode rows in prefill kernels, rows/s by model",
            "Decode rows inside those calls. Above the dashed line the decode-in-prefill alerts fire.",
            "rowsps",
            [_q(dip("routescope_decode_in_prefill_rows_total") + FALLBACK, "{{model}} {{call_class}}")],
            threshold=DECODE_IN_PREFILL_THRESHOLD,
        ),
        _ts(
            "Share of decode rows that ran on prefill kernels",
            "Decode rows in prefill kernels / (those + rows of the decode entry rocm_sparse_attn_decode).",
            "percentunit",
            [
                _q(
                    f"{dip_rows} / ({dip_rows} + ({path_rows} or {dip_rows} * 0))" + FALLBACK,
                    "{{model}}",
                )
            ],
        ),
        _ts(
            "Guard actions/s",
            "Pure-decode calls the guard rerouted to intree.sparse_decode (mode reroute) or refused (mode raise).",
            "ops",
            [
                _q(
                    f"sum by (model, from_kernel, to_kernel) (rate(routescope_guard_rerouted_calls_total{{{guard}}}[$__rate_interval]))"
                    + FALLBACK,
                    "rerouted {{model}} {{from_kernel}} → {{to_kernel}}",
                    "rerouted",
                ),
                _q(
                    f"sum by (model, kernel) (rate(routescope_guard_refused_calls_total{{{SEL}}}[$__rate_interval]))"
                    + FALLBACK,
                    "refused {{model}} {{kernel}}",
                    "refused",
                ),
            ],
        ),
    ]


def _counterfactual_panels() -> list[Any]:
    return [
        _ts(
            "Counterfactual: would-route calls/s by policy × kernel",
            "What each counterfactual policy would have launched for the same calls, beside what ran.",
            "ops",
            [
                _q(
                    f"sum by (policy, kernel) (rate(routescope_would_route_calls_total{{{SEL}}}[$__rate_interval]))",
                    "{{policy}} → {{kernel}}",
                    "would",
                ),
                _q(
                    f"sum by (kernel) (rate(routescope_calls_total{{{SEL}}}[$__rate_interval]))",
                    "actual → {{kernel}}",
                    "actual",
                ),
            ],
        ),
        _table(
            "Active gate thresholds (rows)",
            "routescope_gate_threshold_rows per gate and policy; each is also a rows bucket edge.",
            [_q('max by (gate, policy) (routescope_gate_threshold_rows{' + FLEET + ', instance=~"$instance"})', instant=True)],
        ),
    ]


def _health_panels() -> list[Any]:
    return [
        _ts(
            "Kernel errors/s by kernel × exception",
            "Kernel launches that raised (re-raised unchanged). Any fires RoutescopeKernelErrors.",
            "ops",
            [
                _q(
                    f"sum by (kernel, exception) (rate(routescope_kernel_errors_total{{{SEL}}}[$__rate_interval]))"
                    + FALLBACK,
                    "{{kernel}} {{exception}}",
                )
            ],
            width=8,
        ),
        _ts(
            "Telemetry errors and drops/s",
            "Exceptions caught inside telemetry by stage, and records/samples dropped by reason.",
            "ops",
            [
                _q(
                    f"sum by (stage) (rate(routescope_telemetry_errors_total{{{SEL_PROC}}}[$__rate_interval]))"
                    + FALLBACK,
                    "error {{stage}}",
                    "errors",
                ),
                _q(
                    f"sum by (reason) (rate(routescope_telemetry_dropped_total{{{SEL_PROC}}}[$__rate_interval]))"
                    + FALLBACK,
                    "dropped {{reason}}",
                    "drops",
                ),
            ],
            width=8,
        ),
        _ts(
            "Telemetry flush lag",
            "time() - routescope_telemetry_last_flush_timestamp_seconds per process. "
            "Above the line for 2m fires RoutescopeTelemetryFlushStalled.",
            "s",
            [
                _q(
                    f"time() - max by (node, instance, rank) (routescope_telemetry_last_flush_timestamp_seconds{{{SEL_PROC}}})",
                    "{{node}} {{instance}} rank {{rank}}",
                )
            ],
            width=8,
            threshold=FLUSH_LAG_THRESHOLD_SECONDS,
            threshold_area=True,
        ),
        _table(
            "Processes (build info)",
            "What each scraped process is: version, arch, vendor, AITER, timing mode.",
            [
                _q(
                    'max by (node, instance, version, arch, vendor, aiter, timing) (routescope_build_info{' + FLEET
                    + ', instance=~"$instance"})',
                    instant=True,
                )
            ],
            width=24,
        ),
    ]


def _advice_panels() -> list[Any]:
    sel = 'model=~"$model", ' + FLEET + ', instance=~"$instance"'

    def advice(metric: str, estimate: str, by: str = "model, policy") -> str:
        return f'max by ({by}) (routescope_advice_{metric}_seconds_per_hour{{{sel}, estimate="{estimate}"}})'

    note = ("Predicted, never measured: the calls seen times a latency table's per-call times (routescope advise; "
            "'Advice rests on' names the table). Per hour of traffic since the service started.")
    return [
        _ts(
            "Advice: predicted kernel seconds per hour by model × policy",
            note + " Decode-in-prefill: what decode rows in prefill kernels cost against the decode entry.",
            "s",
            [_q(advice("kernel", "mid"), "{{model}} {{policy}}"),
             _q(advice("decode_in_prefill", "mid", "model"), "{{model}} decode-in-prefill cost", "dip")],
        ),
        _table(
            "Advice: predicted saving per hour against the active policy (band)",
            note + " Positive saves kernel time; low and high bound the band.",
            [_q(advice("saving", est), ref=est, instant=True) for est in ("mid", "low", "high")],
            columns={est: (name, "s") for est, name in (("mid", "saving"), ("low", "low"), ("high", "high"))},
        ),
        _table(
            "Advice rests on (latency tables)",
            "routescope_advice_table_info: each table's device, date and provenance (measured here, or published).",
            [_q('max by (table, device, arch, date, provenance) (routescope_advice_table_info{' + FLEET + ', instance=~"$instance"})',
                instant=True)],
            width=24,
        ),
    ]


ROWS = (
    ("Routing", _routing_panels),
    ("Latency", _latency_panels),
    ("Decode in prefill", _decode_panels),
    ("Counterfactual policies", _counterfactual_panels),
    ("Errors and telemetry health", _health_panels),
    ("Advice (predicted from a latency table, not measured)", _advice_panels),
)
