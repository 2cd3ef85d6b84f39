"""From process states to what people and the service read: merged cells, bands, saving, crossover, stops. Pure.

Every process of a multiprocess directory (and every rank) writes its own state; ``merge`` adds their cells up
(moments merge exactly, ``stats.Moments.merge``), and ``view`` makes the ``GET /experiments`` item of the issue's
contract: id, candidate, fraction, state, stop_reason, cells, saving, plus history, prediction per cell, crossover,
never-moved counts and the numerics tally.
"""

from __future__ import annotations

from collections.abc import Iterable

from .config import ExperimentConfig
from .stats import ALPHA, Moments, calls_needed, crossover, pooled, ratio, saving

STATE_ORDER = {"running": 0, "finished": 1, "stopped": 2}  # merged state: the most final any process reached


def bounds(cell: dict) -> tuple[float, float]:
    """(A's, B's) clock bound in seconds: the most each arm's mean reading may lie off its kernels' time."""
    return float(cell.get("bound_a_s") or 0.0), float(cell.get("bound_b_s") or 0.0)


def _ratio_fields(a: Moments, b: Moments, bound: tuple[float, float]) -> dict:
    r = ratio(a, b, bound_a=bound[0], bound_b=bound[1])
    return {"ratio": r.ratio, "ratio_low": r.low, "ratio_high": r.high, "mean_a_s": r.mean_a, "mean_b_s": r.mean_b,
            "cuped": r.cuped, "ratio_low_stat": r.stat_low, "ratio_high_stat": r.stat_high,
            "clock_bound_s": {"a": bound[0], "b": bound[1]}}


def cell_view(cell: dict) -> dict:
    """One merged cell in the contract's shape (and a few fields beside it): the band holds the statistical band
    and the clock's bound (``ratio_low_stat``/``ratio_high_stat``: the statistical band alone)."""
    a, b = Moments.of(cell["a"]), Moments.of(cell["b"])
    return {"model": cell["model"], "rows_bucket": cell["rows_bucket"], "kernel_a": cell["kernel_a"],
            "kernel_b": cell["kernel_b"], "calls_a": cell["calls_a"], "calls_b": cell["calls_b"], "timed_a": a.n,
            "timed_b": b.n, **_ratio_fields(a, b, bounds(cell)), "shape": cell["shape"],
            "call_class": cell["call_class"], "prediction": prediction_view(cell.get("prediction")),
            "numerics": {"checked": cell.get("checked", 0), "mismatched": cell.get("mismatched", 0)}}


def prediction_view(prediction: dict | None) -> dict:
    """advise's predicted B/A for a cell with advise's band (``covariate.Predictor.for_cell``); every key present,
    None where no table prices the cell (``reason`` says why)."""
    out = {"ratio": None, "ratio_low": None, "ratio_high": None, "reason": "not priced", "tables": [], "notes": []}
    out.update(prediction or {})
    return out


def extra_seconds(cells: Iterable[dict]) -> tuple[float, float]:
    """(B's extra kernel time so far, the eligible calls' kernel time so far), in seconds, from the means."""
    extra = total = 0.0
    for cell in cells:
        a, b = Moments.of(cell["a"]), Moments.of(cell["b"])
        if a.n == 0:
            continue
        mean_b = b.mean_y if b.n else a.mean_y
        extra += cell["calls_b"] * (mean_b - a.mean_y)
        total += cell["calls_a"] * a.mean_y + cell["calls_b"] * mean_b
    return extra, total


def budget_seconds(config: ExperimentConfig, total: float, elapsed: float) -> float:
    """The budget in seconds: ``budget`` x the eligible calls' kernel time projected over the window."""
    scale = config.window_s / elapsed if 0 < elapsed < config.window_s else 1.0
    return config.budget * total * scale


def stops_from(config: ExperimentConfig, cells: list[dict], elapsed: float) -> str | None:
    """The reason to stop now, or None: harm (a cell's band above 1 + harm bound), then budget."""
    for cell in cells:
        a, b = Moments.of(cell["a"]), Moments.of(cell["b"])
        if min(a.n, b.n) < config.min_samples:
            continue
        bound_a, bound_b = bounds(cell)
        r = ratio(a, b, bound_a=bound_a, bound_b=bound_b)
        if r.low is not None and r.low > 1.0 + config.harm_bound:
            return "harm"
    extra, total = extra_seconds(cells)
    if extra > 0 and extra > budget_seconds(config, total, elapsed):
        return "budget"
    return None


