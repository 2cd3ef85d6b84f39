"""bench fidelity's reference on CPU: CUPTI's kernel time of a call counts the call's own kernels, not the gate's wait
or the bracket's stamps that telemetry enqueues around it (the spans are made by hand; the GPU runs are
tests/telemetry/test_gpu_real.py and tests/telemetry/test_gpu_graph_clock.py)."""

from __future__ import annotations

import pytest

from dispatcher.sweep.cupti import Span
from telemetry.bench.fidelity import call_spans_us, unstamped_registry


def test_each_calls_kernel_time_is_its_own_kernels_told_apart_by_position():
    """No CPU ranges (the reference runs without CPU tracing): the calls of a point run the same kernels in the same
    order, so the GPU's kernels in start order cut into equal runs are the calls; the gate's wait and the bracket's
    stamps are telemetry's and left out, as are copies."""
    found = [
        Span("cudaLaunchKernel", False, 90.0, 95.0),  # a CPU event, were any recorded
        Span("gate_wait", True, 100.0, 150.0),
        Span("split_partial_kernel", True, 151.0, 156.0),
        Span("split_reduce_kernel", True, 157.0, 160.0),
        Span("Memcpy HtoD (Pinned -> Device)", True, 170.0, 171.0),
        Span("graph_stamp", True, 199.0, 200.0),
        Span("split_partial_kernel", True, 200.0, 205.0),
        Span("split_reduce_kernel", True, 207.0, 215.0),
        Span("graph_stamp", True, 215.5, 216.0),
    ]
    assert call_spans_us(found, 2, ("gate_wait", "graph_stamp")) == [9.0, 15.0]
    with pytest.raises(ValueError, match="cannot be told apart"):
        call_spans_us(found, 3, ("gate_wait", "graph_stamp"))
    assert call_spans_us(found[:5], 1) == [9.0], "the gate's wait is left out by default"


def test_the_unstamped_registry_withholds_every_stamp_and_keeps_every_implementation():
    from dispatcher.kernels.registry import default_registry
    from dispatcher.types import Kernel

    seen = []
    registry = unstamped_registry()
    for kernel in Kernel:
        assert [i.impl for i in registry.impls(kernel)] == [i.impl for i in default_registry().impls(kernel)]
    impl = registry.impls(Kernel.INTREE_RAGGED_PREFILL)[-1]
    args = type("Args", (), {"_replace": lambda self, **kw: seen.append(kw) or "args without stamp"})()
    try:
        impl.launch(args)
    except Exception:  # noqa: BLE001 - the torch launch cannot run on a stand-in; what it was handed is the point
        pass
    assert seen == [{"stamp": None}]


def test_a_printed_row_adds_up():
    """The printed error is the printed telemetry figure against the printed CUPTI one (to their rounding), the
    bound column agrees with both errors, and n says how many readings each side's quantiles came from."""
    import random

    from telemetry.bench.fidelity import BOUND_PCT, figures, point_cells

    rng = random.Random(3)
    for scale in (1.0, 1.04, 1.3):
        ref = [rng.uniform(7.0, 9.0) for _ in range(60)]
        got = [x * scale + rng.uniform(-0.2, 0.2) for x in ref[:57]]
        cells = point_cells({"rows": 16, "regime": "idle", "clocks": ["device"], **figures(got, ref)})
        assert cells[:4] == ["16", "idle", "device", "57/60"]
        for t, c, err in ((cells[4], cells[5], cells[6]), (cells[7], cells[8], cells[9])):
            t, c, err = float(t), float(c), float(err.rstrip("%"))
            assert abs(err - 100 * (t - c) / c) <= 100 * 0.05 / c * 2 + 0.05
        errors = [abs(float(cells[6].rstrip("%"))), abs(float(cells[9].rstrip("%")))]
        assert cells[10] == ("yes" if max(errors) <= BOUND_PCT else "NO") or abs(max(errors) - BOUND_PCT) < 0.1
