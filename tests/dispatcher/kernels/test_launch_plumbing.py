"""The launch plumbing without a GPU: compiled handles kept by key and called directly, scratch per stream, plans per
call signature. (That the direct path gives the JIT's bits is tests/dispatcher/kernels/test_launch_gpu.py, gpu.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dispatcher.kernels import launcher, plan, scratch
from dispatcher.kernels.common import KernelArgs, SparseIndex


class FakeHandle:
    """Stands in for Triton's CompiledKernel: records what its launcher is given."""

    function, packed_metadata = "fn", "meta"

    def __init__(self) -> None:
        self.runs: list[tuple] = []

    def run(self, *a):
        self.runs.append(a)


class FakeKernel:
    """Stands in for a JIT function: params (runtime first), ``kernel[grid](...)`` returns a handle."""

    def __init__(self, params) -> None:
        self.params = [SimpleNamespace(name=n, is_constexpr=c, has_default=d is not None, default=d)
                       for n, c, d in params]
        self.jit_calls: list[tuple] = []
        self.handle = FakeHandle()

    def __getitem__(self, grid):
        def jit(*args, **consts):
            self.jit_calls.append((grid, args, consts))
            return self.handle
        return jit


def test_the_first_launch_compiles_through_the_jit_and_later_ones_run_the_handle():
    k = FakeKernel([("x", False, None), ("n", False, None), ("BLOCK", True, None), ("MODE", True, 7)])
    launcher.launch(k, "key", (4,), ("x", 3), {"BLOCK": 16, "num_warps": 4}, stream=99)
    launcher.launch(k, "key", (4, 2), ("y", 5), {"BLOCK": 16, "num_warps": 4}, stream=99)
    assert len(k.jit_calls) == 1
    assert k.handle.runs == [(4, 2, 1, 99, "fn", "meta", None, None, None, "y", 5, 16, 7)]  # constexprs: given, default
    launcher.launch(k, "other key", (1,), ("z", 1), {"BLOCK": 32}, stream=0)
    assert len(k.jit_calls) == 2, "another key: another specialisation, through the JIT"


def test_direct_off_or_constexprs_first_keep_every_launch_on_the_jit(monkeypatch):
    k = FakeKernel([("x", False, None), ("BLOCK", True, None)])
    monkeypatch.setattr(launcher, "DIRECT", False)
    for _ in range(3):
        launcher.launch(k, "key", (1,), ("x",), {"BLOCK": 1}, stream=0)
    assert len(k.jit_calls) == 3 and not k.handle.runs
    monkeypatch.setattr(launcher, "DIRECT", True)
    odd = FakeKernel([("BLOCK", True, None), ("x", False, None)])  # a constexpr first: the launcher's order differs
    for _ in range(2):
        launcher.launch(odd, "key", (1,), ("x",), {"BLOCK": 1}, stream=0)
    assert len(odd.jit_calls) == 2


def test_alignment_is_zero_when_every_pointer_is_16_byte_aligned():
    t = torch.zeros(64, dtype=torch.float32)
    assert launcher.alignment(t, None, t[4:]) == 0
    assert launcher.alignment(t, t[1:]) != launcher.alignment(t, t[2:]) != 0


def test_scratch_is_kept_per_stream_grown_and_zeroed_when_asked(monkeypatch):
    pad = scratch.Scratch()
    cpu = torch.device("cpu")
    a = pad.get("flags", 10, torch.int32, cpu, stream=1, zeroed=True)
    assert a.numel() == 10 and not a.any()
    a[3] = 5
    assert pad.get("flags", 8, torch.int32, cpu, stream=1, zeroed=True) is a, "big enough: the same buffer"
    assert pad.get("flags", 8, torch.int32, cpu, stream=2, zeroed=True) is not a, "another stream, its own"
    grown = pad.get("flags", 11, torch.int32, cpu, stream=1, zeroed=True)
    assert grown.numel() == 20 and not grown.any(), "grown to twice, zeroed again"
    monkeypatch.setattr(scratch, "capturing", lambda: True)
    during = pad.get("partials", 100, torch.float32, cpu, stream=1, zeroed=False)
    assert pad.get("partials", 100, torch.float32, cpu, stream=1, zeroed=False) is not during, \
        "a buffer first needed during a capture is the capture's own, never kept"
    assert len(pad) == 2


def _args(rows: int) -> KernelArgs:
    q = torch.zeros(rows, 2, 64)
    return KernelArgs(q, torch.zeros(8, 1, 64), SparseIndex(torch.zeros(rows, 4, dtype=torch.int32), None), 0.1,
                      None, torch.zeros(rows, 2, 48))


