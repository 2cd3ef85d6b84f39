"""Whether a sweep measured well enough to place a gate: each timed point's spread against the tolerance. Pure.

A gate moves calls between kernels on A/B ratios compared with 1 + tolerance; a point whose own
spread is wider than that tolerance could sit on either side of it, so no gate is recommended from a
sweep with such points. The spread is half the p20-p80 range over the median (what the tables show as
±); a point timed fewer than ``MIN_REPEATS`` times has no measured spread at all, and counts as noisy.
"""

from __future__ import annotations

from typing import NamedTuple

from .analysis import TOLERANCE, GateAdvice, Result

MIN_REPEATS = 5  # fewer timed calls give no p20-p80 range worth the name
SHOWN = 6  # noisy points named in the sentence (all of them are in the JSON)


class NoisyPoint(NamedTuple):
    """A timed point too noisy to place a gate on: which kernel, where, its spread and how often it ran."""

    label: str
    layout: str
    rows: int
    topk: int
    spread: float  # half the p20-p80 range over the median, as a fraction (0.5: ±50%)
    repeats: int


def spread(r: Result) -> float:
    """Half the p20-p80 range over the median, as a fraction; infinite for a zero median."""
    return (r.p80_us - r.p20_us) / 2 / r.median_us if r.median_us > 0 else float("inf")


def noisy_points(results: list[Result], labels: tuple[str, ...], tolerance: float) -> list[NoisyPoint]:
    """The points of the ratio's kernels whose spread is past ``tolerance`` or unmeasured; worst first."""
    out = [NoisyPoint(r.label, r.layout, r.rows, r.topk, spread(r), r.repeats)
           for r in results if r.label in labels and (r.repeats < MIN_REPEATS or spread(r) > tolerance)]
    return sorted(out, key=lambda p: (p.repeats >= MIN_REPEATS, -p.spread, p.layout, p.rows, p.topk, p.label))


def _point(p: NoisyPoint) -> str:
    if p.repeats < MIN_REPEATS:
        return f"{p.label} rows {p.rows} top-k {p.topk} ({p.repeats} timed call{'s' * (p.repeats != 1)})"
    return f"{p.label} rows {p.rows} top-k {p.topk} layout {p.layout} ±{p.spread:.0%}"


def noise_advice(noisy: list[NoisyPoint], *, points: int, tolerance: float, repeats: int, on_gpu: bool,
                 measured: GateAdvice) -> GateAdvice:
    """No gate, and why: how many points are noisy, the worst of them, and what would fix it."""
    fixes = [f"more timed calls (--repeats {max(repeats * 4, 30)}, now {repeats})"]
    if not on_gpu:
        fixes.append("a GPU (this ran on the CPU, whose times are not the kernels' on an accelerator)")
    fixes.append(f"or a wider --tolerance than {tolerance:g} if that much noise is acceptable")
    reason = f"none: {noise_sentence(noisy, points, tolerance)}. Fix: {', '.join(fixes)}"
    return GateAdvice(None, reason, measured.never)


def noisy_in_document(doc: dict) -> tuple[list[NoisyPoint], float]:
    """A sweep JSON's noisy points (its A and B, or every kernel in a file that names none) and its tolerance.

    Read from the results themselves, so a file written before the sweep judged its noise is judged alike.
    """
    tolerance = float(doc.get("tolerance") or TOLERANCE)
    results = []
    for r in doc.get("results") or ():
        try:
            median, p20, p80 = float(r["median_us"]), float(r.get("p20_us") or r["median_us"]), float(
                r.get("p80_us") or r["median_us"])
            results.append(NoisyPoint(f"{r['kernel']}:{r.get('impl') or ''}", str(r.get("layout", "")),
                                      int(r["rows"]), int(r["topk"]),
                                      (p80 - p20) / 2 / median if median > 0 else float("inf"),
                                      int(r.get("repeats") or MIN_REPEATS)))
        except (KeyError, TypeError, ValueError):
            continue  # a malformed row is the table loader's to report
    labels = {doc.get("a"), doc.get("b")} - {None}
    noisy = [p for p in results if (not labels or p.label in labels)
             and (p.repeats < MIN_REPEATS or p.spread > tolerance)]
    return sorted(noisy, key=lambda p: (p.repeats >= MIN_REPEATS, -p.spread, p.layout, p.rows, p.topk)), tolerance


def noise_sentence(noisy: list[NoisyPoint], points: int, tolerance: float) -> str:
    """"3 of 32 timed points spread wider than the 5% tolerance ...: the worst of them"."""
    shown = "; ".join(_point(p) for p in noisy[:SHOWN]) + (f"; {len(noisy) - SHOWN} more" if len(noisy) > SHOWN
                                                            else "")
    return (f"{len(noisy)} of {points} timed points spread wider than the {tolerance:.0%} tolerance, or were timed "
            f"too few times to tell: {shown}")
