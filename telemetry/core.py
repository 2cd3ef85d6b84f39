"""Telemetry: builds the aggregates, the probe and the exporters, and runs the flush that connects them."""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from dispatcher.platform import Platform, detect, what_if
from dispatcher.policy import Policy, PolicySettings

from . import exithooks
from .aggregates import STAGE, Aggregates
from .config import TelemetryConfig, TimingMode, counterfactual_policy
from .clocks.graphs import graph_hooks
from .multiproc.compact import LOCK_TIMEOUT_S, compact
from .multiproc.directory import ident_for, ident_pid
from .multiproc.health import Problems, os_problem
from .multiproc.merge import totals_from_families
from .multiproc.reader import ReaderCache, multiprocess_registry
from .multiproc.writer import MultiprocWriter
from .probe import TelemetryProbe, build_probe
from .prom import TelemetryCollector, make_registry
from .snapshot import build_snapshot, empty_snapshot
from .spec import STAGES
from .clocks.stamps import DeviceStamps
from .clocks.bracket import GraphBrackets
from .clocks.events import GpuEvents, GraphEvents, graph_events_supported
from .clocks.frame import constants_in_use
from .clocks.gate import GateFactory
from .clocks.timing import LatencySink, capture_check
from .view import Totals, build_totals

log = logging.getLogger("routescope.telemetry")


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("routescope")
    except Exception:  # noqa: BLE001
        return "0+unknown"


def compaction_due(last: float | None, now: float, interval: float) -> bool:
    """Is a compaction due at ``now``? (``last`` None: none yet, so at the first flush.)"""
    return last is None or now - last >= interval


def lock_stuck(busy_in_a_row: int, stuck_after: int = 10) -> bool:
    """Has the directory lock been held at so many compactions in a row that it is worth reporting?"""
    return busy_in_a_row >= stuck_after


