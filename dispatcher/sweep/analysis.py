"""From timings to a gate: the A/B ratio table, the crossover per top-k, the row count to gate at. Pure."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch


class Result(NamedTuple):
    """One kernel timed at one grid point (a row of the CSV and of the JSON's ``results``)."""

    kernel: str
    impl: str
    layout: str
    rows: int
    topk: int
    heads: int
    head_dim: int
    nope_head_dim: int
    rope_head_dim: int
    dtype: str
    kv_len: int
    median_us: float
    p20_us: float
    p80_us: float
    min_us: float
    repeats: int
    timer: str
    kv_dtype: str | None = None  # the kv pool's dtype (older records have none: dtype's)

    @property
    def pool_dtype(self) -> str:
        return self.kv_dtype or self.dtype

    @property
    def label(self) -> str:
        return f"{self.kernel}:{self.impl}"


class Crossover(NamedTuple):
    """Where A stops losing to B at one top-k: the grid row count and a log-log interpolated estimate."""

    layout: str
    topk: int
    rows: int | None  # smallest grid row count from which A/B <= threshold at every larger count
    estimate: float | None  # interpolated between the two grid points around the crossing
    a_always: bool  # A was no slower even at the smallest row count
    below: int | None = None  # the grid row count just before ``rows``, where A was still slower


class GateAdvice(NamedTuple):
    """The gate the sweep recommends: route to A for rows >= gate (a power of two, so a bucket edge)."""

    gate: int | None
    reason: str
    never: tuple[int, ...]  # top-k values at which A never caught up within the grid


# A/B ratios within this fraction of 1 count as "A no slower". Above a few hundred rows the two kernels
# run the same tile loop and differ by a few percent either way; a gate must not move on that.
TOLERANCE = 0.05


def next_pow2(n: float) -> int:
    """Smallest power of two >= n."""
    return 1 if n <= 1 else 1 << math.ceil(math.log2(n))


def rows_between(lo: int, hi: int) -> list[int]:
    """Powers of two strictly between ``lo`` and ``hi``, a factor of 4 apart (from 4 x lo): the row counts a
    coarse grid should add around a crossing (16, 16384 -> 64, 256, 1024, 4096). Empty when at most 4 apart."""
    out, r = [], next_pow2(lo * 4)
    while r < hi:
        out.append(r)
        r *= 4
    return out


def ratio_table(results: list[Result], a: str, b: str, layout: str) -> dict[tuple[int, int], float]:
    """{(rows, topk): median(A) / median(B)} for one layout, where both were timed."""
    med: dict[tuple[str, int, int], float] = {}
    for r in results:
        if r.layout == layout:
            med[(r.label, r.rows, r.topk)] = r.median_us
    out = {}
    for (label, rows, topk), t_a in med.items():
        if label != a:
            continue
        t_b = med.get((b, rows, topk))
        if t_b is not None and t_b > 0:
            out[(rows, topk)] = t_a / t_b
    return out


def crossover(ratios: dict[int, float], *, layout: str = "", topk: int = 0, threshold: float = 1.0) -> Crossover:
    """Smallest row count from which A/B stays <= threshold; interpolated in log rows and log ratio."""
    rows = sorted(ratios)
    if not rows:
        return Crossover(layout, topk, None, None, False)
    first = None
    for i in range(len(rows) - 1, -1, -1):
        if ratios[rows[i]] <= threshold:
            first = i
        else:
            break
    if first is None:
        return Crossover(layout, topk, None, None, False)
    if first == 0:
        return Crossover(layout, topk, rows[0], float(rows[0]), True)
    r0, r1 = rows[first - 1], rows[first]
    y0, y1 = math.log(ratios[r0] / threshold), math.log(ratios[r1] / threshold)
    x0, x1 = math.log(r0), math.log(r1)
    est = math.exp(x0 + (0.0 - y0) * (x1 - x0) / (y1 - y0)) if y1 != y0 else float(r1)
    return Crossover(layout, topk, r1, est, False, r0)


def crossovers(table: dict[tuple[int, int], float], layout: str, threshold: float = 1.0) -> list[Crossover]:
    """One Crossover per top-k of a ratio table."""
    by_topk: dict[int, dict[int, float]] = {}
    for (rows, topk), ratio in table.items():
        by_topk.setdefault(topk, {})[rows] = ratio
    return [crossover(by_topk[k], layout=layout, topk=k, threshold=threshold) for k in sorted(by_topk)]


def recommend_gate(found: list[Crossover], tolerance: float = 0.0) -> GateAdvice:
    """Gate at the largest grid crossover (A then wins at every fanout seen), rounded up to a power of two."""
    never = tuple(sorted({c.topk for c in found if c.rows is None}))
    hits = [c for c in found if c.rows is not None]
    if not hits:
        return GateAdvice(None, "A never reaches B's speed in this grid: keep every call on B", never)
    worst = max(hits, key=lambda c: c.rows)
    gate = next_pow2(worst.rows)
    within = f" (within {tolerance:.0%})" if tolerance else ""
    reason = (
        f"rows >= {gate}: A is no slower than B{within} from {worst.rows} rows at every fanout timed "
        f"(last to cross: top-k {worst.topk}, layout {worst.layout}"
        + (f", interpolated crossing near {worst.estimate:.0f} rows)" if worst.estimate else ")")
    )
    # The default grid steps 16 -> 256 at its widest below 1024; a crossing in a wider step than that
    # (a hand-picked coarse grid, e.g. rows 2,16,16384) leaves the gate up to the wider step's top.
    between = rows_between(worst.below, worst.rows) if worst.below and worst.rows > 16 * worst.below else []
    if between:
        reason += (f"; the grid has no row count between {worst.below} and {worst.rows}, so the gate is only as "
                   f"close as that: time rows {','.join(map(str, between))} too to place it closer")
    if never:
        reason += f"; A never caught up at top-k {', '.join(map(str, never))}, which the gate does not cover"
    return GateAdvice(gate, reason, never)


def ratio_rows(table: dict[tuple[int, int], float]) -> tuple[list[str], list[list[str]]]:
    """The seed's layout: a header ("Rows", "Fanout 128", ...) and one line per row count."""
    rows = sorted({r for r, _ in table})
    topks = sorted({k for _, k in table})
    header = ["Rows"] + [f"Fanout {k}" for k in topks]
    lines = [[str(r)] + [f"{table[(r, k)]:.2f}" if (r, k) in table else "-" for k in topks] for r in rows]
    return header, lines


def _mb(n: float) -> str:
    mb = n / (1 << 20)
    return f"{mb:.1f}" if mb < 10 else f"{mb:.0f}"


def pool_note(results: list[Result], l2_bytes: int | None) -> str | None:
    """Where the timed points' kv pools sit against the GPU's L2, in a sentence; None without an L2 or results.

    The sweep's default pool (``grid.default_kv_len``) fits in an H200's L2 (60 MiB, as the device
    reports it), so kv rows a call gathers more than once come from L2 after the first time; a serving
    pool of long contexts does not fit, and there every gather goes to HBM, which moves the kernels'
    times and the ratios near the gate (docs/benchmarks.md, "kv pools: L2-sized and HBM-sized").
    """
    if not l2_bytes or not results:
        return None
    sizes = [r.kv_len * r.head_dim * getattr(torch, r.pool_dtype).itemsize for r in results]
    lo, hi = min(sizes), max(sizes)
    span = f"{_mb(lo)} MiB" if _mb(lo) == _mb(hi) else f"{_mb(lo)}-{_mb(hi)} MiB"
    l2 = f"{_mb(l2_bytes)} MiB"
    if hi <= l2_bytes:
        return (f"kv pool {span}, inside this GPU's {l2} L2 at every point: rows gathered again in a call come "
                f"from L2. A serving pool of long contexts does not fit; --kv-len 1048576 times gathers from HBM.")
    if lo > l2_bytes:
        return f"kv pool {span}, past this GPU's {l2} L2 at every point: the gathers come from HBM, as in serving."
    return f"kv pool {span} against this GPU's {l2} L2: inside it at some points, past it at others."


# What a CUDA event pair adds to the kernel time it brackets on an H200: 3 to 3.7 µs for a one- or
# two-kernel call, about 4.3 µs graph-replayed (docs/benchmarks.md, "Clocks: kernel time and the event pair").
EVENT_PAIR_COST_US = 3.7
FIDELITY_BOUND = 0.10  # telemetry's latency bound against CUPTI (docs/benchmarks.md, "Timing fidelity")


def event_floor_us(bound: float = FIDELITY_BOUND, cost_us: float = EVENT_PAIR_COST_US) -> float:
    """The shortest event-pair reading whose pair cost stays within ``bound`` of the kernel time under it."""
    return cost_us * (1.0 + bound) / bound


def timer_note(results: list[Result]) -> str | None:
    """Which event-pair readings are too short to be within 10% of kernel time, in a sentence; None if none.

    The pair's own 3-4 µs is a constant, so a reading under ``event_floor_us()`` (about 41 µs) cannot
    be within 10% of the kernel time it brackets: decode-sized calls, and small prefills. The ratios
    still compare A and B at one level (both carry the pair), but the figures are not kernel time;
    ``--timer cupti`` times them faithfully.
    """
    paired = [r for r in results if r.timer in ("cuda-events", "cuda-graph")]
    floor = event_floor_us()
    short = [r for r in paired if r.median_us < floor]
    if not short:
        return None
    rows = sorted({r.rows for r in short})
    shown = ", ".join(str(n) for n in rows[:8]) + (", ..." if len(rows) > 8 else "")
    return (f"{len(short)} of {len(paired)} event-pair readings are under {floor:.0f} µs (rows {shown}), where the "
            f"pair's own ~{EVENT_PAIR_COST_US:g} µs is more than {FIDELITY_BOUND:.0%} of the kernel time: those "
            f"figures are not kernel time (ratios between kernels timed alike still hold). --timer cupti times "
            f"them faithfully.")

