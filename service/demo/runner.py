"""Runs the demo traffic through the real dispatcher and kernels on a background thread, paced.

Everything decided about the traffic lives in ``workloads.traffic``; this module only turns call
specs into tensors, launches them, counts what it did, and sleeps so the machine stays usable.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

import torch

from dispatcher import DecodeInPrefillError, Dispatcher, Kernel
from dispatcher.kernels.common import KernelArgs, SparseIndex

from workloads.scale import ScaledShape, scaled
from workloads.traffic import DEFAULT_SCENARIOS, DEMO_MODELS, CallSpec, ModelSpec, Scenario, traffic, warm_up_calls

log = logging.getLogger("routescope.demo")

DecodePathHook = Callable[[str, int], None]


class DemoState(str, Enum):
    """The demo loop's life; /routing shows the value, /readyz is ready in ``READY``."""

    NOT_STARTED = "not started"
    WARMING_UP = "warming up"
    RUNNING = "running"
    FINISHED = "finished"  # its call limit reached
    STOPPED = "stopped"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


READY = frozenset({DemoState.RUNNING, DemoState.FINISHED})


@dataclass(slots=True)
class DemoCounts:
    """What the demo itself did; /routing shows it beside telemetry's view so losses would show."""

    prefill_calls: int = 0  # prefill-entry calls that returned (telemetry should count each once)
    prefill_rows: int = 0
    decode_path_calls: int = 0
    decode_path_rows: int = 0
    refused: int = 0  # guard mode "raise" refused a pure-decode batch
    errors: int = 0
    last_error: str | None = None
    by_kind: dict[str, int] = field(default_factory=dict)  # prefill / mixed / pure_decode at the prefill entry
    warm_up_calls: int = 0  # calls made before the traffic, unseen by telemetry (warm_up)
    warm_up_failed: int = 0
    warm_up_s: float | None = None  # how long the warm-up took; None: none ran (yet)


class _Buffers:
    """Preallocated operands for one model; every call launches on leading slices of them."""

    def __init__(self, shape: ScaledShape, max_rows: int, device: str, dtype: torch.dtype, gen: torch.Generator) -> None:
        h, d, nope = shape.heads, shape.head_dim, shape.nope_head_dim
        self.shape = shape
        self.q = torch.randn(max_rows, h, d, generator=gen).to(device=device, dtype=dtype)
        self.kv = torch.randn(shape.kv_pool, 1, d, generator=gen).to(device=device, dtype=dtype)
        self.indices = torch.randint(0, shape.kv_pool, (max_rows, shape.topk), generator=gen, dtype=torch.int32).to(device)
        self.output = torch.empty(max_rows, h, nope, device=device, dtype=dtype)
        self.scale = d**-0.5

    def args(self, rows: int) -> KernelArgs:
        return KernelArgs(
            self.q[:rows], self.kv, SparseIndex(self.indices[:rows], None), self.scale, None, self.output[:rows]
        )