def merge(states: list[dict]) -> dict:
    """One state from every process's state of the same experiment."""
    if not states:
        raise ValueError("nothing to merge")
    first = states[0]
    cells: dict[str, dict] = {}
    never: dict[str, int] = {}
    out = {"config": first["config"], "state": "running", "stop_reason": None, "end_reason": None,
           "started_at": min(s["started_at"] for s in states), "ended_at": None, "ineligible": 0, "b_failures": 0,
           "last_error": None, "clock_dropped": 0, "processes": len(states)}
    for s in states:
        if STATE_ORDER[s["state"]] > STATE_ORDER[out["state"]]:
            out["state"], out["stop_reason"], out["end_reason"] = s["state"], s["stop_reason"], s["end_reason"]
        if s.get("ended_at") is not None:
            out["ended_at"] = max(out["ended_at"] or 0.0, s["ended_at"])
        out["ineligible"] += s.get("ineligible", 0)
        out["b_failures"] += s.get("b_failures", 0)
        out["clock_dropped"] += s.get("clock_dropped", 0)
        out["last_error"] = out["last_error"] or s.get("last_error")
        for reason, n in s.get("never_moved", {}).items():
            never[reason] = never.get(reason, 0) + n
        for c in s["cells"]:
            have = cells.get(c["name"])
            if have is None:
                cells[c["name"]] = dict(c)
                continue
            for field in ("calls_a", "calls_b", "checked", "mismatched"):
                have[field] = have.get(field, 0) + c.get(field, 0)
            for field in ("bound_a_s", "bound_b_s"):
                have[field] = max(have.get(field) or 0.0, c.get(field) or 0.0)
            for arm in ("a", "b"):
                have[arm] = list(Moments.of(have[arm]).merge(Moments.of(c[arm])).as_tuple())
    out["cells"] = list(cells.values())
    out["never_moved"] = never
    out["history"] = merge_history([s.get("history", []) for s in states])
    return out


def merge_history(per_process: list[list]) -> list:
    """Cumulative cell moments at each flush time: at time T, each process's last point at or before T, added."""
    times = sorted({round(point[0], 1) for points in per_process for point in points})
    out = []
    for t in times[-60:]:
        cells: dict[str, list] = {}
        for points in per_process:
            last = None
            for point in points:
                if round(point[0], 1) <= t:
                    last = point
            if last is None:
                continue
            for name, calls_a, calls_b, a, b in last[1]:
                have = cells.get(name)
                if have is None:
                    cells[name] = [name, calls_a, calls_b, a, b]
                else:
                    have[1] += calls_a
                    have[2] += calls_b
                    have[3] = list(Moments.of(have[3]).merge(Moments.of(a)).as_tuple())
                    have[4] = list(Moments.of(have[4]).merge(Moments.of(b)).as_tuple())
        out.append((t, list(cells.values())))
    return out


def _weighted(c: dict) -> tuple:
    return (c["calls_a"] + c["calls_b"], Moments.of(c["a"]), Moments.of(c["b"]), *bounds(c))


def verdict(low: float | None, high: float | None) -> str:
    """``no_worse`` (the band at or below 1), ``worse`` (above 1), else ``undecided`` (no band, or it holds 1)."""
    if high is not None and high <= 1.0:
        return "no_worse"
    if low is not None and low > 1.0:
        return "worse"
    return "undecided"


def buckets(cells: list[dict], fraction: float | None = None) -> list[dict]:
    """Moved cells pooled per rows bucket (across models, shapes and call classes, weighted by their calls): B/A of
    the bucket's kernel time over the traffic seen, with a band (the clocks' bounds in it), and its verdict. What a
    gate, which sees only rows, is judged on. An undecided bucket says about how many of its calls, at this
    fraction, would decide it (``stats.calls_needed``), or why none would."""
    groups: dict[tuple, list[dict]] = {}
    for c in cells:
        if c["kernel_a"] != c["kernel_b"]:
            groups.setdefault((c["lo"], c["hi"], c["rows_bucket"]), []).append(c)
    out = []
    for (lo, hi, label), members in sorted(groups.items(), key=lambda item: item[0][0]):
        weighted = [_weighted(c) for c in members]
        r = pooled(weighted)
        calls = sum(w[0] for w in weighted)
        timed = sum(w[0] for w in weighted if min(w[1].n, w[2].n) >= 2)
        decided = verdict(r.low, r.high)
        need = calls_needed(r, calls, timed) if decided == "undecided" else None
        out.append({"rows_bucket": label, "lo": lo, "hi": hi, "calls": calls, "cells": len(members),
                    "covered": timed / calls if calls else 0.0, "ratio": r.ratio, "ratio_low": r.low,
                    "ratio_high": r.high, "ratio_low_stat": r.stat_low, "ratio_high_stat": r.stat_high,
                    "pairs": r.pairs, "verdict": decided,
                    "calls_needed": need[0] if need else None, "needed_because": need[1] if need else None})
    return out


