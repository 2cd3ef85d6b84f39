"""Route the prefill-entry calls an experiment assigns to arm B, under the Dispatcher's rules (dispatcher/arms.py).

Outside an experiment the plugin only observes: vLLM's function runs once per call with the arguments
vLLM gave it. While one runs (an ``experiments.control.Registry`` per process, watching the shared
multiprocess directory: :mod:`routescope.vllm.experiment`), arm A is what vLLM does (its original
function) and arm B a kernel launched by :class:`~routescope.vllm.arms.VllmArms`:

- the experiment (the chooser) leaves on A, counted by reason, calls inside a CUDA/HIP graph capture,
  every call while vLLM runs batch-invariant, guard refusals and decode rows bound for a prefill kernel;
  the router adds the calls whose B kernel cannot run in this vLLM/AITER build (``Outcome.UNAVAILABLE``,
  checked before anything is launched);
- a B launch that raises is run again on A, and the call succeeds;
- on a numerics sample A writes the caller's output and B a scratch tensor, and the chooser compares
  (until a cell's first sample passes, every B call of it is one): the caller never gets an output from
  an arm that failed, nor one of B that was not checked;
- the assignment's position is (step, call in step) from vLLM's forward context, the same on every
  tensor-parallel rank (:class:`~routescope.vllm.context.ForwardBatch`);
- the router's and the chooser's own failures are counted and leave the call on A (fail open).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from dispatcher.arms import Arm, ArmChooser, Outcome
from dispatcher.types import Batch, CallShape, Decision

from .arms import ArmUnavailable, PrefillCall, VllmArms

log = logging.getLogger("vllm.routescope")

PARAMS = PrefillCall._fields
BATCH_INVARIANT = "batch_invariant"  # the experiments' never-moved reason (experiments.candidates.NotMoved)


class Route(NamedTuple):
    """An experiment's plan for one call: its chooser and arm, vLLM's arguments by name (B calls), arm A's decision."""

    chooser: ArmChooser
    arm: Arm
    call: PrefillCall | None
    active: Decision
    shape: CallShape
    batch: Batch
    q: Any

    @property
    def shown(self) -> Decision:
        """The decision the probe is told: B's for a call B runs, else A's (a numerics sample's output is A's)."""
        arm = self.arm
        return arm.decision if arm.is_b and not arm.check else self.active


