"""bench fidelity's reference on CPU: CUPTI's kernel time of a call counts the call's own kernels, not the gate's wait
that telemetry enqueues inside the call's range (the spans are made by hand; the GPU run is tests/telemetry/test_gpu_real.py)."""

from __future__ import annotations

from dispatcher.sweep.cupti import Span, call_name
from telemetry.bench.fidelity import kernel_seconds, unstamped_registry


def test_the_gates_wait_is_left_out_of_a_calls_kernel_time():
    found = [
        Span(call_name(0), True, 100.0, 160.0),  # the call's GPU range: the wait, then the kernel
        Span("gate_wait", True, 100.0, 150.0),
        Span("sparse_prefill_kernel", True, 151.0, 160.0),
        Span(call_name(1), True, 200.0, 215.0),  # a call with no wait (plain pair), two kernels
        Span("sparse_prefill_kernel", True, 200.0, 205.0),
        Span("reduce_kernel", True, 207.0, 215.0),
        Span(call_name(2), True, 300.0, 340.0),  # only the wait ran inside the range: no kernel time
        Span("gate_wait", True, 300.0, 340.0),
    ]
    got = kernel_seconds(found)
    assert set(got) == {0, 1}
    assert abs(got[0] - 9e-6) < 1e-12 and abs(got[1] - 15e-6) < 1e-12


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