def view(merged: dict) -> dict:
    """The ``GET /experiments`` item for one merged experiment."""
    config = ExperimentConfig.model_validate(merged["config"])
    cells = [cell_view(c) for c in merged["cells"]]
    moments = [_weighted(c) for c in merged["cells"]]
    s = saving(moments)
    extra, total = extra_seconds(merged["cells"])
    elapsed = (merged["ended_at"] or 0.0) - merged["started_at"] if merged["ended_at"] else None
    by_name = {c["name"]: c for c in merged["cells"]}
    pooled_buckets = buckets(merged["cells"])
    moved = [(b["lo"], b["hi"], b["ratio_high"], b["ratio"]) for b in pooled_buckets]
    below = config.candidate.startswith("split_below_")
    cross = crossover(moved, below=below) if moved else None
    history = []
    for t, points in merged.get("history", []):
        entry = []
        for name, calls_a, calls_b, a, b in points:
            c = by_name.get(name)
            ba, bb = bounds(c) if c else (0.0, 0.0)
            r = ratio(Moments.of(a), Moments.of(b), bound_a=ba, bound_b=bb)
            entry.append({"model": c["model"] if c else None, "rows_bucket": c["rows_bucket"] if c else None,
                          "shape": c["shape"] if c else None, "call_class": c["call_class"] if c else None,
                          "calls_a": calls_a, "calls_b": calls_b, "timed_a": int(a[0]), "timed_b": int(b[0]),
                          "ratio": r.ratio, "ratio_low": r.low, "ratio_high": r.high})
        history.append({"t": t, "cells": entry})
    return {
        "id": config.id, "candidate": config.candidate, "fraction": config.fraction, "state": merged["state"],
        "stop_reason": merged["stop_reason"] if merged["state"] == "stopped" else None,
        "end_reason": merged.get("end_reason"), "started_at": merged["started_at"], "ended_at": merged["ended_at"],
        "elapsed_s": elapsed, "processes": merged.get("processes", 1),
        "cells": cells,
        "saving": {"seconds": s.seconds, "low": s.low, "high": s.high},
        "crossover": crossover_view(pooled_buckets, cross, below),
        "buckets": pooled_buckets,
        "budget": {"extra_s": extra, "eligible_s": total, "share": config.budget, "window_s": config.window_s},
        "never_moved": merged["never_moved"], "ineligible": merged.get("ineligible", 0),
        "b_failures": merged.get("b_failures", 0), "last_error": merged.get("last_error"),
        "clock_dropped": merged.get("clock_dropped", 0), "alpha": ALPHA,
        "config": merged["config"], "history": history,
    }


def crossover_view(pooled_buckets: list[dict], rows: int | None, below: bool) -> dict:
    """The measured crossover and whether the traffic decided it: the run of buckets that sets it ends either at a
    bucket whose band shows B worse (decided) or at one too thin to show either (undecided: ``rows`` is then the
    conservative answer, and ``undecided`` names the bucket and the calls it needs)."""
    order = sorted(pooled_buckets, key=lambda b: b["lo"])
    if not below:
        order = order[::-1]
    stop = next((b for b in order if b["verdict"] != "no_worse"), None)
    return {"rows": rows,
            "rule": "largest edge below which every moved rows bucket's band is <= 1" if below else
            "smallest edge from which every moved rows bucket's band is <= 1",
            "decided": stop is None or stop["verdict"] == "worse",
            "undecided": None if stop is None or stop["verdict"] == "worse" else
            {"rows_bucket": stop["rows_bucket"], "calls": stop["calls"], "calls_needed": stop["calls_needed"],
             "needed_because": stop["needed_because"]}}
