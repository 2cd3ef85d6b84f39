"""The bracket graph clock on a real CUDA GPU (marker gpu): graph replays of kernels that write no stamps (the
project's kernels with their stamps withheld, standing in for vLLM's and AITER's) read within 10% of CUPTI's span of
the same calls, median and p90, at 2 and 16 rows on split-K and 2, 16, 256 and 4,096 rows on the prefill kernel, in
graphs of 1 and of 8 calls, synced and back to back; each bracket costs at most ``MAX_GPU_US_PER_BRACKET`` of GPU time
inside a replay, against a bare graph of the same calls in interleaved rounds, wherever those rounds resolve it
(docs/timing-fidelity.md, *What a timed call costs*).
The CPU tests of the same logic are tests/telemetry/clocks/test_bracket.py (through tests/telemetry/cuda_double.py);
the plugin's capture path on the GPU is tests/vllm_plugin/test_gpu_graph_clock.py."""

from __future__ import annotations

import pytest

from telemetry.bench.graph_fidelity import CASES, COST_GOAL_US, run

pytestmark = pytest.mark.gpu

# The aim is COST_GOAL_US (2 µs a bracket). The bench (docs/timing-fidelity.md) read 0.65-2.26 µs at
# 2-256 rows, above 2 µs at 3 of 10 points (2.04-2.26), where two empty kernel nodes cost 1.35-2.45 µs: this bound
# catches a bracket that loses PDL (1.3-2.7 µs without it) or gains a node (+0.7 µs or more), not the aim.
MAX_GPU_US_PER_BRACKET = 2.5
RESOLVED_US = 1.0  # rounds spread wider than this cannot tell 2 µs from 3 (4,096 rows: 1.25-10 ms replays)
REPLAYS = 40  # per regime: synced replays, or back-to-back bursts (each read once per bracket)


@pytest.mark.parametrize("case", CASES, ids=[f"{rows}-rows-{label.replace(' ', '-')}" for label, _, rows in CASES])
def test_bracketed_graph_replays_read_within_ten_percent_of_cupti(case):
    result = run(cases=(case,), clocks=("bracket",), replays=REPLAYS)
    points = result["points"]
    assert {(p["calls"], p["regime"]) for p in points} == {(1, "synced"), (1, "back_to_back"), (8, "synced"),
                                                          (8, "back_to_back")}
    assert all(p["samples"] >= REPLAYS // 2 * p["calls"] for p in points), [(p["calls"], p["regime"], p["samples"])
                                                                           for p in points]
    bad = [p for p in points if not p.get("within_bound")]
    assert not bad, bad
    costs = [(c["rows"], c["calls"], round(c["gpu_us_per_timed_call"], 2), c["gpu_us_per_timed_call_range"],
              c.get("aa_gpu_us_per_call")) for c in result["costs"]]
    resolved = [c for c in costs if c[3][1] - c[3][0] <= RESOLVED_US]
    assert case[2] >= 4096 or len(resolved) == len(costs), costs  # below 4,096 rows the rounds agree
    assert all(cost <= MAX_GPU_US_PER_BRACKET for _, _, cost, _, _ in resolved), (COST_GOAL_US, costs)
    assert all(200 <= ns <= 5_000 for ns in result["bracket_constant_ns"]), result["bracket_constant_ns"]
