"""Experiment documents in the `GET /experiments` contract, as experiments.report.view makes them: input data for
the surface's tests (the page, the report, the series), not a stand-in for the core.

The gate experiment's ratios are the seed PR's MI325X table (AITER time / in-tree time by rows x top-k), so a
rendering shows the format its readers know; its bands, counts and history are made up and named so.
"""

from __future__ import annotations

import copy
from typing import Any

SEED_RATIOS = {  # rows bucket -> {top-k: AITER time / in-tree time}: the seed PR (one MI325X, H=16, D=512, bf16)
    "256-511": {128: 1.04, 512: 0.88, 2048: 0.84},
    "512-1023": {128: 0.64, 512: 0.49, 2048: 0.46},
    "1024-2047": {128: 0.43, 512: 0.32, 2048: 0.30},
}
GLM = "GLM-5.3-Flash"


def shape(topk: int) -> str:
    return f"512+0 h16 topk{topk} bfloat16/bfloat16"


def prediction(ratio: float | None) -> dict[str, Any]:
    """advise's prediction as experiments.report.prediction_view gives it; its band here is made up: +-10%."""
    if ratio is None:
        return {"ratio": None, "ratio_low": None, "ratio_high": None, "reason": "not priced", "tables": [], "notes": []}
    return {"ratio": ratio, "ratio_low": round(ratio * 0.9, 4), "ratio_high": round(ratio * 1.1, 4), "reason": None,
            "tables": ["gfx942-mi325x-published"], "notes": []}


def cell(model: str, rows: str, topk: int, ratio: float | None, *, width: float = 0.05,
         predicted: float | None = None, calls_b: int = 40, call_class: str = "prefill") -> dict[str, Any]:
    return {
        "model": model, "rows_bucket": rows, "kernel_a": "intree.ragged_prefill", "kernel_b": "aiter.pa_prefill_sparse",
        "calls_a": calls_b * 99, "calls_b": calls_b, "timed_a": calls_b, "timed_b": calls_b,
        "ratio": ratio, "ratio_low": None if ratio is None else round(ratio - width, 4),
        "ratio_high": None if ratio is None else round(ratio + width, 4), "shape": shape(topk),
        "call_class": call_class, "prediction": prediction(predicted),
        "numerics": {"checked": 1, "mismatched": 0},
    }


def seed_experiment(exp_id: str = "gate512", state: str = "running", stop_reason: str | None = None) -> dict[str, Any]:
    cells = [cell(GLM, rows, k, r, predicted=round(r * 1.05, 4)) for rows, by_k in SEED_RATIOS.items()
             for k, r in by_k.items()]
    keep = ("model", "rows_bucket", "shape", "call_class", "calls_a", "calls_b", "timed_a", "timed_b", "ratio")
    history = [{"t": 1000.0 + 10 * i, "cells": [
        {**{k: c[k] for k in keep}, "ratio_low": c["ratio_low"] - 0.3 / (i + 1), "ratio_high": c["ratio_high"] + 0.3 / (i + 1)}
        for c in cells]} for i in range(6)]
    return {"id": exp_id, "candidate": "gfx942_512", "fraction": 0.05, "state": state, "stop_reason": stop_reason,
            "cells": cells, "saving": {"seconds": 0.42, "low": 0.30, "high": 0.55}, "history": history,
            "crossover": {"rows": 512, "rule": "smallest edge from which every moved cell's band is <= 1"},
            "never_moved": {"capture": 12, "candidate_unavailable": 3}, "config": {"harm_bound": 0.05}}


def aa_experiment() -> dict[str, Any]:
    """An A/A control stopped by its kill switch (a band left 1: a false positive), one cell not yet timed."""
    cells = [cell("DeepSeek-V4.1-Flash", "16384+", 2048, 1.08, width=0.02),
             cell("DeepSeek-V4.1-Flash", "4096-8191", 2048, None, calls_b=0)]
    for c in cells:
        c["kernel_b"] = c["kernel_a"]
    return {"id": "aa", "candidate": "aa", "fraction": 0.01, "state": "stopped", "stop_reason": "harm",
            "cells": cells, "saving": {"seconds": None, "low": None, "high": None}, "history": [],
            "crossover": {"rows": None, "rule": ""}, "never_moved": {}, "config": {"harm_bound": 0.05}}


def experiments() -> list[dict[str, Any]]:
    return copy.deepcopy([seed_experiment(), aa_experiment()])
