"""TelemetryConfig: plain frozen settings, read from the environment only when ``from_env`` is called."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from enum import Enum
from typing import Any

from dispatcher.platform import KNOWN_ARCHS
from dispatcher.policy import Policy

from .clocks.frame import AUTO as MEASURED_FRAME



class TimingMode(str, Enum):
    """How sampled calls are timed. ``auto`` is a setting only: it resolves to ``gpu`` where CUDA is, else ``host``."""

    AUTO = "auto"
    GPU = "gpu"  # device tensors: the kernels' own stamps, an event pair where a kernel writes none
    HOST = "host"  # perf_counter around the call
    OFF = "off"

    def __str__(self) -> str:
        return self.value


TIMING_MODES = tuple(m.value for m in TimingMode)


class HistogramMode(str, Enum):
    """Which forms of the latency histogram /metrics serves; telemetry.exposition.modes shapes each format to it."""

    BOTH = "both"  # native where the format carries it, classic everywhere
    NATIVE = "native"  # native alone; a minimal classic form (+Inf, _count, _sum) in the text formats
    CLASSIC = "classic"  # classic alone, for stores that take no native histograms

    def __str__(self) -> str:
        return self.value


HISTOGRAM_MODES = tuple(m.value for m in HistogramMode)
ENV_PREFIX = "ROUTESCOPE_TELEMETRY_"
GATES = ("gfx942_min_rows", "gfx950_min_rows")
DEFAULT_COUNTERFACTUALS = ("gfx942_1024", "no_row_gate")
GRAPH_CLOCKS = ("bracket", "events")  # the clocks for graph replays of kernels that write no stamps
MAX_FRAME_NS = 100_000  # a frame is about a microsecond; anything near this is a unit mistake


@dataclass(frozen=True)
class TelemetryConfig:
    """What to record and where to export it; every field has a cheap, safe default."""

    models: tuple[str, ...] = ()  # bounded model label set; others are "other", None is "unknown"
    rank: str = "0"  # tensor-parallel rank label
    multiproc_dir: str | None = None  # prometheus multiprocess directory (PROMETHEUS_MULTIPROC_DIR)
    process_id: str | None = None  # multiprocess file id; None: the pid (dead pids are compacted)
    counterfactuals: tuple[str | Policy, ...] = DEFAULT_COUNTERFACTUALS
    counterfactual_arch: str | None = None  # counterfactuals on what_if(arch, aiter=True); None: the real platform
    timing: str = "auto"  # a TimingMode value
    sample_first: int = 32  # calls timed first per slot (kernel x rows bucket x model x class)
    sample_every: int = 128  # then one call in this many
    device_frame_ns: int = MEASURED_FRAME  # added to stamped spans (telemetry.clocks.frame); -1: measured for the model
    timing_pool: int = 256  # preallocated CUDA event pairs (for kernels that write no device stamps)
    timing_gate: bool = True  # gate the stream of a sampled call timed by events, so the pair times the GPU only
    gate_max_polls: int = 512  # the gate's wait gives up after this many reads of its word (~2 ms on an H200)
    gated_frame_ns: int = MEASURED_FRAME  # taken off a gated pair's reading; -1: measured for the GPU model
    graph_frame_ns: int = MEASURED_FRAME  # taken off a graph-captured pair's reading; -1: measured for the model
    graph_timing_pool: int = 1024  # brackets or event pairs captured calls may hold (one in sample_every is timed)
    graph_clock: str = "bracket"  # replays of kernels without stamps: bracket (stamp kernels), events (CUDA only)
    sample_buffer: int = 65536  # sampled latencies kept for OpenTelemetry (or drain_samples) between flushes
    keep_samples: bool = False  # keep raw sampled latencies for Telemetry.drain_samples() (benchmarks)
    decisions_maxlen: int = 256  # recent sampled decisions kept for snapshot()
    max_slots: int = 4096  # distinct (decision, rows bucket, model) combinations
    max_decisions: int = 1024  # distinct decision objects tracked by identity
    otel: bool = False  # OpenTelemetry metrics (in-process MeterProvider)
    otel_span_every: int = 0  # a span for one sampled call in N (0: no spans)
    otlp: bool = False  # add OTLP exporters (configured by the standard OTEL_* variables)
    flush_interval_s: float = 1.0  # bounds what a kill -9 loses: the calls since the last flush
    compact_interval_s: float = 60.0  # how often a flush looks for dead processes' files
    flush_on_exit: bool = True  # flush at interpreter exit and on SIGTERM (main-thread handler, chained)
    log_first_decode_in_prefill: bool = True
    absent_gates: tuple[str, ...] = ()  # gates the observed router lacks (vLLM without a gfx942 branch): not exported
    histogram_mode: str = "both"  # a HistogramMode value: the latency histogram forms /metrics serves

    def __post_init__(self) -> None:
        if self.timing not in TIMING_MODES:
            raise ValueError(f"timing must be one of {', '.join(TIMING_MODES)}; got {self.timing!r}")
        object.__setattr__(self, "timing", TimingMode(self.timing))
        if str(self.histogram_mode) not in HISTOGRAM_MODES:
            raise ValueError(f"histogram_mode must be one of {', '.join(HISTOGRAM_MODES)}; got {self.histogram_mode!r}")
        object.__setattr__(self, "histogram_mode", HistogramMode(str(self.histogram_mode)))
        for name in ("sample_first", "timing_pool", "sample_buffer", "decisions_maxlen", "otel_span_every",
                     "graph_timing_pool"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0; got {getattr(self, name)}")
        for name in ("device_frame_ns", "gated_frame_ns", "graph_frame_ns"):
            value = getattr(self, name)
            if not MEASURED_FRAME <= value <= MAX_FRAME_NS:
                raise ValueError(f"{name} must be -1 (the GPU model's measured value) or 0-{MAX_FRAME_NS} ns; "
                                 f"got {value}")
        if self.graph_clock not in GRAPH_CLOCKS:
            raise ValueError(f"graph_clock must be one of {', '.join(GRAPH_CLOCKS)}; got {self.graph_clock!r}")
        if self.gate_max_polls < 1:
            raise ValueError(f"gate_max_polls must be >= 1; got {self.gate_max_polls}")
        for name in ("sample_every", "max_slots", "max_decisions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}")
        object.__setattr__(self, "models", tuple(str(m) for m in self.models))
        object.__setattr__(self, "absent_gates", tuple(str(g) for g in self.absent_gates))
        bad_gates = [g for g in self.absent_gates if g not in GATES]
        if bad_gates:
            raise ValueError(f"absent_gates are among {', '.join(GATES)}; got {bad_gates}")
        object.__setattr__(self, "rank", str(self.rank))
        bad = [m for m in self.models if m in ("other", "unknown")]
        if bad:
            raise ValueError(f"model names 'other' and 'unknown' are reserved; got {bad}")
        if self.counterfactual_arch is not None:
            arch = str(self.counterfactual_arch).strip().lower()
            if arch not in KNOWN_ARCHS:
                raise ValueError(f"counterfactual_arch must be one of {', '.join(KNOWN_ARCHS)} (or None: the real "
                                 f"platform); got {self.counterfactual_arch!r}")
            object.__setattr__(self, "counterfactual_arch", arch)

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, defaults: Mapping[str, Any] | None = None, **overrides: Any
    ) -> TelemetryConfig:
        """ROUTESCOPE_TELEMETRY_<FIELD> and PROMETHEUS_MULTIPROC_DIR; OTLP on when an OTEL endpoint is set.

        Precedence: ``overrides`` > the environment > ``defaults`` (a caller's defaults the user may still override)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is None or raw.strip() == "":
                continue
            values[f.name] = _parse(f.name, raw.strip())
        if "multiproc_dir" not in values and env.get("PROMETHEUS_MULTIPROC_DIR"):
            values["multiproc_dir"] = env["PROMETHEUS_MULTIPROC_DIR"]
        if "otlp" not in values and (env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")):
            values["otlp"] = True
            values.setdefault("otel", True)
        values = {**{k: v for k, v in (defaults or {}).items() if v is not None}, **values}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def with_(self, **changes: Any) -> TelemetryConfig:
        return replace(self, **changes)


def _parse(name: str, raw: str) -> Any:
    if name in ("models", "counterfactuals", "absent_gates"):
        return tuple(p.strip() for p in raw.split(",") if p.strip())
    if name in ("otel", "otlp", "log_first_decode_in_prefill", "keep_samples", "flush_on_exit", "timing_gate"):
        return raw.lower() in ("1", "true", "yes", "on")
    if name in ("flush_interval_s", "compact_interval_s"):
        return float(raw)
    if name == "counterfactual_arch":
        return None if raw.lower() == "none" else raw  # "none": the real platform, over a caller's default
    if name in ("rank", "multiproc_dir", "process_id", "timing", "graph_clock"):
        return raw
    if name == "histogram_mode":
        return raw.lower()
    return int(raw)


_GATE = re.compile(r"^(gfx942|gfx950)_(\d+)$")


def counterfactual_policy(spec: str | Policy, active: Policy) -> Policy:
    """``gfx942_1024``, ``gfx950_2048``, ``no_row_gate`` (gfx942 gate at 0: the seed before its fix),
    or ``name:gfx942=768,gfx950=2048``; guard and spec tokens follow the active policy."""
    if isinstance(spec, Policy):
        return spec
    base = dict(gfx942_min_rows=active.gfx942_min_rows, gfx950_min_rows=active.gfx950_min_rows,
                guard=active.guard, spec_tokens=active.spec_tokens)
    spec = spec.strip()
    if spec == "no_row_gate":
        return Policy(**{**base, "gfx942_min_rows": 0}, name=spec)
    m = _GATE.match(spec)
    if m:
        return Policy(**{**base, f"{m.group(1)}_min_rows": int(m.group(2))}, name=spec)
    name, sep, rest = spec.partition(":")
    if sep and name:
        for part in rest.split(","):
            key, eq, value = part.partition("=")
            key = key.strip()
            if not eq or key not in ("gfx942", "gfx950") or not value.strip().isdigit():
                raise ValueError(f"counterfactual {spec!r}: expected name:gfx942=N,gfx950=M")
            base[f"{key}_min_rows"] = int(value)
        return Policy(**base, name=name.strip())
    raise ValueError(f"unknown counterfactual policy {spec!r} (gfx942_<N>, gfx950_<N>, no_row_gate, name:gfx942=N)")
