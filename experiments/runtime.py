"""One running experiment in one process: the arm chooser the Dispatcher (and the vLLM plugin) call per routed call.

The call path does counting and a hash: the cell of a call is looked up once per (decision, rows bucket, model) and
kept; timings and numerics are queued, and everything else (statistics, stops, history) happens in ``flush``, off
the call path. ``state()`` is this process's part, which ``report`` merges with the other processes' parts.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_right
from collections import deque
from typing import Any

from dispatcher.arms import Arm, Outcome, arm_decision
from dispatcher.platform import Platform
from dispatcher.policy import DecisionCache, Policy
from dispatcher.types import Batch, CallShape, Decision
from telemetry.buckets import rows_edges, rows_labels

from .assignment import B, GroupPicks, Schedule, _kind, group_base, stable_key
from .candidates import ArmRouter, NotMoved, refuse_decode_on_prefill
from .clock import Clock, Ticket
from .config import ExperimentConfig
from .covariate import Predictor
from .numerics import Numerics
from .report import cell_view, stops_from
from .stats import Moments

log = logging.getLogger("routescope.experiments")
HISTORY = 60  # flushes kept per process for the page's chart
MAX_ROUTES = 65536  # call-path keys (decision, rows, model) kept; past it, calls look their rows bucket up
INELIGIBLE = ("ineligible",)  # the route of calls the two arms route alike (kept, so they are not worked out again)


class State:
    RUNNING = "running"
    STOPPED = "stopped"
    FINISHED = "finished"


class Cell:
    """Model x rows bucket x shape x call class: where A and B are compared."""

    __slots__ = ("name", "model", "rows_bucket", "lo", "hi", "shape", "call_class", "kernel_a", "kernel_b",
                 "decision_b", "key", "base", "seen", "next", "schedule", "lost", "calls_b", "a", "b", "b_since_check",
                 "verified", "checked", "mismatched", "covariate", "prediction", "bound_a", "bound_b")

    def __init__(self, model: str | None, rows_bucket: str, lo: int, hi: int | None, shape: CallShape,
                 decision: Decision, decision_b: Decision, covariate: Any, prediction: dict) -> None:
        self.model, self.rows_bucket, self.lo, self.hi = model, rows_bucket, lo, hi
        self.shape = (f"{shape.nope_head_dim}+{shape.rope_head_dim} h{shape.heads} topk{shape.topk} "
                      f"{shape.q_dtype}/{shape.kv_dtype}{' ragged' if shape.ragged else ''}")
        self.call_class = decision.call_class.value
        self.kernel_a, self.kernel_b = decision.kernel.value, decision_b.kernel.value
        self.decision_b = decision_b
        self.name = f"{model}|{rows_bucket}|{self.shape}|{self.call_class}|{self.kernel_a}|{self.kernel_b}"
        self.key = stable_key(self.name)
        self.base = 0  # assignment.group_base(seed, key), set by the experiment
        self.schedule: Schedule | None = None  # the picks of this cell's count (the Dispatcher's position)
        self.next = -1  # the count at which ``schedule`` is next asked (a pick, or its chunk's end)
        # eligible calls seen (and drawn for); of them B's, and the picks that stayed on A untimed (captured, B
        # unavailable): every other call ran on A, so calls A = seen - calls B - lost
        self.seen = self.calls_b = self.lost = self.b_since_check = 0
        self.a, self.b = Moments(), Moments()
        self.verified = False  # a numerics sample of this cell has passed: B's output may reach the caller
        self.checked = self.mismatched = 0
        self.covariate = covariate  # rows -> predicted seconds under A, or None
        self.prediction = prediction
        self.bound_a = self.bound_b = 0.0  # the largest clock bound of the arm's readings (seconds)

    @property
    def calls_a(self) -> int:
        return self.seen - self.calls_b - self.lost

    def state(self) -> dict:
        return {"name": self.name, "model": self.model, "rows_bucket": self.rows_bucket, "lo": self.lo,
                "hi": self.hi, "shape": self.shape, "call_class": self.call_class, "kernel_a": self.kernel_a,
                "kernel_b": self.kernel_b, "calls_a": self.calls_a, "calls_b": self.calls_b,
                "a": list(self.a.as_tuple()), "b": list(self.b.as_tuple()), "checked": self.checked,
                "mismatched": self.mismatched, "prediction": self.prediction, "bound_a_s": self.bound_a,
                "bound_b_s": self.bound_b}


class Experiment:
    """Implements ``dispatcher.arms.ArmChooser`` for one ``ExperimentConfig`` on one platform and active policy."""

    def __init__(self, config: ExperimentConfig, platform: Platform, policy: Policy, *, torch_mod: Any = None,
                 predictor: Predictor | None = None, batch_invariant: bool = False,
                 started_at: float | None = None, gate_launcher: Any = None) -> None:
        self.config = config
        self.router = ArmRouter(config, platform, policy)
        refuse_decode_on_prefill(self.router, DecisionCache(platform, policy))
        threshold = config.threshold
        self._edges = rows_edges(policy.thresholds + ((threshold,) if threshold else ()))
        self._labels = rows_labels(self._edges)
        self._predictor = predictor
        self._clock = Clock(torch_mod, gated=config.clock == "gated", gate_launcher=gate_launcher)
        self._numerics = Numerics(config.tolerance, torch_mod)
        self._torch = torch_mod
        cuda = getattr(torch_mod, "cuda", None)
        self._capturing = getattr(cuda, "is_current_stream_capturing", None)  # asked only of a picked GPU call
        self._groups = GroupPicks(config.seed, config.fraction)  # picks by position (step, call in step)
        self._group = -1
        self._group_kinds: dict[int, int] | None = None
        self._routes: dict[tuple, Any] = {}
        self.cells: dict[str, Cell] = {}
        self.never_moved: dict[str, int] = {}
        self.ineligible = 0
        self.b_calls = 0
        self.running = not batch_invariant
        self.state_name = State.RUNNING
        self.stop_reason: str | None = None
        self.end_reason: str | None = None
        self.started_at = time.time() if started_at is None else started_at
        self._t0 = time.monotonic() - (time.time() - self.started_at)
        self.ended_at: float | None = None
        self.history: deque = deque(maxlen=HISTORY)
        self.b_failures = 0
        self.last_error: str | None = None
        if batch_invariant:
            self.never_moved[NotMoved.BATCH_INVARIANT.value] = 0
            self._batch_invariant = True
        else:
            self._batch_invariant = False

    # -- the call path ------------------------------------------------------------------------------------------

    def choose(self, decision: Decision, shape: CallShape, batch: Batch, model: str | None, q: Any,
               position: Any = None) -> Arm | None:
        """See ``dispatcher.arms.ArmChooser.choose``; ``position`` (step, call in step) replaces the cell count.

        An eligible call that is not picked costs a count and a compare: the picks are found a batch at a time
        (``assignment.Schedule``, ``assignment.GroupPicks``), the same draws as ``assignment.assign`` per call."""
        route = self._routes.get((decision.ordinal, shape[0], model))  # a known (decision, rows, model): no bisect
        if route is None:
            route = self._route(decision, shape, model)
        if route.__class__ is not Cell:
            if route is INELIGIBLE:
                self.ineligible += 1
            else:
                self.never_moved[route] += 1
            return None
        if not self.running:
            self.never_moved[NotMoved.STOPPED.value] = self.never_moved.get(NotMoved.STOPPED.value, 0) + 1
            return None
        n = route.seen
        route.seen = n + 1
        if position is None:
            if n != route.next:
                return None
            kind = route.schedule.take(n)
            route.next = route.schedule.next
        else:
            group, index = position
            if group != self._group:
                self._group = group
                self._group_kinds = self._groups.group(group) if group >= 0 else None
            kinds = self._group_kinds
            if kinds is not None and 0 <= index < self._groups.width:
                kind = kinds.get(index, 0)
            elif kinds is not None and index >= 0:
                kind = self._groups.kind(group, index)
            else:
                kind = _kind(group_base(self.config.seed, group), index, self.config.fraction)
        if not kind:
            return None
        return self._pick(route, kind, decision, shape[0], q)

    def _pick(self, cell: Cell, kind: int, decision: Decision, rows: int, q: Any) -> Arm | None:
        """A call drawn for B or a timed A: moved and timed unless it is being captured into a CUDA graph."""
        if q.is_cuda and self._capturing is not None and self._capturing():
            # counted here only: an unpicked captured call stays on A whatever the capture, so it is not asked
            self.never_moved[NotMoved.CAPTURE.value] = self.never_moved.get(NotMoved.CAPTURE.value, 0) + 1
            cell.lost += 1
            return None
        x = cell.covariate(rows) if cell.covariate is not None else None
        if kind == B:
            config = self.config
            cell.calls_b += 1
            self.b_calls += 1
            if config.max_calls is not None and self.b_calls >= config.max_calls:
                self.end("max_calls")
            check = not cell.verified or cell.b_since_check + 1 >= config.numerics_every
            cell.b_since_check = 0 if check else cell.b_since_check + 1
            return Arm(cell.decision_b, is_b=True, check=check, ticket=Ticket(cell, True, x))
        return Arm(decision, is_b=False, ticket=Ticket(cell, False, x))

    def begin(self, arm: Arm, q: Any, stream: Any) -> Any:
        return self._clock.begin(arm.ticket, q, stream)

    def finish(self, arm: Arm, outcome: Outcome, error: BaseException | None = None, expected: Any = None,
               got: Any = None) -> None:
        ticket = arm.ticket
        if outcome is Outcome.RAN or outcome is Outcome.CHECKED:
            self._clock.end(ticket)
            if outcome is Outcome.CHECKED:
                self._numerics.compare(ticket.cell, expected, got)
                if not self._numerics.pending_on_device:
                    self._take_numerics()
            return
        self._clock.drop(ticket)
        cell = ticket.cell
        if outcome is Outcome.UNAVAILABLE:
            cell.calls_b -= 1
            cell.lost += 1
            self.b_calls -= 1
            reason = NotMoved.UNAVAILABLE.value
            self.never_moved[reason] = self.never_moved.get(reason, 0) + 1
            for key, route in list(self._routes.items()):  # every later call of this cell stays on A, counted
                if route is cell:
                    self._routes[key] = reason
            return
        if outcome is Outcome.FAILED:
            self.b_failures += 1
            self.last_error = f"{type(error).__name__}: {error}"
            self.stop("b_raised")

    # -- off the call path --------------------------------------------------------------------------------------

    def _route(self, decision: Decision, shape: CallShape, model: str | None) -> Any:
        """A cell, a never-moved reason, or ``INELIGIBLE`` (the arms agree) for calls like this one."""
        ordinal = decision.ordinal
        bucket = bisect_right(self._edges, shape[0]) - 1
        key = ("bucket", ordinal if ordinal >= 0 else (shape[1:], decision), bucket, model)  # never a 3-tuple
        route = self._routes.get(key)
        if route is None:
            route = self._routes[key] = self._new_route(decision, shape, model, bucket)
        if ordinal >= 0 and len(self._routes) < MAX_ROUTES:  # the call path's key: the exact rows (no bisect)
            self._routes[(ordinal, shape[0], model)] = route
        return route

    def _new_route(self, decision: Decision, shape: CallShape, model: str | None, bucket: int) -> Any:
        """Worked out once per (decision, rows bucket, model): B's kernel, eligibility, the cell."""
        router = self.router
        label = self._labels[bucket]
        kernel_b = router.kernel_b(decision, shape)
        route: Any
        if router.candidate.name == "aa":
            eligible = router.aa_cell(model, label, decision.kernel)
        else:
            eligible = kernel_b is not decision.kernel
        if not eligible:
            route = INELIGIBLE
        elif decision.refused:
            route = NotMoved.GUARD.value
        elif self._batch_invariant:
            route = NotMoved.BATCH_INVARIANT.value
        elif router.decode_on_prefill(decision, kernel_b) and not self.config.allow_decode_on_prefill:
            route = NotMoved.DECODE_ON_PREFILL.value
        else:
            lo = self._edges[bucket]
            hi = self._edges[bucket + 1] if bucket + 1 < len(self._edges) else None
            why = router.candidate.label
            decision_b = arm_decision(decision, kernel_b, why)
            covariate, prediction = (None, {"ratio": None, "reason": "no latency table for this platform"})
            if self._predictor is not None:
                covariate, prediction = self._predictor.for_cell(decision.kernel, kernel_b, shape, lo, hi)
            cell = Cell(model, label, lo, hi, shape, decision, decision_b, covariate, prediction)
            cell.base = group_base(self.config.seed, cell.key)
            route = self.cells.setdefault(cell.name, cell)
            if route.schedule is None:
                route.schedule = Schedule(route.base, self.config.fraction)
                route.next = route.schedule.next
        if route.__class__ is str:
            self.never_moved.setdefault(route, 0)
        return route

    def _take_numerics(self) -> None:
        for cell, ok in self._numerics.resolve():
            cell.checked += 1
            if ok:
                cell.verified = True
            else:
                cell.mismatched += 1
                self.stop("numerics")

    def flush(self) -> None:
        """Fold timings and numerics in, apply the stops, keep a history point. Never called on the call path."""
        for ticket, seconds in self._clock.resolve():
            cell = ticket.cell
            if ticket.is_b:
                cell.b.add(seconds, ticket.x)
                cell.bound_b = max(cell.bound_b, ticket.bound)
            else:
                cell.a.add(seconds, ticket.x)
                cell.bound_a = max(cell.bound_a, ticket.bound)
        self._take_numerics()
        if self.state_name == State.RUNNING:
            limit = self.config.max_seconds
            if limit is not None and time.monotonic() - self._t0 >= limit:
                self.end("max_seconds")
        cells = [c.state() for c in self.cells.values()]
        if self.state_name == State.RUNNING:
            reason = stops_from(self.config, cells, time.time() - self.started_at)
            if reason is not None:
                self.stop(reason)
        self.history.append((time.time(), [(c["name"], c["calls_a"], c["calls_b"], c["a"], c["b"]) for c in cells]))

    def stop(self, reason: str) -> None:
        """Stop now (B takes no more calls), once; logged once."""
        if self.state_name != State.RUNNING:
            return
        self.running = False
        self.state_name = State.STOPPED
        self.stop_reason = reason
        self.ended_at = time.time()
        log.warning("experiment %s stopped: %s", self.config.id, reason)

    def end(self, reason: str) -> None:
        """Finish at a limit (time or calls), once; logged once."""
        if self.state_name != State.RUNNING:
            return
        self.running = False
        self.state_name = State.FINISHED
        self.end_reason = reason
        self.ended_at = time.time()
        log.info("experiment %s finished: %s", self.config.id, reason)

    def state(self) -> dict:
        """This process's part, JSON-ready: what ``report.merge`` adds up across processes."""
        return {
            "config": self.config.model_dump(mode="json"), "state": self.state_name, "stop_reason": self.stop_reason,
            "end_reason": self.end_reason, "started_at": self.started_at, "ended_at": self.ended_at,
            "cells": [c.state() for c in self.cells.values()], "never_moved": dict(self.never_moved),
            "ineligible": self.ineligible, "b_failures": self.b_failures, "last_error": self.last_error,
            "clock_dropped": self._clock.dropped, "clock_calibration": self._clock.calibrated(),
            "history": [list(h) for h in self.history],
        }

    def view(self) -> list[dict]:
        """This process's cells as the report shows them (for a quick look without merging)."""
        return [cell_view(c) for c in self.state()["cells"]]
