"""The hot path: the probe the dispatcher calls, built as closures over preallocated aggregates.

Per call ``start`` finds the slot (the decision's table by ``Decision.ordinal``, rows -> bucket from a list,
the model's index from a dict, one list index), adds to three integers and tests the sampling
modulo; ``stop`` compares the implementation string by identity. Everything else (a new
decision, model or slot, a slot's first calls, OPUS calls, sampled calls, errors) takes a
separate, rarer path. Any exception is caught and counted in
``routescope_telemetry_errors_total``: never re-raised.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable

from dispatcher.types import Batch, CallShape, Decision, Kernel

from .aggregates import DROP, STAGE, Aggregates
from .timing import GpuEvents, Token, observe


class TelemetryProbe:
    """Implements dispatcher.probe.Probe; ``start``/``stop``/``error`` are closures set per instance."""

    start: Callable[..., Any]
    stop: Callable[[Any, str], None]
    error: Callable[[Any, BaseException], None]
    record_decode_path: Callable[[int, Any], None]


def build_probe(
    agg: Aggregates,
    *,
    timing: str,
    gpu: GpuEvents | None,
    capturing: Callable[[], bool] | None,
    depth: list[int] | None = None,
    sample_first: int,
    sample_every: int,
    decisions: deque | None,
    samples: deque | None,
    sample_cap: int,
    wall_offset_ns: int,
) -> TelemetryProbe:
    """Bind every aggregate to a local so the hot path does no attribute lookups."""
    tables = agg.tables
    by_ordinal = agg.by_ordinal
    sentinel = agg.sentinel
    enter = agg.enter
    fine = agg.buckets.fine
    new_slot = agg.new_slot
    note_impl = agg.note_impl
    count_error = agg.count_error
    nm = agg.nm
    lut_nm = [fb * nm for fb in agg.buckets.lut]  # rows -> fine bucket x models: one add finds the slot
    midx = agg.model_index  # grows (bounded) as names outside the set are seen, each mapped to "other"
    mget = midx.get
    other = agg.other
    calls, rows_t, drows, simpl = agg.calls, agg.rows, agg.drows, agg.impl
    errs, dropped, info = agg.errs, agg.dropped, agg.info
    dp_calls, dp_rows = agg.dp_calls, agg.dp_rows
    pc = time.perf_counter_ns
    first, every = sample_first, sample_every
    timed = timing != "off"
    E_REC, E_TIM, E_PROBE = STAGE["record"], STAGE["timing"], STAGE["probe"]
    D_POOL = DROP["timing_pool_empty"]
    OPUS = Kernel.AITER_OPUS

    def sampled(s: int, rows: int, d: int, q: Any, stream: Any) -> Any:
        t = pc()
        if decisions is not None:
            decisions.append((t, s, rows, d))
        if not timed:
            return s
        if gpu is not None and q.is_cuda:
            try:
                if depth is not None and capturing is not None and capturing():
                    return s  # a capture torch's hook did not see (raw stream capture): no event
                r = gpu.begin(stream, q.device)
            except Exception:  # noqa: BLE001
                errs[E_TIM] += 1
                return s
            if r is None:
                dropped[D_POOL] += 1
                return s
            return Token(s, t, r[0], r[1])
        return Token(s, pc())

    def rare(decision: Decision, t: list, i: int, shape: CallShape, batch: Batch, q: Any, stream: Any) -> Any:
        """A slot's first calls (all timed), OPUS calls, and new slots: table values below zero."""
        if t is sentinel:  # a numbered decision seen for the first time
            t = enter(decision)
        v = t[i]
        if v == -1:
            v = new_slot(decision, t, i, shape, batch)
            if v == -1:
                return None
        s = -v - 2 if v < -1 else v
        rich = info[s].decision.kernel is OPUS
        rows = shape[0]
        d = batch[1]
        c = calls[s] + 1
        calls[s] = c
        rows_t[s] += rows
        drows[s] += d
        if c >= first and not rich:
            t[i] = s  # first calls done: the fast path takes this slot from now on
        tok = sampled(s, rows, d, q, stream) if (c <= first or not c % every) else s
        if rich:  # OPUS may decline at launch: stop needs this call's rows to move it
            if tok.__class__ is int:
                tok = Token(tok)
            tok.rows, tok.drows, tok.rich = rows, d, True
        return tok

    def start(decision: Decision, shape: CallShape, batch: Batch, model: Any, q: Any, stream: Any,
              _ord: list = by_ordinal, _tables: dict = tables, _lut: list = lut_nm, _midx: dict = midx,
              _calls: list = calls, _rows: list = rows_t, _drows: list = drows, _every: int = every) -> Any:
        # the hot path: state comes in as default arguments (plain locals, no closure cells to chase)
        try:
            try:
                rows = shape[0]
                o = decision.ordinal  # memoised decisions are numbered: a list index, no id() + dict
                t = _ord[o] if o >= 0 else _tables[id(decision)]
                i = _lut[rows] + _midx[model]
            except (LookupError, AttributeError):  # new decision or model, rows past the table: zero-cost try
                return miss(decision, shape, batch, model, q, stream)
            s = t[i]
            if s < 0:
                return rare(decision, t, i, shape, batch, q, stream)
            c = _calls[s] + 1
            _calls[s] = c
            _rows[s] += rows
            d = batch[1]
            if d:
                _drows[s] += d
            if c % _every:
                return s
            return sampled(s, rows, d, q, stream)
        except Exception:  # noqa: BLE001 - telemetry never breaks the call
            errs[E_REC] += 1
            return None

    def miss(decision: Decision, shape: CallShape, batch: Batch, model: Any, q: Any, stream: Any) -> Any:
        try:
            t = tables.get(id(decision))
            if t is None:
                t = enter(decision)
            mi = midx.get(model)
            if mi is None:
                mi = agg.model_slot(model)
            i = fine(shape[0]) * nm + mi
            return rare(decision, t, i, shape, batch, q, stream)
        except Exception:  # noqa: BLE001
            errs[E_REC] += 1
            return None

    def finish(tok: Token, impl: str) -> None:
        s = tok.s
        if tok.rich and impl != "aiter":  # the dispatcher re-decided: OPUS symbol missing
            t = agg.opus_fallback(s)
            calls[s] -= 1
            rows_t[s] -= tok.rows
            drows[s] -= tok.drows
            calls[t] += 1
            rows_t[t] += tok.rows
            drows[t] += tok.drows
            s = t
        if impl is not simpl[s]:
            note_impl(s, impl)
        if tok.pair is not None:
            try:
                gpu.end(s, tok.pair, tok.stream, tok.t0 + wall_offset_ns)  # type: ignore[union-attr]
            except Exception:  # noqa: BLE001
                errs[E_TIM] += 1
                gpu.release(tok.pair)  # type: ignore[union-attr]
        elif tok.t0:
            t0 = tok.t0
            try:
                observe(agg, s, pc() - t0, samples, sample_cap, t0 + wall_offset_ns)
            except Exception:  # noqa: BLE001
                errs[E_TIM] += 1

    def stop(token: Any, impl: str, _impl: list = simpl, _int: type = int) -> None:
        try:
            if token.__class__ is not _int:
                if token is not None:
                    finish(token, impl)
            elif impl is not _impl[token]:
                note_impl(token, impl)
        except Exception:  # noqa: BLE001
            errs[E_REC] += 1

    def error(token: Any, exc: BaseException) -> None:
        try:
            if token is None:
                return
            if token.__class__ is int:
                s = token
            else:
                s = token.s
                if token.pair is not None:
                    gpu.release(token.pair)  # type: ignore[union-attr]
            if not info[s].refused:
                count_error(s, exc)
        except Exception:  # noqa: BLE001
            errs[E_PROBE] += 1

    def record_decode_path(rows: int, model: Any = None) -> None:
        try:
            mi = mget(model, other)
            dp_calls[mi] += 1
            dp_rows[mi] += rows
        except Exception:  # noqa: BLE001
            errs[E_REC] += 1

    probe = TelemetryProbe()
    probe.stop = stop
    probe.error = error
    probe.record_decode_path = record_decode_path
    if gpu is not None and capturing is not None:
        captured = agg.captured
        slot_of = agg.slot_of

        def count_captured(decision: Decision, shape: CallShape, batch: Batch, model: Any) -> None:
            s = slot_of(decision, shape, batch, model)
            if s >= 0:
                captured[s] += 1

        if depth is not None:  # torch's CUDAGraph keeps a capture depth for us: tens of ns per call

            def start_gpu(decision: Decision, shape: CallShape, batch: Batch, model: Any, q: Any, stream: Any) -> Any:
                if depth[0]:
                    try:
                        if q.is_cuda:
                            count_captured(decision, shape, batch, model)
                            return None
                    except Exception:  # noqa: BLE001
                        errs[E_TIM] += 1
                return start(decision, shape, batch, model, q, stream)

        else:  # no CUDAGraph class to watch: ask torch on every GPU call (several µs)

            def start_gpu(decision: Decision, shape: CallShape, batch: Batch, model: Any, q: Any, stream: Any) -> Any:
                try:
                    if q.is_cuda and capturing():
                        count_captured(decision, shape, batch, model)
                        return None
                except Exception:  # noqa: BLE001
                    errs[E_TIM] += 1
                return start(decision, shape, batch, model, q, stream)

        probe.start = start_gpu
    else:
        probe.start = start
    return probe