def test_a_plan_is_built_once_per_signature_alignment_and_options():
    plan.forget()
    built = []
    make = lambda a, opts: plan.planned(a, "p", opts, lambda: built.append(a) or len(built))  # noqa: E731
    assert make(_args(3), ()) == make(_args(3), ()) == 1, "same signature (new tensors): the same plan"
    assert make(_args(4), ()) == 2 and make(_args(3), ("x",)) == 3
    a = _args(3)
    misaligned = a._replace(q=torch.zeros(3 * 2 * 64 + 1)[1:].view(3, 2, 64))
    assert make(misaligned, ()) == 4, "a pointer off 16 bytes: its own plan"
    memo = {}
    assert make(a._replace(memo=memo), ()) == 5 and len(memo) == 1, "the dispatcher's memo holds its own"
    plan.forget()


def test_a_stamp_is_armed_by_the_launch_that_takes_it():
    from dispatcher.kernels.stamps import DeviceStamp

    stamp = DeviceStamp(torch.zeros(4, 2, dtype=torch.int64), torch.zeros(4, dtype=torch.int32), 2)
    times, counts, at = plan.stamp_operands(_args(2)._replace(stamp=stamp), torch.device("cpu"), clock=0)
    assert stamp.armed and at == 2 and times is stamp.times
    assert plan.stamp_operands(_args(2), torch.device("cpu"), clock=0)[2] == -1
    other = DeviceStamp(times, counts, 1)
    assert plan.stamp_operands(_args(2)._replace(stamp=other), torch.device("cpu"), clock=-1)[2] == -1
    assert not other.armed, "a device whose kernels cannot stamp (ROCm) leaves it to the event pair"


@pytest.mark.parametrize("device", ["cpu"])
def test_the_clock_is_the_interpreters_counter_off_cuda(device):
    assert plan.clock_for(torch.device(device)) == 0


class ThreeSixLauncher:
    """Stands in for Triton 3.6's CudaLauncher: its __call__ reads as that one does (the C launcher with four
    arguments of its own in front)."""

    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = False, True

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.launch = lambda *a: self.calls.append(a)

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):  # noqa: N803 - Triton's names
        global_scratch = profile_scratch = None
        self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, self.launch_pdl, global_scratch, profile_scratch, *args)  # noqa: E501


class OtherLauncher(ThreeSixLauncher):
    def __call__(self, gridX, gridY, gridZ, stream, function, *args):  # noqa: N803
        self.launch(gridX, gridY, gridZ, stream, function, *args)


def test_a_step_calls_the_c_launcher_only_where_the_launcher_reads_as_expected():
    for kind, direct in ((ThreeSixLauncher, True), (OtherLauncher, False)):
        k = FakeKernel([("x", False, None), ("BLOCK", True, None)])
        k.handle.run = kind()
        step = launcher.Step(k, ("key", kind.__name__), (2, 3), {"BLOCK": 8})
        step(("a",), 5)  # the JIT, the first time
        step(("b",), 6)
        want = (2, 3, 1, 6, "fn", False, True, None, None, "meta", None, None, None, "b", 8)
        assert (k.handle.run.calls == [want]) is direct, kind
        assert len(k.jit_calls) == 1
    scratchy = ThreeSixLauncher()
    scratchy.global_scratch_size = 64  # a kernel with global scratch keeps Triton's own call
    assert launcher._c_launcher(scratchy) is None


class Addressed:
    """Stands in for a tensor argument: only its address matters to the launcher."""

    def __init__(self, address: int) -> None:
        self.address = address

    def data_ptr(self) -> int:
        return self.address


def test_a_step_hands_the_c_launcher_addresses_not_tensors(monkeypatch):
    k = FakeKernel([("x", False, None), ("n", False, None), ("y", False, None), ("BLOCK", True, None)])
    k.handle.run = ThreeSixLauncher()
    step = launcher.Step(k, ("key", "raw"), (1,), {"BLOCK": 8})
    first = (Addressed(4096), 7, Addressed(8192))
    step(first, 0)
    assert k.jit_calls[0][1] == first, "the JIT's first launch gets the objects themselves (it reads their dtypes)"
    step((Addressed(16), 9, Addressed(32)), 0)
    assert k.handle.run.calls[-1][-4:] == (16, 9, 32, 8), "then each pointer as its address, the scalars as given"
    monkeypatch.setattr(launcher, "RAW_POINTERS", False)
    t = Addressed(48)
    step((t, 9, t), 0)
    assert k.handle.run.calls[-1][-4:] == (t, 9, t, 8), "RAW_POINTERS off: the objects, for Triton to check"
