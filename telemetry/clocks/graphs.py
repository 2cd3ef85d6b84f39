"""CUDA graphs seen from Python: which graph a call is being captured into, and what each replay adds.

A captured call runs no Python when its graph is replayed, so the probe records it against the
graph being captured instead of counting it (``routescope_graph_captured_calls_total`` counts the
capture itself). ``GraphHooks`` wraps ``torch.cuda.graphs.CUDAGraph`` once per process:

- ``capture_begin`` first runs what telemetry must do outside any capture (``call_before_capture``: the
  bracket clock's table and kernel); ``capture_begin``/``capture_end`` keep a capture depth (any thread;
  the hot path reads ``depth[0]``, tens of ns) and a stack of captures per thread, so a call on a thread
  that is not capturing is counted as an ordinary call;
- ``capture_end`` turns the capture's calls into a ``ReplayRecord`` stored on the graph object
  (a capture that fails leaves none); ``replay`` adds it to the same per-slot counters an eager
  call feeds (and the decode entry's calls to its per-model counters), after the replay was
  enqueued; ``reset`` and garbage collection drop it.

Every torch capture path goes through that class: ``torch.cuda.graph``, ``make_graphed_callables``
and vLLM's ``CUDAGraphWrapper`` (which calls ``replay()``). A capture made below torch (a raw
stream capture) is not seen: its calls count once, at capture.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from ..slots import SlotCounters

_HOOKS_ATTR = "_routescope_graph_hooks"
RECORD_ATTR = "_routescope_replay"


class ReplayRecord:
    """What one replay adds.

    ``parts``: per counters object, (slot, calls, rows, decode rows, untimed calls) for each slot
    captured. ``adds``: (list, index, amount) for counters kept outside the slots (the decode
    entry's calls and rows per model).
    """

    __slots__ = ("parts", "adds", "calls", "replays", "_on_drop")

    def __init__(self, parts: list[tuple[SlotCounters, tuple[tuple[int, int, int, int, int], ...]]],
                 on_drop: list[Callable[[], None]], adds: tuple[tuple[list[int], int, int], ...] = (),
                 replays: list[int] | None = None) -> None:
        self.parts = [(c.calls, c.rows, c.decode_rows, c.replayed, c.replayed_untimed, items) for c, items in parts]
        self.adds = adds
        self.calls = sum(n for _, items in parts for _, n, _, _, _ in items)
        self.replays = replays if replays is not None else [0]  # shared with the capture's graph event pairs
        self._on_drop = on_drop

    def apply(self) -> None:
        self.replays[0] += 1
        for calls, rows, decode_rows, replayed, untimed, items in self.parts:
            for slot, n, r, d, u in items:
                calls[slot] += n
                rows[slot] += r
                decode_rows[slot] += d
                replayed[slot] += n
                if u:
                    untimed[slot] += u
        for counter, i, n in self.adds:
            counter[i] += n

    def drop(self) -> None:
        """Release what the record holds (device stamp entries); idempotent."""
        on_drop, self._on_drop = getattr(self, "_on_drop", []), []
        for release in on_drop:
            try:
                release()
            except Exception:  # noqa: BLE001 - a release never raises into torch
                pass

    def __del__(self) -> None:
        self.drop()


class Capture:
    """The calls one capture under way has seen, per counters object and slot, and its other counts."""

    __slots__ = ("graph", "replays", "_counts", "_adds", "_on_drop")

    def __init__(self, graph: Any) -> None:
        self.graph = graph
        self.replays = [0]  # how often the graph was replayed: what an event pair held in it was last recorded by
        self._counts: dict[int, tuple[SlotCounters, dict[int, list[int]]]] = {}
        self._adds: dict[tuple[int, int], list] = {}
        self._on_drop: list[Callable[[], None]] = []

    def add(self, counters: SlotCounters, slot: int, rows: int, decode_rows: int, *, timed: bool = True) -> None:
        """A call of ``slot``; ``timed``: its replays write a device stamp (else the histogram never sees them)."""
        per = self._counts.setdefault(id(counters), (counters, {}))[1]
        c = per.get(slot)
        if c is None:
            per[slot] = [1, rows, decode_rows, 0 if timed else 1]
        else:
            c[0] += 1
            c[1] += rows
            c[2] += decode_rows
            c[3] += 0 if timed else 1

    def add_to(self, counter: list[int], i: int, n: int) -> None:
        """Each replay adds ``n`` to ``counter[i]`` (a count kept outside the slots)."""
        entry = self._adds.get((id(counter), i))
        if entry is None:
            self._adds[(id(counter), i)] = [counter, i, n]
        else:
            entry[2] += n

    def on_drop(self, release: Callable[[], None]) -> None:
        """Run ``release`` when the graph's record goes (reset, garbage collection, failed capture)."""
        self._on_drop.append(release)

    @property
    def empty(self) -> bool:
        return not self._counts and not self._adds and not self._on_drop

    def record(self) -> ReplayRecord:
        parts = [(counters, tuple((s, c[0], c[1], c[2], c[3]) for s, c in per.items()))
                 for counters, per in self._counts.values()]
        adds = tuple((counter, i, n) for counter, i, n in self._adds.values())
        return ReplayRecord(parts, self._on_drop, adds, self.replays)

    def discard(self) -> None:
        ReplayRecord([], self._on_drop).drop()


class GraphHooks:
    """The process's watch on ``CUDAGraph``: capture depth, captures per thread, replay accounting."""

    def __init__(self) -> None:
        self.depth = [0]  # captures under way in this process, any thread
        self.unwrapped_replay: Callable[..., Any] | None = None  # torch's own replay (benchmarks compare with it)
        self._before: list[weakref.WeakMethod] = []  # run before each capture begins (the bracket clock's set-up)
        self._captures: dict[int, list[Capture]] = {}
        self._lock = threading.Lock()

    def current(self) -> Capture | None:
        """The innermost capture under way on this thread, if any."""
        stack = self._captures.get(threading.get_ident())
        return stack[-1] if stack else None

    def call_before_capture(self, method: Callable[[], None]) -> Callable[[], None]:
        """Run the bound ``method`` before every capture begins (held weakly); returns what stops it."""
        ref = weakref.WeakMethod(method)  # type: ignore[arg-type]
        with self._lock:
            self._before.append(ref)

        def stop() -> None:
            with self._lock:
                if ref in self._before:
                    self._before.remove(ref)

        return stop

    def _before_capture(self) -> None:
        """Outside the capture still: what may not run inside one (a kernel's first load, pinned allocations)."""
        with self._lock:
            refs = [r for r in self._before if r() is not None]
            self._before[:] = refs
        for ref in refs:
            method = ref()
            if method is not None:
                try:
                    method()
                except Exception:  # noqa: BLE001 - a capture never fails because of telemetry
                    pass

    def _begin(self, graph: Any) -> None:
        with self._lock:
            self._captures.setdefault(threading.get_ident(), []).append(Capture(graph))
            self.depth[0] += 1

    def _end(self, graph: Any) -> Capture | None:
        with self._lock:
            self.depth[0] = max(0, self.depth[0] - 1)
            stack = self._captures.get(threading.get_ident(), [])
            for i in range(len(stack) - 1, -1, -1):
                if stack[i].graph is graph:
                    capture = stack.pop(i)
                    break
            else:
                capture = None
            if not stack:
                self._captures.pop(threading.get_ident(), None)
            return capture

    def install(self, cls: Any) -> None:
        begin, end, replay = cls.capture_begin, cls.capture_end, cls.replay
        self.unwrapped_replay = replay
        reset = getattr(cls, "reset", None)
        hooks = self

        def capture_begin(graph: Any, *args: Any, **kwargs: Any) -> Any:
            if hooks._before:
                hooks._before_capture()
            result = begin(graph, *args, **kwargs)
            hooks._begin(graph)
            return result

        def capture_end(graph: Any, *args: Any, **kwargs: Any) -> Any:
            capture = hooks._end(graph)
            try:
                result = end(graph, *args, **kwargs)
            except BaseException:
                if capture is not None:
                    capture.discard()
                raise
            if capture is not None and not capture.empty:
                _set_record(graph, capture.record())
            return result

        def replay_(graph: Any, *args: Any, **kwargs: Any) -> Any:
            result = replay(graph, *args, **kwargs)
            record = _get_record(graph)
            if record is not None:
                record.apply()
            return result

        cls.capture_begin, cls.capture_end, cls.replay = capture_begin, capture_end, replay_
        if reset is not None:

            def reset_(graph: Any, *args: Any, **kwargs: Any) -> Any:
                _set_record(graph, None)
                return reset(graph, *args, **kwargs)

            cls.reset = reset_


def _get_record(graph: Any) -> ReplayRecord | None:
    try:
        return graph.__dict__.get(RECORD_ATTR)
    except AttributeError:  # a graph class without instance dicts
        return getattr(graph, RECORD_ATTR, None)


def _set_record(graph: Any, record: ReplayRecord | None) -> None:
    old = _get_record(graph)
    if old is not None:
        old.drop()
    try:
        setattr(graph, RECORD_ATTR, record)
    except AttributeError:  # pragma: no cover - a graph that takes no attributes: replays stay uncounted
        if record is not None:
            record.drop()


def graph_hooks(torch_mod: Any) -> GraphHooks | None:
    """The process's hooks on ``torch_mod``'s CUDAGraph, installed the first time (None where the class is absent)."""
    try:
        cls = torch_mod.cuda.graphs.CUDAGraph
        cls.capture_begin, cls.capture_end, cls.replay  # noqa: B018 - probe the API
    except AttributeError:
        return None
    hooks = cls.__dict__.get(_HOOKS_ATTR)
    if hooks is None:
        hooks = GraphHooks()
        hooks.install(cls)
        setattr(cls, _HOOKS_ATTR, hooks)
    return hooks
