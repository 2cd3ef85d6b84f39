"""The hot path: the probe the dispatcher calls around each launch, built as closures over preallocated state.

Per call ``start`` finds the slot (the decision's slot table by ``Decision.ordinal``, the rows'
table position from a list, the model's from a dict), adds to three integers and tests the
sampling modulo; ``stop`` compares the implementation string by identity. State comes in as
default arguments: plain locals, no attribute or closure-cell lookups. Everything else (a new
decision, model or slot, a slot's first calls, OPUS calls, sampled calls, graph captures,
errors) takes a separate, rarer path. Any exception is caught and counted in
``routescope_telemetry_errors_total``: never re-raised.

Tokens ``start`` returns: a plain int (the slot: unsampled, counted, nothing left to do but
check the implementation), a ``timing.Token`` (sampled, or counted at stop), a
``timing.CapturedToken`` (seen during a CUDA graph capture), or None (not recorded).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable

from dispatcher.types import Batch, CallShape, Decision

from .aggregates import STAGE, Aggregates
from .clocks.graphs import GraphHooks
from .slots import NO_SLOT, Clock, slot_of_value
from .clocks.stamps import DeviceStamps
from .clocks.bracket import GraphBrackets
from .clocks.events import CLOCK_PENDING, GpuEvents, GraphEvents
from .clocks.timing import CapturedToken, LatencySink, Token

RECORD, TIMING, PROBE = STAGE["record"], STAGE["timing"], STAGE["probe"]
# How a slot's sampled GPU calls are timed, learnt from its first sampled call: try a device stamp
# and an event pair together, keep the stamp if the launch armed it, else the pair.
UNLEARNT, BY_STAMP, BY_EVENTS = 0, 1, 2


class TelemetryProbe:
    """A ``dispatcher.probe.Probe``: ``start``/``stop``/``error``/``record_decode_path`` are closures set per instance."""

    start: Callable[..., Any]
    stop: Callable[[Any, str], None]
    error: Callable[..., None]
    record_decode_path: Callable[..., None]


def build_probe(
    agg: Aggregates,
    *,
    timing: str,
    sink: LatencySink,
    events: GpuEvents | None,
    graph_events: GraphEvents | None = None,
    brackets: GraphBrackets | None = None,
    stamps: DeviceStamps | None,
    graphs: GraphHooks | None,
    capturing: Callable[[], bool] | None,
    sample_first: int,
    sample_every: int,
    decisions: deque | None,
    wall_offset_ns: int,
) -> TelemetryProbe:
    """Bind every piece of state the hot path touches to a local."""
    index, counters, errors = agg.index, agg.counters, agg.health.errors
    rows_position = [bucket * index.n_models for bucket in agg.buckets.lut]  # rows -> table position of model 0
    last_position = agg.buckets.top * index.n_models
    tables_by_ordinal, tables_by_id, model_index = index.by_ordinal, index.tables, index.model_index
    no_table = index.no_table
    calls, rows_total, decode_rows_total, impl_of = counters.calls, counters.rows, counters.decode_rows, counters.impl
    method = [UNLEARNT] * index.max_slots
    depth, current_capture = (graphs.depth, graphs.current) if graphs is not None else ([0], lambda: None)
    now_ns = time.perf_counter_ns
    timed = timing != "off"

    def count(slot: int, rows: int, decode_rows: int) -> int:
        n = calls[slot] + 1
        calls[slot] = n
        rows_total[slot] += rows
        decode_rows_total[slot] += decode_rows
        return n

    def sampled(slot: int, rows: int, decode_rows: int, q: Any, stream: Any) -> Any:
        t0 = now_ns()
        if decisions is not None:
            decisions.append((t0, slot, rows, decode_rows))
        if not timed:
            return slot
        token = Token(slot, t0)
        if (events is None and stamps is None) or not q.is_cuda:
            return token  # host clock
        token.t0 = 0
        try:
            if capturing is not None and capturing():
                return slot  # a capture torch's CUDAGraph did not announce (raw stream capture): no stamp, no event
            how = method[slot]
            if how != BY_EVENTS and stamps is not None:
                token.stamp = stamps.claim(q.device)
            if how != BY_STAMP and events is not None:
                begun = events.begin(stream, q.device)
                if begun is None:
                    agg.health.drop("timing_pool_empty")
                elif begun is CLOCK_PENDING:  # the gate is being built: no plain sample to start the series on
                    agg.health.drop("timing_clock_pending")
                else:
                    token.pair, token.stream = begun
        except Exception:  # noqa: BLE001
            errors[TIMING] += 1
        return token

    def rare(decision: Decision, table: list, position: int, shape: CallShape, batch: Batch, q: Any, stream: Any) -> Any:
        """New slots, a slot's first calls (all timed), and calls counted at stop."""
        if table is no_table:  # a numbered decision seen for the first time
            table = index.table_for(decision)
        value = table[position]
        if value == NO_SLOT:
            value = index.new_slot(decision, table, position, shape, batch)
            if value == NO_SLOT:
                agg.health.drop("label_overflow")
                return None
        slot = slot_of_value(value)
        rows, decode_rows = shape[0], batch[1]
        if index.counted_at_stop(slot):  # OPUS may decline at launch: count it on the kernel that ran
            token = sampled(slot, rows, decode_rows, q, stream) if calls[slot] < sample_first else None
            if token is None or token.__class__ is int:
                token = Token(slot)
            token.rows, token.decode_rows, token.count_at_stop = rows, decode_rows, True
            return token
        n = count(slot, rows, decode_rows)
        if n >= sample_first:
            table[position] = slot  # first calls done: the fast path takes this slot from now on
        return sampled(slot, rows, decode_rows, q, stream) if (n <= sample_first or not n % sample_every) else slot

    def first_sight(decision: Decision, shape: CallShape, batch: Batch, model: Any, q: Any, stream: Any) -> Any:
        """A decision or model not seen before, or rows past the table."""
        try:
            table = tables_by_id.get(id(decision)) or index.table_for(decision)
            model_at = model_index.get(model)
            if model_at is None:
                model_at = index.model_slot(model)
            rows = shape[0]
            position = (rows_position[rows] if rows < len(rows_position) else last_position) + model_at
            return rare(decision, table, position, shape, batch, q, stream)
        except Exception:  # noqa: BLE001
            errors[RECORD] += 1
            return None

    def announce(result: Any, impl: str | None) -> Any:
        """Note the announced implementation now, so a flush before ``stop`` labels the call right; a Token keeps
        it, for ``stop`` to take back if another implementation ran."""
        if impl is None or result is None:
            return result
        if result.__class__ is int:
            if impl is not impl_of[result]:
                counters.note_impl(result, impl)
        elif not result.count_at_stop:  # a Token (an OPUS call is not counted yet: nothing to label)
            result.announced = impl
            if impl is not impl_of[result.slot]:
                counters.note_impl(result.slot, impl)
        return result

    def start(decision: Decision, shape: CallShape, batch: Batch, model: Any, q: Any, stream: Any,
              impl: str | None = None, _by_ordinal: list = tables_by_ordinal, _by_id: dict = tables_by_id,
              _rows_position: list = rows_position, _model_index: dict = model_index, _calls: list = calls,
              _rows: list = rows_total, _decode_rows: list = decode_rows_total, _impl_of: list = impl_of,
              _every: int = sample_every) -> Any:
        try:
            try:
                rows = shape[0]
                ordinal = decision.ordinal
                table = _by_ordinal[ordinal] if ordinal >= 0 else _by_id[id(decision)]
                position = _rows_position[rows] + _model_index[model]
            except (LookupError, AttributeError):  # new decision or model, rows past the table: a zero-cost try
                return announce(first_sight(decision, shape, batch, model, q, stream), impl)
            slot = table[position]
            if slot < 0:
                return announce(rare(decision, table, position, shape, batch, q, stream), impl)
            n = _calls[slot] + 1
            _calls[slot] = n
            _rows[slot] += rows
            decode_rows = batch[1]
            if decode_rows:
                _decode_rows[slot] += decode_rows
            if n % _every:
                if impl is not _impl_of[slot] and impl is not None:
                    counters.note_impl(slot, impl)
                return slot
            return announce(sampled(slot, rows, decode_rows, q, stream), impl)
        except Exception:  # noqa: BLE001 - telemetry never breaks the call
            errors[RECORD] += 1
            return None

    def settle_slot(token: Token | CapturedToken, impl: str) -> int:
        """The slot a finished call belongs to: an OPUS call the dispatcher re-decided moves to the fallback's."""
        slot = token.slot
        if token.count_at_stop and impl != "aiter":
            slot = index.opus_fallback(slot)
        announced = token.announced
        if announced is not None:
            if announced is impl:
                return slot
            counters.unnote_impl(slot, announced)
        if impl is not impl_of[slot]:
            counters.note_impl(slot, impl)
        return slot

    def finish(token: Token, impl: str) -> None:
        slot = settle_slot(token, impl)
        if token.count_at_stop:
            count(slot, token.rows, token.decode_rows)
        stamp, pair = token.stamp, token.pair
        if stamp is not None:
            if stamp.armed:
                method[slot] = BY_STAMP
                stamps.pending(stamp, slot, now_ns() + wall_offset_ns)  # type: ignore[union-attr]
                if pair is not None:
                    events.release(pair)  # type: ignore[union-attr]
                return
            stamps.release(stamp)  # type: ignore[union-attr]
            method[slot] = BY_EVENTS if pair is not None else UNLEARNT  # no stamp this time: try both again
        if pair is not None:
            try:
                events.end(slot, pair, token.stream, now_ns() + wall_offset_ns)  # type: ignore[union-attr]
            except Exception:  # noqa: BLE001
                errors[TIMING] += 1
                events.release(pair)  # type: ignore[union-attr]
        elif token.t0:
            t0 = token.t0
            try:
                sink.observe(slot, Clock.HOST, now_ns() - t0, t0 + wall_offset_ns)
            except Exception:  # noqa: BLE001
                errors[TIMING] += 1

    def finish_captured(token: CapturedToken, impl: str) -> None:
        slot = settle_slot(token, impl)
        capture = token.capture
        stamp, pair, bracket, timed_replays = token.stamp, token.pair, token.bracket, False
        if stamp is not None:
            if stamp.armed:
                capture.on_drop(stamps.hold(stamp, slot))  # type: ignore[union-attr]
                timed_replays = True
                method[slot] = BY_STAMP
            else:
                stamps.release(stamp)  # type: ignore[union-attr]
        if bracket is not None:  # its first stamp is a node of this graph: the entry is this graph's till it goes
            kept = False
            if not timed_replays:  # (the call's own stamps time it otherwise: the bracket stays open, unread)
                try:
                    brackets.close(bracket, token.stream)  # type: ignore[union-attr]
                    capture.on_drop(brackets.hold(bracket, slot))  # type: ignore[union-attr]
                    kept = timed_replays = True
                except Exception:  # noqa: BLE001 - the call still counts at every replay, untimed
                    errors[TIMING] += 1
            if not kept:
                capture.on_drop(lambda: brackets.give_back(bracket))  # type: ignore[union-attr]
        if pair is not None:
            if timed_replays:  # its start is a node of this graph: no other graph may record it, so it waits
                capture.on_drop(lambda: graph_events.give_back(pair))  # type: ignore[union-attr]
            else:
                pair[1].record(token.stream)
                capture.on_drop(graph_events.hold(slot, pair, capture.replays, token.device))  # type: ignore[union-attr]
                timed_replays = True
        capture.add(counters, slot, token.rows, token.decode_rows, timed=timed_replays)

    def stop(token: Any, impl: str, announced: str | None = None, _impl_of: list = impl_of, _int: type = int) -> None:
        try:
            if token.__class__ is _int:
                if announced is not None and announced is not impl:  # start noted the announced one: move it
                    counters.unnote_impl(token, announced)
                if impl is not _impl_of[token]:
                    counters.note_impl(token, impl)
            elif token.__class__ is Token:
                finish(token, impl)
            elif token is not None:
                finish_captured(token, impl)
        except Exception:  # noqa: BLE001
            errors[RECORD] += 1

    def error(token: Any, exc: BaseException, impl: str | None = None, announced: str | None = None) -> None:
        """The launch raised: the call stays counted (once), labelled with the implementation that was attempted."""
        try:
            if token is None:
                return
            if token.__class__ is int:
                slot = token
                if announced is not None:  # start noted it: only a different attempt moves the label
                    if impl is None or impl is announced:
                        impl = None
                    else:
                        counters.unnote_impl(slot, announced)
            else:
                slot = token.slot
                if token.__class__ is Token:
                    if token.pair is not None:
                        events.release(token.pair)  # type: ignore[union-attr]
                    if token.count_at_stop:
                        count(slot, token.rows, token.decode_rows)
                if token.stamp is not None:
                    stamps.release(token.stamp)  # type: ignore[union-attr]
                if token.__class__ is CapturedToken:
                    if token.pair is not None:  # recorded into the capture: free only when the graph goes
                        pair = token.pair
                        token.capture.on_drop(lambda: graph_events.give_back(pair))  # type: ignore[union-attr]
                    if token.bracket is not None:
                        bracket = token.bracket
                        token.capture.on_drop(lambda: brackets.give_back(bracket))  # type: ignore[union-attr]
                    return  # a capture that raised is not replayed
                if token.announced is not None:
                    if impl is None or impl is token.announced:
                        impl = None
                    else:
                        counters.unnote_impl(slot, token.announced)
            if impl is not None and impl is not impl_of[slot]:
                counters.note_impl(slot, impl)
            if not index.info[slot].refused:
                agg.kernel_errors.add(slot, exc)
        except Exception:  # noqa: BLE001
            errors[PROBE] += 1

    def record_decode_path(rows: int, model: Any = None) -> None:
        """A decode-entry call: counted now, or, seen while this thread captures a graph, at each replay."""
        try:
            at = model_index.get(model, index.other)
            dp = agg.decode_path
            capture = current_capture() if depth[0] else None
            if capture is not None and (capturing is None or capturing()):
                capture.add_to(dp.calls, at, 1)
                capture.add_to(dp.rows, at, rows)
                return
            dp.calls[at] += 1
            dp.rows[at] += rows
        except Exception:  # noqa: BLE001
            errors[RECORD] += 1

    def captured_call(capture: Any, decision: Decision, shape: CallShape, batch: Batch, model: Any, q: Any,
                      stream: Any) -> Any:
        """A call seen while its graph is captured: nothing runs now; each replay of the graph counts it.

        Its replays are timed by a held device stamp where its kernels stamp; otherwise, for one captured call in
        ``sample_every`` of the slot (its first included), by a stamp bracket captured around it (clock ``bracket``)
        or, where the bracket is off or failed to build, an external event pair recorded into the graph."""
        slot = index.slot_of(decision, shape, batch, model)
        if slot == NO_SLOT:
            agg.health.drop("label_overflow")
            return None
        n = counters.captured[slot] + 1
        counters.captured[slot] = n
        token = CapturedToken(slot, capture, shape[0], batch[1], index.counted_at_stop(slot))
        if not timed:
            return token
        how = method[slot]
        if stamps is not None and how != BY_EVENTS:
            token.stamp = stamps.claim_held(q.device)
        if how == BY_STAMP or (n - 1) % sample_every:
            return token
        if brackets is not None and brackets.serves(q.device):
            try:
                token.bracket = brackets.open(q.device, stream)
                token.stream = stream
            except Exception:  # noqa: BLE001 - the call still counts at every replay, untimed
                errors[TIMING] += 1
            return token
        if graph_events is not None:
            pair = graph_events.claim()
            if pair is None:
                agg.health.drop("timing_pool_empty")
                return token
            try:
                if stream is None:
                    stream = graph_events.torch.cuda.current_stream(q.device)
                pair[0].record(stream)
            except Exception:  # noqa: BLE001 - the call still counts at every replay, untimed
                errors[TIMING] += 1
                graph_events.give_back(pair)
                return token
            token.pair, token.stream, token.device = pair, stream, q.device
        return token

    probe = TelemetryProbe()
    probe.stop = stop
    probe.error = error
    probe.record_decode_path = record_decode_path
    if graphs is None:
        probe.start = start
        return probe

    def start_watching_captures(decision: Decision, shape: CallShape, batch: Batch, model: Any, q: Any,
                                stream: Any, impl: str | None = None) -> Any:
        if depth[0]:  # a capture is under way somewhere in this process: is it this thread's, this call's?
            try:
                capture = current_capture()
                if capture is not None and q.is_cuda and (stream is not None or capturing is None or capturing()):
                    return captured_call(capture, decision, shape, batch, model, q, stream)
            except Exception:  # noqa: BLE001
                errors[RECORD] += 1
                return None
        return start(decision, shape, batch, model, q, stream, impl)

    probe.start = start_watching_captures
    return probe