class Telemetry:
    """Everything telemetry for one process: ``instrument`` a dispatcher, scrape ``registry``, ``close`` at exit."""

    def __init__(
        self,
        config: TelemetryConfig | None = None,
        *,
        platform: Platform | None = None,
        policy: Policy | None = None,
        otel_readers: Sequence[Any] = (),
        tracer_provider: Any | None = None,
        torch_module: Any | None = None,
        gate_launcher: Any | None = None,
        stamp_launcher: Any | None = None,
        bracket_host_ns: Any | None = None,
    ) -> None:
        if torch_module is None:
            import torch as torch_module  # the real one; tests pass a stand-in to drive the GPU branch on CPU
        self._gate_launcher = gate_launcher  # None: the Triton wait (telemetry.clocks.gate); tests pass a double
        self._stamp_launcher = stamp_launcher  # None: the Triton stamp (telemetry.clocks.bracket); tests pass a double
        self._bracket_host_ns = bracket_host_ns  # None: time.monotonic_ns, the bracket's tick-rate check's reference

        self.config = cfg = config if config is not None else TelemetryConfig()
        self._torch = torch = torch_module
        self._cuda = bool(torch.cuda.is_available())
        self._flush_lock = threading.Lock()
        self._dispatchers: list[weakref.ref] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._bg_flush_ts: float | None = None
        self._closed = False
        self._totals = Totals()
        self._wall_offset_ns = time.time_ns() - time.perf_counter_ns()
        self._otel_on = bool(cfg.otel or cfg.otlp or otel_readers)
        self._build(platform if platform is not None else detect(), policy if policy is not None else PolicySettings().policy())
        self._collector = TelemetryCollector(self.flush, cfg.rank, self.count_error)
        self.registry: CollectorRegistry = make_registry(self._collector)
        self._writer: MultiprocWriter | None = None
        self._mp_path: str | None = None
        self._problems = Problems(self.count_error)
        self._reader_cache = ReaderCache()  # file layouts and the merge plan, kept between scrapes
        self._last_compact: float | None = None  # None: due at the first flush, never in this constructor
        self._compact_busy = 0  # compactions skipped in a row: another process held the lock
        if cfg.multiproc_dir:
            self._open_multiprocess(cfg.multiproc_dir)
        if cfg.flush_on_exit:
            exithooks.register(self)
        self._otel = None
        if self._otel_on:
            try:
                from .otel import OtelExporter

                self._otel = OtelExporter(
                    totals=lambda: self._totals, rank=cfg.rank, readers=otel_readers, otlp=cfg.otlp,
                    tracer_provider=tracer_provider, span_every=cfg.otel_span_every, on_error=self.count_error,
                )
            except Exception:  # noqa: BLE001
                log.exception("routescope telemetry: OpenTelemetry setup failed")
                self.count_error("otel")

    # -- wiring ---------------------------------------------------------------------------------
    def _build(self, platform: Platform, policy: Policy) -> None:
        """(Re)build aggregates and probe for a platform and active policy."""
        cfg = self.config
        self.platform, self.policy = platform, policy
        self.counterfactuals: tuple[Policy, ...] = tuple(counterfactual_policy(c, policy) for c in cfg.counterfactuals)
        arch = cfg.counterfactual_arch
        self.counterfactual_platform: Platform = what_if(arch, aiter=True) if arch else platform
        self._agg = Aggregates(
            platform=platform, policy=policy, counterfactuals=self.counterfactuals,
            counterfactual_platform=self.counterfactual_platform, models=cfg.models,
            max_slots=cfg.max_slots, max_decisions=cfg.max_decisions, log_first_dip=cfg.log_first_decode_in_prefill,
        )
        mode = TimingMode(cfg.timing)
        if mode is TimingMode.AUTO:
            mode = TimingMode.GPU if self._cuda else TimingMode.HOST
        if mode is TimingMode.GPU and not self._cuda:
            mode = TimingMode.HOST
        self.timing = mode
        gpu = mode is TimingMode.GPU
        health = self._agg.health
        gates = GateFactory(self._torch, cfg.timing_pool, max_polls=cfg.gate_max_polls,
                            launcher=self._gate_launcher) if gpu and cfg.timing_gate else None
        self._events = GpuEvents(self._torch, cfg.timing_pool, gates=gates, gated_frame_ns=cfg.gated_frame_ns) \
            if gpu else None
        self._graph_events = GraphEvents(self._torch, cfg.graph_timing_pool, frame_ns=cfg.graph_frame_ns) \
            if gpu and cfg.graph_timing_pool and graph_events_supported(self._torch) else None
        self._brackets = GraphBrackets(self._torch, health, cfg.graph_timing_pool, launcher=self._stamp_launcher,
                                       **({"host_ns": self._bracket_host_ns, "rate_interval_ns": 0}
                                          if self._bracket_host_ns is not None else {})) \
            if gpu and cfg.graph_timing_pool and cfg.graph_clock == "bracket" else None
        self._stamps = DeviceStamps(self._torch, health, frame=cfg.device_frame_ns) if gpu else None
        self._graphs = graph_hooks(self._torch) if self._cuda else None
        stop = getattr(self, "_stop_before_capture", None)
        if stop is not None:  # a rebuild (instrument adopting a dispatcher's platform): the old bracket stands down
            stop()
        self._stop_before_capture = self._graphs.call_before_capture(self._brackets.before_capture) \
            if self._graphs is not None and self._brackets is not None else None
        self._decisions: deque | None = deque(maxlen=cfg.decisions_maxlen) if cfg.decisions_maxlen else None
        self._samples: deque | None = deque() if (self._otel_on or cfg.keep_samples) else None
        self._kept: deque = deque(maxlen=cfg.sample_buffer or None)
        self._sink = LatencySink(self._agg.counters, health, self._samples, cfg.sample_buffer)
        self._probe = build_probe(
            self._agg, timing=mode.value, sink=self._sink, events=self._events, graph_events=self._graph_events,
            brackets=self._brackets, stamps=self._stamps,
            graphs=self._graphs, capturing=capture_check(self._torch) if self._cuda else None,
            sample_first=cfg.sample_first, sample_every=cfg.sample_every, decisions=self._decisions,
            wall_offset_ns=self._wall_offset_ns,
        )
        self._build_info = (_version(), platform.arch, platform.vendor,
                            "true" if platform.aiter_enabled else "false", mode.value)

    @property
    def probe(self) -> TelemetryProbe:
        return self._probe

    def instrument(self, dispatcher: Any) -> Any:
        """Set this telemetry's probe on ``dispatcher``; adopts its platform and policy if nothing was recorded yet."""
        if (dispatcher.platform, dispatcher.policy) != (self.platform, self.policy):
            if self._agg.n_slots == 0:
                health = self._agg.health
                self._build(dispatcher.platform, dispatcher.policy)
                self._agg.health.errors[:], self._agg.health.dropped[:] = health.errors, health.dropped
                for ref in self._dispatchers:
                    d = ref()
                    if d is not None:
                        d.set_probe(self._probe)
            else:
                log.warning("routescope telemetry: dispatcher policy %s differs from telemetry's %s; buckets "
                            "and counterfactuals follow telemetry's", dispatcher.policy, self.policy)
        dispatcher.set_probe(self._probe)
        self._dispatchers.append(weakref.ref(dispatcher))
        return dispatcher

    def record_decode_path(self, rows: int, model: str | None = None) -> None:
        """Count one call of the decode entry, so decode-in-prefill reads as a share of all decode calls."""
        self._probe.record_decode_path(rows, model)

    def count_error(self, stage: str) -> None:
        """Count one caught exception in routescope_telemetry_errors_total{stage}; for code that wraps telemetry.

        ``stage`` is one of ``telemetry.spec.STAGES``; any other is a programming error (ValueError),
        so a typo fails at the first call instead of inventing a label. Otherwise never raises."""
        i = STAGE.get(stage)
        if i is None:
            raise ValueError(f"unknown telemetry error stage {stage!r}; one of {', '.join(STAGES)}")
        self._agg.health.errors[i] += 1

    @property
    def probe_failures(self) -> int:
        return sum(getattr(r(), "probe_failures", 0) for r in self._dispatchers if r() is not None)

    # -- flush ----------------------------------------------------------------------------------
    def flush(self) -> Totals:
        """Resolve finished timing (stamps, events), rebuild the totals, feed the exporters; never raises."""
        with self._flush_lock:
            return self._flush_locked(None)

    def _flush_locked(self, exit_wait: float | None) -> Totals:
        """The flush, its lock held. ``exit_wait``: a signal handler's flush (see ``_flush_for_exit``)."""
        agg = self._agg
        self._resolve_timing(exit_wait)
        try:
            totals = build_totals(agg, arch=self.platform.arch, policies=self.counterfactuals,
                                  build_info=self._build_info, cf_arch=self.counterfactual_platform.arch,
                                  absent_gates=self.config.absent_gates, clock_constants=constants_in_use(
                                      self._stamps, self._events, self._graph_events, self._brackets))
        except Exception:  # noqa: BLE001
            self.count_error("flush")
            self._totals.telemetry_errors = {(s,): agg.health.errors[i] for i, s in enumerate(STAGES)}
            return self._totals
        self._totals = totals
        if self._writer is not None:
            self._export_multiprocess(totals, may_compact=exit_wait is None)
        if exit_wait is None:  # the samples wait for the next flush (at exit: atexit's)
            self._feed_samples()
        totals.telemetry_errors = {(s,): agg.health.errors[i] for i, s in enumerate(STAGES)}
        return totals

    def _feed_samples(self) -> None:
        if self._samples is not None and self.config.keep_samples:
            self._kept.extend(self._samples)  # bounded: oldest fall off
        if self._otel is not None and self._samples is not None:
            try:
                self._otel.feed(self._samples, self._agg.info)
            except Exception:  # noqa: BLE001
                self.count_error("otel")
        elif self._samples is not None:
            self._samples.clear()

    def _resolve_timing(self, exit_wait: float | None = None) -> None:
        """Stamps are plain host reads; events need CUDA calls, so they wait while a graph is being captured.

        ``exit_wait`` (a signal handler's flush, which may have interrupted the thread holding the
        sink's or the stamps' lock): each is waited for that long at most, else timing is skipped
        this time (counted as ``timing``; the stamps stay pending for a later flush)."""
        if self._stamps is None and self._events is None:
            return
        if exit_wait is not None and not self._sink.lock_free(exit_wait):
            self.count_error("timing")
            return
        if self._stamps is not None:
            try:
                self._stamps.resolve(self._sink, lock_timeout=-1 if exit_wait is None else exit_wait)
            except Exception:  # noqa: BLE001
                self.count_error("timing")
        capturing = self._graphs is not None and self._graphs.depth[0]
        if self._events is not None and not capturing:
            try:
                self._events.resolve(self._sink, self._agg.health)
                if self._graph_events is not None:
                    self._graph_events.resolve(self._sink, self._agg.health, time.time_ns())
            except Exception:  # noqa: BLE001
                self.count_error("timing")
        if self._brackets is not None:  # plain host reads; building and calibrating waits for no capture
            try:
                if exit_wait is None and not capturing and self._brackets.pending:
                    self._brackets.prepare()
                    self._brackets.calibrate()
                self._brackets.resolve(self._sink, time.time_ns())
            except Exception:  # noqa: BLE001
                self.count_error("timing")
        if self._events is not None and not capturing:
            if exit_wait is None:
                try:  # compiles the gate's wait kernel the first time: here, never in a sampled call
                    self._events.prepare()
                except Exception:  # noqa: BLE001
                    self.count_error("timing")

    def _export_multiprocess(self, totals: Totals, *, may_compact: bool = True) -> None:
        """Write this process's files, then compact when due, never waiting for the directory lock."""
        try:
            self._writer.write(totals, self.config.rank)  # type: ignore[union-attr]  # reports its own failures
        except Exception:  # noqa: BLE001
            self.count_error("write")
        now = time.monotonic()
        if may_compact and compaction_due(self._last_compact, now, self.config.compact_interval_s):
            self._last_compact = now
            self._compact(lock_timeout=0)

    # -- multiprocess directory: writer, compaction and reading apart, so one failing never stops another --
    def _open_multiprocess(self, path: str) -> None:
        """The writer (it reports, never raises, when the directory cannot be written); the first flush compacts.

        Not here: a vLLM worker builds its Telemetry inside its first attention call."""
        self._mp_path = path
        try:
            self._writer = MultiprocWriter(path, ident_for(self.config.process_id), self._problems)
        except Exception as exc:  # noqa: BLE001 - a bad process_id: no files of ours, the rest still works
            self._problems.report("write", path, exc.__class__.__name__, str(exc), blocking=True)

    def _compact(self, dead_idents: tuple[str, ...] = (), *, lock_timeout: float = LOCK_TIMEOUT_S) -> None:
        """One compaction; skipped (logged at debug, counted in ``_compact_busy``) while another process holds the
        lock: that one is compacting. Skipped ``stuck_after`` times in a row, the lock is reported as stuck."""
        path: str = self._mp_path  # type: ignore[assignment]
        try:
            done = compact(path, dead_idents=dead_idents, problems=self._problems, lock_timeout=lock_timeout)
        except Exception as exc:  # noqa: BLE001 - retried at the next interval; files stay until then
            self._problems.report("compact", path, os_problem(exc), str(exc))
            return
        if done is not None:
            self._compact_busy = 0
            self._problems.clear("compact", path)
            return
        self._compact_busy += 1
        log.debug("routescope telemetry: compaction skipped, another process holds the lock of %s (%d in a row)",
                  path, self._compact_busy)
        if lock_stuck(self._compact_busy):
            self._problems.report("compact", path, "lock held", f"another process has held the lock of {path} at "
                                  f"each of the last {self._compact_busy} compactions; dead files stay (still read)")

    def _mp_registry(self) -> CollectorRegistry | None:
        """Every process's files; None (this process's series only, the problem reported) if the directory is gone."""
        path = self._mp_path
        if not os.path.isdir(path):  # type: ignore[arg-type]
            self._problems.report("read", path, "missing", f"multiprocess directory {path} is gone",  # type: ignore[arg-type]
                                  blocking=True)
            return None
        return multiprocess_registry(path, self._problems, self._reader_cache)  # type: ignore[arg-type]

    def health_problems(self, *, check: bool = False) -> list[dict[str, Any]]:
        """Multiprocess directory problems: active conditions (``blocking`` ones make /readyz 503), then quarantined
        files. ``check`` lists the directory first, so a reader learns now that it cannot read it."""
        if check and self._mp_path is not None:
            try:
                os.listdir(self._mp_path)
                self._problems.clear("read", self._mp_path)
            except OSError as exc:
                self._problems.report("read", self._mp_path, os_problem(exc), f"cannot list {self._mp_path}: {exc}",
                                      blocking=True)
        return self._problems.conditions() + self._problems.files()

    def _flush_for_exit(self, wait_s: float = 0.1) -> None:
        """SIGTERM: one flush that cannot hang, though the handler runs in the thread it interrupted.

        That thread may hold a lock the flush takes, and would wait for itself. So the flush lock is
        waited for 1 s, any other lock ``wait_s``; a part whose lock stays held is skipped and
        counted (timing as ``timing``, the directory's bookkeeping as ``flush``; the files are still
        written). No compaction and no OpenTelemetry feed (I/O, other libraries' locks): the next
        process compacts, and the flush at exit feeds the samples left, if the process exits."""
        if self._closed:
            return
        if not self._flush_lock.acquire(timeout=1.0):
            self.count_error("flush")
            return
        try:
            with self._problems.bounded(wait_s):
                self._flush_locked(wait_s)
        finally:
            self._flush_lock.release()

    def drain_samples(self) -> list[dict[str, Any]]:
        """Raw sampled latencies since the last drain, in resolution order (needs ``keep_samples``); flushes first."""
        self.flush()
        info = self._agg.info
        out = []
        while self._kept:
            s, clock, dt_ns, wall_ns = self._kept.popleft()
            inf = info[s]
            out.append({"kernel": inf.kernel, "rows_bucket": inf.bucket, "model": inf.model,
                        "call_class": inf.call_class, "clock": clock.value, "seconds": dt_ns / 1e9,
                        "ts": wall_ns / 1e9})
        return out

    @property
    def totals(self) -> Totals:
        """The last flush's totals (no flush)."""
        return self._totals

    def collect_registry(self) -> CollectorRegistry:
        """What /metrics should serve: every process's files in multiprocess mode, else ``registry``."""
        if self._mp_path is None:
            return self.registry
        self.flush()
        try:
            return self._mp_registry() or self.registry
        except Exception:  # noqa: BLE001
            self.count_error("export")
            return self.registry

    def snapshot(self, *, flush: bool = True, all_processes: bool = True) -> dict:
        """JSON-ready view for /routing (see docs/telemetry.md for the keys).

        In multiprocess mode (and unless ``all_processes`` is False) the series are every
        process's, read back from the directory after this process's flush; decisions, first
        occurrences and health stay this process's (``scope`` says which is which).
        """
        try:
            own = self.flush() if flush else self._totals
            merged = None
            if self._mp_path is not None and all_processes:
                try:
                    reg = self._mp_registry()
                    merged = totals_from_families(reg.collect()) if reg is not None else None
                except Exception:  # noqa: BLE001 - this process's series, and the error counted
                    self.count_error("export")
            return build_snapshot(self, own, merged=merged)
        except Exception:  # noqa: BLE001 - /routing and /readyz always get an answer
            self.count_error("export")
            return empty_snapshot(self)

    # -- what a snapshot reads (snapshot.Source) ------------------------------------------------
    @property
    def aggregates(self) -> Aggregates:
        return self._agg

    @property
    def recent_decisions(self) -> deque | None:
        return self._decisions

    @property
    def wall_offset_ns(self) -> int:
        return self._wall_offset_ns

    @property
    def gated_frame_ns(self) -> int:
        """The constant taken off gated pairs on the current CUDA device (0 without event timing)."""
        if self._events is None:
            return 0
        return self._events.frame(self._torch.device("cuda", self._torch.cuda.current_device()))

    @property
    def bracket_constants(self) -> dict[str, int]:
        """The bracket clock's calibrated constant (ns) per device; {} until a device is calibrated."""
        return self._brackets.constants() if self._brackets is not None else {}

    @property
    def device_frames(self) -> dict[str, int]:
        """The kernel frame (ns, ``telemetry.clocks.frame``) added to each stamped device's spans; {} if none."""
        return self._stamps.frames() if self._stamps is not None else {}

    @property
    def last_background_flush(self) -> float | None:
        return self._bg_flush_ts

    @property
    def multiprocess_dir(self) -> str | None:
        return self._mp_path

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, flush_interval_s: float | None = None) -> Telemetry:
        """Start the background flush thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return self
        interval = flush_interval_s if flush_interval_s is not None else self.config.flush_interval_s
        if interval <= 0:
            raise ValueError(f"flush_interval_s must be > 0; got {interval}")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, args=(interval,), name="routescope-telemetry-flush",
                                        daemon=True)
        self._thread.start()
        return self

    def _loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.flush()
                self._bg_flush_ts = time.time()
            except Exception:  # noqa: BLE001
                self.count_error("flush")

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        """Stop the thread, flush once more, release files (a pid's files go to the archive); idempotent."""
        if self._closed:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.flush()
        self._closed = True
        if self._stop_before_capture is not None:
            self._stop_before_capture()
        exithooks.unregister(self)
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
            if ident_pid(writer.ident) is not None:
                self._compact((writer.ident,))
        if self._otel is not None:
            try:
                self._otel.shutdown()
            except Exception:  # noqa: BLE001
                self.count_error("otel")

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