def pick_device() -> str:
    """The accelerator when torch sees one (CUDA or ROCm), else the CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def describe_scenario(sc: Scenario) -> str:
    return (
        f"{sc.prompts} prompts of {sc.prompt_tokens} tokens (±{sc.jitter:.0%}), {sc.output_tokens} out, "
        f"concurrency {sc.concurrency}, chunk budget {sc.token_budget}"
    )


class DemoRunner:
    """Drives ``dispatcher`` with :func:`traffic` until stopped; thread-safe reads of its counters."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        seed: int = 7,
        glm_bug: bool = False,
        duty: float = 0.25,
        full_scale: bool | None = None,
        device: str | None = None,
        models: Sequence[ModelSpec] = DEMO_MODELS,
        scenarios: Sequence[Scenario] = DEFAULT_SCENARIOS,
        on_decode_path: DecodePathHook | None = None,
        min_gap_s: float = 0.002,
        torch_threads: int | None = 1,
        limit: int | None = None,
        warm_up: bool | None = None,
        warm_up_sample: int = 10_000,
    ) -> None:
        if not 0.0 < duty <= 1.0:
            raise ValueError(f"duty must be in (0, 1]; got {duty}")
        if warm_up_sample < 0:
            raise ValueError(f"warm_up_sample must be >= 0; got {warm_up_sample}")
        self.dispatcher = dispatcher
        self.seed = seed
        self.glm_bug = glm_bug
        self.duty = duty
        self.device = device or pick_device()
        full = self.device != "cpu" if full_scale is None else full_scale
        self.shapes = {m.name: scaled(m, full=full) for m in models}
        self.models = tuple(models)
        self.scenarios = tuple(scenarios)
        self.on_decode_path = on_decode_path
        self.min_gap_s = min_gap_s
        self.torch_threads = torch_threads
        self.limit = limit
        # Kernels that compile at first use (Triton, Gluon) would put their compile into the first call of each
        # variant, and into telemetry's latency histograms: on a GPU the demo makes those calls first, unseen.
        self.warm_up = self.device != "cpu" if warm_up is None else warm_up
        self.warm_up_sample = warm_up_sample
        self._warming = False
        self.counts = DemoCounts()
        self.scenario_now: dict[str, int] = {}
        self.started_at: float | None = None
        self._stop = threading.Event()
        self._done = threading.Event()
        self._failed = False
        self._thread: threading.Thread | None = None
        self._buffers: dict[str, _Buffers] = {}

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        if self.device == "cpu" and self.torch_threads:
            torch.set_num_threads(self.torch_threads)  # leave the other core to the HTTP server
        self._thread = threading.Thread(target=self._run, name="routescope-demo", daemon=True)
        self._warming = self.warm_up  # from the start: the buffers are made before the warm-up's calls
        self.started_at = time.time()
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> bool:
        """Ask the loop to end after the call in flight; True when the thread has ended."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def state(self) -> DemoState:
        """Where the demo's loop is (``DemoState``)."""
        if self._thread is None:
            return DemoState.NOT_STARTED
        if self._thread.is_alive():
            return DemoState.WARMING_UP if self._warming else DemoState.RUNNING
        if self._failed:
            return DemoState.FAILED
        return DemoState.STOPPED if self._stop.is_set() else DemoState.FINISHED

    def wait_done(self, timeout: float | None = None) -> bool:
        """Wait for the loop to end (``limit`` reached or stopped)."""
        return self._done.wait(timeout)

    # -- the loop --------------------------------------------------------------------------
    def _prepare(self) -> None:
        gen = torch.Generator().manual_seed(self.seed)
        max_rows = max(sc.token_budget + sc.concurrency for sc in self.scenarios)
        dtype = torch.bfloat16
        for name, shape in self.shapes.items():
            self._buffers[name] = _Buffers(shape, max_rows, self.device, dtype, gen)
        self._decode = self.dispatcher.registry.resolve(Kernel.INTREE_SPARSE_DECODE, self.device)

    def _run(self) -> None:
        try:
            self._prepare()
            if self.warm_up:
                self._warm_up()
            calls = traffic(self.seed, models=self.models, scenarios=self.scenarios, glm_bug=self.glm_bug)
            if self.limit is not None:
                calls = itertools.islice(calls, self.limit)
            sync = torch.cuda.synchronize if self.device != "cpu" else None
            for spec in calls:
                if self._stop.is_set():
                    break
                t0 = time.perf_counter()
                self.launch(spec)
                if sync is not None:
                    sync()  # GPU launches return at once: pace on the work done, not the work queued
                busy = time.perf_counter() - t0
                pause = max(self.min_gap_s, busy * (1.0 - self.duty) / self.duty)
                if self._stop.wait(pause):
                    break
        except Exception as exc:  # noqa: BLE001 - the demo must never take the server down
            self._failed = True
            self.counts.errors += 1
            self.counts.last_error = f"demo stopped: {exc.__class__.__name__}: {exc}"
            log.exception("demo workload stopped")
        finally:
            self._done.set()

    def _warm_up(self) -> None:
        """Launch one call of each class the traffic will make (``warm_up_calls``), so that kernels compile now.

        Prefill-entry calls go through a dispatcher with no probe (same platform, policy and registry),
        so telemetry sees none of them; decode-entry calls skip the decode-path hook. Nothing here
        stops the demo: a failing call is counted in ``warm_up_failed`` and logged once.
        """
        t0 = time.perf_counter()
        c = self.counts
        try:
            d = self.dispatcher
            quiet = Dispatcher(platform=d.platform, policy=d.policy, registry=d.registry)
            sample = itertools.islice(
                traffic(self.seed, models=self.models, scenarios=self.scenarios, glm_bug=self.glm_bug),
                self.warm_up_sample)
            specs = warm_up_calls(sample, max(sc.concurrency for sc in self.scenarios))
            sync = torch.cuda.synchronize if self.device != "cpu" else None
            for spec in specs:
                if self._stop.is_set():
                    break
                try:
                    self._launch(spec, quiet)  # False: refused (guard mode raise), no kernel to compile
                    if sync is not None:
                        sync()
                    c.warm_up_calls += 1
                except Exception as exc:  # noqa: BLE001 - the traffic after it will count and show any real fault
                    c.warm_up_failed += 1
                    if c.warm_up_failed == 1:
                        log.warning("demo warm-up call failed (%s %s, %d rows): %s: %s", spec.model, spec.entry,
                                    spec.rows, exc.__class__.__name__, exc)
            log.info("demo warm-up: %d calls in %.1f s before the traffic", c.warm_up_calls, time.perf_counter() - t0)
        finally:
            c.warm_up_s = time.perf_counter() - t0
            self._warming = False

    def _launch(self, spec: CallSpec, dispatcher: Dispatcher) -> bool:
        """One call through its entry: the decode kernel, or ``dispatcher``. False if the dispatcher refused it."""
        buf = self._buffers[spec.model]
        if spec.entry == "decode":
            self._decode.launch(buf.args(spec.rows))
            return True
        s, a = buf.shape, buf.args(spec.rows)
        try:
            dispatcher(
                a.q, a.kv, a.index.indices, None, a.scale, s.head_dim, s.nope_head_dim, s.rope_head_dim,
                None, a.output, query_lens=list(spec.query_lens), model=spec.model,
            )
        except DecodeInPrefillError:  # guard mode "raise": refused before any kernel ran
            return False
        return True

    def launch(self, spec: CallSpec) -> None:
        """One call, counted: the decode entry (split-K kernel) or the prefill entry (the dispatcher)."""
        c = self.counts
        self.scenario_now[spec.model] = spec.scenario
        rows = spec.rows
        try:
            if not self._launch(spec, self.dispatcher):
                c.refused += 1  # a server would fail this step; the demo moves on
                return
            if spec.entry == "decode":
                c.decode_path_calls += 1
                c.decode_path_rows += rows
                if self.on_decode_path is not None:
                    self.on_decode_path(spec.model, rows)
                return
            c.prefill_calls += 1
            c.prefill_rows += rows
            c.by_kind[spec.kind] = c.by_kind.get(spec.kind, 0) + 1
        except Exception as exc:  # noqa: BLE001 - count, remember, keep going
            c.errors += 1
            c.last_error = f"{exc.__class__.__name__}: {exc}"[:500]
            if c.errors <= 3:
                log.warning("demo call failed: %s", c.last_error)

    # -- what /routing shows ---------------------------------------------------------------
    def info(self) -> dict:
        c = self.counts
        factors = [s.factor for s in self.shapes.values()]
        return {
            "running": self.running,
            "state": self.state.value,
            "limit": self.limit,
            "glm_bug": self.glm_bug,
            "seed": self.seed,
            "device": self.device,
            "duty": self.duty,
            "torch_threads": torch.get_num_threads(),
            "scaled": any(f != 1.0 for f in factors),
            "scale_factor": min(factors) if factors else 1.0,
            "shapes": [
                {
                    "model": s.model,
                    "heads": s.heads,
                    "nope_head_dim": s.nope_head_dim,
                    "rope_head_dim": s.rope_head_dim,
                    "topk": s.topk,
                    "kv_pool": s.kv_pool,
                    "factor": s.factor,
                    "description": s.describe(),
                }
                for s in self.shapes.values()
            ],
            "scenarios": {m: describe_scenario(self.scenarios[i]) for m, i in sorted(dict(self.scenario_now).items())},
            "started_ts": self.started_at,
            "prefill_calls": c.prefill_calls,
            "prefill_rows": c.prefill_rows,
            "decode_path_calls": c.decode_path_calls,
            "decode_path_rows": c.decode_path_rows,
            "refused": c.refused,
            "errors": c.errors,
            "last_error": c.last_error,
            "by_kind": dict(c.by_kind),
            "warm_up": {"calls": c.warm_up_calls, "failed": c.warm_up_failed, "seconds": c.warm_up_s}
            if self.warm_up else None,
        }
