"""Contract-shaped experiment documents (GET /experiments' list) for the surface's tests: input data, not a core.

``cells`` are the seed's MI325X AITER/in-tree ratios by rows x top-k (the seed PR's table), so a rendering
shows the format a reader knows; the band and counts are made up and named so.
"""

from __future__ import annotations

import copy
from typing import Any

SEED_RATIOS = {  # rows -> {top-k: AITER time / in-tree time}, from the seed PR (one MI325X, H=16, D=512, bf16)
    "256-511": {128: 1.04, 512: 0.88, 2048: 0.84},
    "512-1023": {128: 0.64, 512: 0.49, 2048: 0.46},
    "1024-2047": {128: 0.43, 512: 0.32, 2048: 0.30},
}


def cell(model: str, rows: str, topk: int | None, ratio: float | None, *, width: float = 0.05,
         predicted: float | None = None, calls_b: int = 40) -> dict[str, Any]:
    out: dict[str, Any] = {
        "model": model, "rows_bucket": rows, "kernel_a": "intree.ragged_prefill", "kernel_b": "aiter.pa_prefill_sparse",
        "calls_a": calls_b * 99, "calls_b": calls_b, "timed_a": calls_b, "timed_b": calls_b,
        "ratio": ratio, "ratio_low": None if ratio is None else round(ratio - width, 4),
        "ratio_high": None if ratio is None else round(ratio + width, 4),
    }
    if topk is not None:
        out["topk"] = topk
    if predicted is not None:
        out["prediction"] = {"ratio": predicted, "low": round(predicted * 0.9, 4), "high": round(predicted * 1.1, 4)}
    return out


def seed_experiment(exp_id: str = "gate512", state: str = "running", stop_reason: str | None = None) -> dict[str, Any]:
    cells = [cell("GLM-5.3-Flash", rows, k, r, predicted=round(r * 1.05, 4))
             for rows, by_k in SEED_RATIOS.items() for k, r in by_k.items()]
    history = [{"ts": 1000.0 + 10 * i, "cells": [dict(c, ratio_low=c["ratio_low"] - 0.3 / (i + 1),
                                                       ratio_high=c["ratio_high"] + 0.3 / (i + 1)) for c in cells]}
               for i in range(6)]
    return {"id": exp_id, "candidate": "gfx942_512", "fraction": 0.05, "state": state, "stop_reason": stop_reason,
            "cells": cells, "saving": {"seconds": 0.42, "low": 0.30, "high": 0.55}, "history": history,
            "never_moved": {"captured": 12, "unavailable": 3}, "harm_bound": 0.05}


def aa_experiment() -> dict[str, Any]:
    """An A/A control stopped by itself (its band left 1: a false positive), with no top-k on its cells."""
    cells = [cell("DeepSeek-V4.1-Flash", "16384+", None, 1.08, width=0.02), cell("DeepSeek-V4.1-Flash", "4096-8191",
                                                                                 None, None, calls_b=0)]
    for c in cells:
        c["kernel_b"] = c["kernel_a"]
    return {"id": "aa", "candidate": "aa", "fraction": 0.01, "state": "stopped", "stop_reason": "harm",
            "cells": cells, "saving": {"seconds": None, "low": None, "high": None}}


def experiments() -> list[dict[str, Any]]:
    return copy.deepcopy([seed_experiment(), aa_experiment()])
