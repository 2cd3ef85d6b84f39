"""The bench's stream: the demo's prefill-entry calls, filtered by rows and thinned below a rows edge.

A live server reaches a few hundred calls in the thin rows buckets near the crossover only over hours (32-63 rows
hold 0.2% of the demo's prefill-entry calls under 256 rows). The bench gets there in a minute by keeping every call
from ``keep_rows`` up to ``keep_below`` rows (no upper edge: None) and one in ``thin`` (by count) of the others,
over many more calls of traffic. Thinning leaves each rows bucket's own calls untouched in kind (a bucket lies wholly
inside or outside the kept range, whose edges are bucket edges), so the per-bucket ratios are those of the unthinned
traffic; what changes is the buckets' weights, hence the saving, which is over the stream as sampled.

The traffic is generated in segments of ``SEGMENT_CALLS`` calls, segment ``i`` from seed ``seed + i`` (the
scheduler's scenario cycle is about 1,300 calls, so each segment holds thousands of cycles), in parallel processes,
and concatenated in seed order: the same stream for the same arguments on any machine.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

from workloads.traffic import CallSpec, traffic

SEGMENT_CALLS = 1_000_000  # calls of traffic per segment (prefill and decode entries, every size)


def _keep(spec: CallSpec, max_rows: int) -> bool:
    return spec.entry == "prefill" and spec.rows <= max_rows


def stream(calls: int, *, seed: int, max_rows: int) -> list[CallSpec]:
    """The first ``calls`` prefill-entry calls of the demo's traffic with at most ``max_rows`` rows (one seed)."""
    return list(itertools.islice((c for c in traffic(seed, glm_bug=True) if _keep(c, max_rows)), calls))


def segment(seed: int, max_rows: int, keep_rows: int, thin: int, size: int = SEGMENT_CALLS,
            keep_below: int | None = None) -> tuple[list, int]:
    """One segment's kept calls and how many it generated: every call of ``keep_rows`` up to ``keep_below`` rows,
    one in ``thin`` of the others (the first, the ``thin``-th after it, ...)."""
    kept: list[CallSpec] = []
    others = 0
    top = keep_below if keep_below is not None else max_rows + 1
    for spec in itertools.islice(traffic(seed, glm_bug=True), size):
        if not _keep(spec, max_rows):
            continue
        if keep_rows <= spec.rows < top:
            kept.append(spec)
            continue
        if others % thin == 0:
            kept.append(spec)
        others += 1
    return kept, size


def _segment(args: tuple) -> tuple[list, int]:
    return segment(*args)


def thinned(calls: int, *, seed: int, max_rows: int, keep_rows: int, thin: int, keep_below: int | None = None,
            workers: int | None = None, progress: Callable[[str], None] | None = None,
            size: int = SEGMENT_CALLS) -> tuple[list[CallSpec], int]:
    """The first ``calls`` kept calls over segments from seeds ``seed``, ``seed + 1``, ...; and the calls of
    traffic generated for them. ``thin`` 1 keeps every call (then this equals ``stream`` in distribution, not call
    for call: the segments restart the scheduler)."""
    if thin < 1:
        raise ValueError(f"thin must be >= 1, got {thin}")
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    say = progress or (lambda text: None)
    workers = max(1, min(workers or os.cpu_count() or 1, 16))
    out: list[CallSpec] = []
    generated = 0
    next_seed = seed
    with ProcessPoolExecutor(workers) as pool:
        while len(out) < calls:
            # the first round one segment per worker; then as many as the yield so far says are left, plus one
            want = workers if not generated else math.ceil((calls - len(out)) * generated / max(len(out), 1) / size) + 1
            seeds = list(range(next_seed, next_seed + max(1, min(want, 8 * workers))))
            next_seed += len(seeds)
            for kept, n in pool.map(_segment, [(s, max_rows, keep_rows, thin, size, keep_below) for s in seeds]):
                if len(out) >= calls:
                    break
                out.extend(kept)
                generated += n
            kept_range = f"{keep_rows}+" if keep_below is None else f"{keep_rows}-{keep_below - 1}"
            say(f"traffic: {min(len(out), calls):,} calls kept of {generated:,} generated "
                f"(every call of {kept_range} rows, one in {thin} of the others)")
            if generated >= size * 10_000:
                raise ValueError(f"{calls} calls not reached in {generated:,} calls of traffic: fewer calls, or a "
                                 "smaller thin")
    return out[:calls], generated