class Router:
    """One process's routing state: the experiment attached now, the arms, and what was never moved."""

    def __init__(self, *, arms: VllmArms, make_registry: Callable[..., Any], batch_invariant: bool = False,
                 flush_interval_s: float = 1.0) -> None:
        self.arms = arms
        self.make_registry = make_registry  # (platform=, policy=, batch_invariant=) -> experiments.control.Registry
        self.batch_invariant = batch_invariant
        self.flush_interval_s = flush_interval_s
        self.registry: Any = None
        self.chooser: ArmChooser | None = None  # the running experiment (set by the registry); None: observe only
        self.unavailable: Counter[str] = Counter()  # B kernel -> calls left on A because it cannot run here
        self.routed: Counter[str] = Counter()  # b, b_checked, b_failed, a_timed
        self.errors: Counter[str] = Counter()
        self._logged: set[str] = set()

    def set_arms(self, chooser: ArmChooser | None) -> None:
        """The registry's hook (as ``Dispatcher.set_arms``): the experiment that runs now, or None."""
        self.chooser = chooser

    def start_process(self, platform: Any, policy: Any) -> None:
        """Once per process (after a fork too): this process's registry, watching the shared directory."""
        old, self.registry, self.chooser = self.registry, None, None
        if old is not None and getattr(old, "_pid", None) == os.getpid():
            old.close()
        registry = self.make_registry(platform=platform, policy=policy, batch_invariant=self.batch_invariant)
        registry._pid = os.getpid()
        registry.attach(self)
        registry.start_flusher(self.flush_interval_s)
        self.registry = registry

    def failed(self, stage: str, exc: BaseException) -> None:
        """Count a failure of the router or the chooser; log the first of each stage."""
        self.errors[stage] += 1
        if stage not in self._logged:
            self._logged.add(stage)
            log.warning("routescope: experiment %s failed (%s: %s); the call ran on arm A (vLLM's own routing); "
                        "further failures of this stage are only counted", stage, type(exc).__name__, exc,
                        exc_info=exc)

    def status(self) -> dict:
        chooser = self.chooser
        return {"experiment": getattr(getattr(chooser, "config", None), "id", None), "unavailable": dict(self.unavailable),
                "routed": dict(self.routed), "errors": dict(self.errors), "batch_invariant": self.batch_invariant}

    # ---- choosing ------------------------------------------------------------------------
    def route(self, decision: Decision, shape: CallShape, batch: Batch, model: str | None, q: Any,
              position: Any, args: tuple, kwargs: dict, arg: Callable[[tuple, dict, str], Any]) -> Route | None:
        """How an experiment runs this call, or None: vLLM's own routing, observed as without one.

        ``arg(args, kwargs, name)`` reads one of vLLM's arguments by name (the observer's, which knows the
        signature): only B calls read them all."""
        chooser = self.chooser
        if chooser is None:
            if self.batch_invariant:
                self._batch_invariant_call()
            return None
        try:  # never-moved calls (capture, batch-invariant, guard, decode onto prefill) come back as None
            arm = chooser.choose(decision, shape, batch, model, q, position)
        except Exception as exc:  # noqa: BLE001 - the call stays on A
            self.failed("choose", exc)
            return None
        if arm is None:
            return None
        call = None
        if arm.is_b:
            try:
                call = PrefillCall(*(arg(args, kwargs, name) for name in PARAMS))
                why = self.arms.unavailable(arm.decision.kernel, call, shape.q_dtype, shape.kv_dtype)
            except Exception as exc:  # noqa: BLE001 - a check that raises reads as unavailable
                why = f"{type(exc).__name__}: {exc}"
            if why is not None:
                self.unavailable[arm.decision.kernel.value] += 1
                self._log_once(f"unavailable:{arm.decision.kernel}", "routescope: experiment arm B's %s cannot take "
                               "this call here (%s); such calls stay on arm A", arm.decision.kernel, why)
                self.finish(chooser, arm, Outcome.UNAVAILABLE, ArmUnavailable(why))
                return None
        return Route(chooser, arm, call, decision, shape, batch, q)

    def _batch_invariant_call(self) -> None:
        """While vLLM runs batch-invariant the registry attaches no chooser; the started experiment still counts the
        call as never moved (its ``never_moved`` is what its report exports)."""
        experiment = getattr(self.registry, "current", None)
        if experiment is None or getattr(experiment, "state_name", None) != "running":
            return
        try:
            counts = experiment.never_moved
            counts[BATCH_INVARIANT] = counts.get(BATCH_INVARIANT, 0) + 1
        except Exception as exc:  # noqa: BLE001
            self.failed("count", exc)

    def _log_once(self, key: str, msg: str, *args: Any) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.info(msg, *args)

    # ---- running -------------------------------------------------------------------------
    def run(self, obs: Any, call: Any, original: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """Run a chosen call (``call.route``): a timed A call, a numerics sample, or B with A as its fallback."""
        route: Route = call.route
        chooser, arm = route.chooser, route.arm
        if not arm.is_b or arm.check:
            if not arm.is_b:
                self.begin(chooser, arm, route.q)
            try:
                result = original(*args, **kwargs)  # arm A: vLLM's own routing, into the caller's output
            except BaseException as exc:
                self.finish(chooser, arm, Outcome.ERROR, exc)
                obs.after(call, exc)
                raise
            if not arm.is_b:  # the chooser's clock stops first: the probe's bookkeeping is not A's time
                self.routed["a_timed"] += 1
                self.finish(chooser, arm, Outcome.RAN)
                obs.after(call, None)
                return result
            obs.after(call, None)
            self._sample(obs, route)  # B into scratch, compared by the chooser; the caller has A's output
            return result
        b_call, exc = self.prepare_b(arm, route.call)
        if exc is None:
            self.begin(chooser, arm, route.q)
            exc = self._off_the_books(obs, self.launch_b, arm, b_call, route.call.output)
        if exc is None:
            self.routed["b"] += 1
            self.finish(chooser, arm, Outcome.RAN)
            call.launched = arm.decision.kernel
            obs.after(call, None)
            return None  # vLLM's entry returns None: it writes ``output``
        self.routed["b_failed"] += 1
        self.finish(chooser, arm, outcome_of(exc), exc)
        obs.after(call, exc)  # the probe counts B's error, as the Dispatcher's does
        again = obs.start(call.key, route.active, route.shape, route.batch, route.q)  # a fresh call on arm A
        try:
            result = original(*args, **kwargs)
        except BaseException as a_exc:
            if again is not None:
                obs.after(again, a_exc)
            raise
        if again is not None:
            obs.after(again, None)
        return result

    def _sample(self, obs: Any, route: Route) -> None:
        chooser, arm, call = route.chooser, route.arm, route.call
        try:
            scratch = torch.empty_like(call.output)
        except Exception as exc:  # noqa: BLE001
            self.failed("scratch", exc)
            self.finish(chooser, arm, Outcome.FAILED, exc)
            return
        b_call, exc = self.prepare_b(arm, call)
        if exc is None:
            self.begin(chooser, arm, route.q)
            exc = self._off_the_books(obs, self.launch_b, arm, b_call, scratch)
        if exc is not None:
            self.routed["b_failed"] += 1
            self.finish(chooser, arm, outcome_of(exc), exc)
            return
        self.routed["b_checked"] += 1
        self.finish(chooser, arm, Outcome.CHECKED, None, call.output, scratch)

    @staticmethod
    def _off_the_books(obs: Any, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` with no call in flight for the getters' launch markers (B's launch is not vLLM's)."""
        local = obs._local
        held = getattr(local, "call", None)
        local.call = None
        try:
            return fn(*args)
        finally:
            local.call = held

    # ---- running -------------------------------------------------------------------------
    def finish(self, chooser: ArmChooser, arm: Arm, outcome: Outcome, error: BaseException | None = None,
               expected: Any = None, got: Any = None) -> None:
        try:
            chooser.finish(arm, outcome, error, expected, got)
        except Exception as exc:  # noqa: BLE001
            self.failed("finish", exc)

    def begin(self, chooser: ArmChooser, arm: Arm, q: Any) -> None:
        """The chooser's clock starts here; vLLM's kernels write no device stamps, so a stamp it returns is unused."""
        if not arm.timed:
            return
        try:
            chooser.begin(arm, q, None)
        except Exception as exc:  # noqa: BLE001
            self.failed("begin", exc)

    def prepare_b(self, arm: Arm, call: PrefillCall) -> tuple[PrefillCall, BaseException | None]:
        """B's call as its launcher takes it (``VllmArms.prepare``), made before B's clock starts; an exception it
        raised is B's failure, and A runs instead."""
        try:
            return self.arms.prepare(arm.decision.kernel, call), None
        except Exception as exc:  # noqa: BLE001
            return call, exc

    def launch_b(self, arm: Arm, call: PrefillCall, output: Any) -> BaseException | None:
        """B's launch; the exception it raised, or None."""
        try:
            self.arms.launch(arm.decision.kernel, call, output)
        except Exception as exc:  # noqa: BLE001 - B's failure is the experiment's to count; A runs instead
            return exc
        return None


def outcome_of(exc: BaseException) -> Outcome:
    """A launch that declined before writing anything is ``unavailable``; any other exception, ``failed``."""
    return Outcome.UNAVAILABLE if isinstance(exc, ArmUnavailable) else Outcome.FAILED
