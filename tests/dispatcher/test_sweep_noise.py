"""No gate from noise: a sweep recommends one only where every A and B point's spread is within its tolerance."""

from __future__ import annotations

from dispatcher.sweep.analysis import Result
from dispatcher.sweep.noise import MIN_REPEATS, noisy_points, spread
from dispatcher.sweep.report import document, markdown

A, B = "intree.ragged_prefill:torch", "intree.sparse_decode:torch"


def point(label: str, rows: int, us: float, *, spread_pct: float = 1.0, repeats: int = 30,
          timer: str = "cuda-events") -> Result:
    kernel, impl = label.split(":")
    half = us * spread_pct / 100
    return Result(kernel, impl, "512+64", rows, 2048, 16, 576, 512, 64, "bfloat16", 8192, us, us - half, us + half,
                  us - half, repeats, timer)


def grid(**noisy: float) -> list[Result]:
    """A crosses B at 512 rows; ``noisy`` gives a spread (%) to A's point at rows ``r<N>``."""
    out = []
    for rows, a_us, b_us in ((16, 30.0, 10.0), (256, 60.0, 50.0), (512, 80.0, 90.0), (2048, 200.0, 400.0)):
        out.append(point(A, rows, a_us, spread_pct=noisy.get(f"r{rows}", 1.0)))
        out.append(point(B, rows, b_us))
    return out


def doc_of(results: list[Result], tolerance: float = 0.05) -> dict:
    return document(results, a=A, b=B, layouts=["512+64"], device="test", command="routescope sweep", tolerance=tolerance)


def test_a_quiet_sweep_recommends_its_gate():
    doc = doc_of(grid())
    assert doc["recommendation"]["gate"] == 512 and doc["noisy"] == []


def test_one_noisy_point_withholds_the_gate_and_names_the_point_and_the_fix():
    doc = doc_of(grid(r256=40.0))
    rec = doc["recommendation"]
    assert rec["gate"] is None
    assert rec["reason"].startswith("none: 1 of 8 timed points spread wider than the 5% tolerance")
    assert f"{A} rows 256 top-k 2048 layout 512+64 ±40%" in rec["reason"]
    assert "--repeats 120, now 30" in rec["reason"] and "a GPU" not in rec["reason"]  # it ran on one
    assert doc["noisy"] == [{"label": A, "layout": "512+64", "rows": 256, "topk": 2048, "spread": 0.4, "repeats": 30}]
    assert "**No recommended gate:** none: 1 of 8" in markdown(grid(r256=40.0), doc)


def test_a_wider_tolerance_takes_that_noise():
    assert doc_of(grid(r256=4.0), tolerance=0.05)["recommendation"]["gate"] == 512
    assert doc_of(grid(r256=8.0), tolerance=0.05)["recommendation"]["gate"] is None
    assert doc_of(grid(r256=8.0), tolerance=0.10)["recommendation"]["gate"] == 512


def test_on_the_cpu_the_fix_names_a_gpu_and_too_few_calls_are_noise():
    few = [r._replace(repeats=MIN_REPEATS - 1, timer="host") for r in grid()]
    rec = doc_of(few)["recommendation"]
    assert rec["gate"] is None and "8 of 8" in rec["reason"] and f"({MIN_REPEATS - 1} timed calls)" in rec["reason"]
    assert "a GPU (this ran on the CPU" in rec["reason"]


def test_the_worst_come_first_and_kernels_outside_the_ratio_are_not_judged():
    other = point("intree.sparse_decode:triton", 16, 5.0, spread_pct=90.0)
    found = noisy_points([*grid(r16=20.0, r2048=60.0), other], (A, B), 0.05)
    assert [(p.rows, round(p.spread, 2)) for p in found] == [(2048, 0.6), (16, 0.2)]
    assert spread(point(A, 1, 100.0, spread_pct=10.0)) == 0.1
