"""The bracket graph clock on a real CUDA GPU (marker gpu): graph replays of kernels that write no stamps (the
project's kernels with their stamps withheld, standing in for vLLM's and AITER's) read within 10% of CUPTI's span of
the same calls, median and p90, at 2 and 16 rows on split-K and 2, 16, 256 and 4,096 rows on the prefill kernel, in
graphs of 1 and of 8 calls, synced and back to back; each bracket costs at most ``COST_GOAL_US`` (2 µs) of GPU time
inside a replay, against a bare graph of the same calls in interleaved rounds (the event pair it replaces cost
2.7-4.6 µs).
The CPU tests of the same logic are tests/telemetry/clocks/test_bracket.py (through tests/telemetry/cuda_double.py);
the plugin's capture path on the GPU is tests/vllm_plugin/test_gpu_graph_clock.py."""

from __future__ import annotations

import pytest

from telemetry.bench.graph_fidelity import CASES, COST_GOAL_US, run

pytestmark = pytest.mark.gpu

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
    costly = [c for c in result["costs"] if c["gpu_us_per_timed_call"] > COST_GOAL_US]
    assert not costly, costly
    assert all(200 <= ns <= 5_000 for ns in result["bracket_constant_ns"]), result["bracket_constant_ns"]
