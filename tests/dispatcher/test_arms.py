"""dispatcher/arms.py's contract with real kernels on CPU: a chooser that raises leaves the call on A (counted); a B
launch that raises is rerun on A and the call succeeds; a numerics sample gives the caller A's output; a B kernel
with no implementation here leaves the call on A; no chooser attached: the plain path."""

from __future__ import annotations

import torch

from dispatcher import CallClass, CallShape, Dispatcher, what_if
from dispatcher.arms import ARM_B_REASON, Arm, ArmChooser, Outcome, arm_decision
from dispatcher.kernels import KernelImpl, KernelRegistry
from dispatcher.kernels.torch_ref import ragged_prefill
from dispatcher.kernels.torch_splitk import sparse_decode
from dispatcher.types import Kernel

from .test_api import call_args, expected


class Chooser:
    """A minimal real chooser: every call to B (kernel ``kernel``), a check on every ``check``-th; records all."""

    def __init__(self, kernel=Kernel.INTREE_SPARSE_DECODE, *, check_every=0, fail=False):
        self.kernel, self.check_every, self.fail = kernel, check_every, fail
        self.seen, self.finished, self.begun = 0, [], 0

    def choose(self, decision, shape, batch, model, q, position=None):
        if self.fail:
            raise RuntimeError("chooser broke")
        self.seen += 1
        check = bool(self.check_every) and self.seen % self.check_every == 0
        return Arm(arm_decision(decision, self.kernel, "test"), is_b=True, check=check)

    def begin(self, arm, q, stream):
        self.begun += 1
        return None

    def finish(self, arm, outcome, error=None, expected=None, got=None):
        self.finished.append((outcome, type(error).__name__ if error else None,
                              None if got is None else bool(torch.equal(expected, got))))


def registry(decode_launch=sparse_decode):
    reg = KernelRegistry()
    reg.register(KernelImpl(Kernel.INTREE_RAGGED_PREFILL, "torch", ragged_prefill))
    if decode_launch is not None:
        reg.register(KernelImpl(Kernel.INTREE_SPARSE_DECODE, "torch", decode_launch))
    return reg


def _dispatcher(reg):
    return Dispatcher(platform=what_if("cpu"), registry=reg)


def test_chooser_conforms_and_b_runs():
    d = _dispatcher(registry())
    chooser = Chooser()
    assert isinstance(chooser, ArmChooser)
    d.set_arms(chooser)
    args = call_args(8)
    decision = d(*args)
    assert decision.kernel is Kernel.INTREE_SPARSE_DECODE and decision.reason_code == ARM_B_REASON
    assert chooser.finished == [(Outcome.RAN, None, None)] and chooser.begun == 1
    torch.testing.assert_close(args[-1], expected(args), rtol=1e-4, atol=1e-5)  # split-K computes the same


def test_chooser_that_raises_leaves_the_call_on_a_and_is_counted():
    d = _dispatcher(registry())
    d.set_arms(Chooser(fail=True))
    args = call_args(8)
    assert d(*args).kernel is Kernel.INTREE_RAGGED_PREFILL
    assert d.arm_failures == 1
    assert torch.equal(args[-1], expected(args))


def test_b_that_raises_is_rerun_on_a_and_the_call_succeeds():
    def broken(args):
        args.output.fill_(7.0)  # half-written garbage first, then the failure
        raise RuntimeError("B broke")

    d = _dispatcher(registry(broken))
    chooser = Chooser()
    d.set_arms(chooser)
    args = call_args(8)
    decision = d(*args)
    assert decision.kernel is Kernel.INTREE_RAGGED_PREFILL
    assert torch.equal(args[-1], expected(args))  # A's output, bit for bit
    assert chooser.finished == [(Outcome.FAILED, "RuntimeError", None)]


def test_numerics_sample_gives_the_caller_a_and_b_goes_to_scratch():
    def wrong(args):
        sparse_decode(args)
        args.output.add_(1.0)

    d = _dispatcher(registry(wrong))
    chooser = Chooser(check_every=1)
    d.set_arms(chooser)
    args = call_args(8)
    decision = d(*args)
    assert decision.kernel is Kernel.INTREE_RAGGED_PREFILL  # what wrote the caller's output
    assert torch.equal(args[-1], expected(args))
    assert chooser.finished == [(Outcome.CHECKED, None, False)]  # the chooser saw B's wrong scratch


def test_b_with_no_implementation_here_stays_on_a():
    d = _dispatcher(registry(decode_launch=None))
    chooser = Chooser()
    d.set_arms(chooser)
    args = call_args(8)
    assert d(*args).kernel is Kernel.INTREE_RAGGED_PREFILL
    assert chooser.finished == [(Outcome.UNAVAILABLE, None, None)]
    assert torch.equal(args[-1], expected(args))


def test_detached_chooser_is_not_called():
    d = _dispatcher(registry())
    chooser = Chooser()
    d.set_arms(chooser)
    d.set_arms(None)
    d(*call_args(8))
    assert chooser.seen == 0 and d.arms is None


def test_arm_decision_is_labelled_and_memoisable():
    d = _dispatcher(registry())
    base = d._cache.decide(CallShape(8), CallClass.PREFILL)
    b = arm_decision(base, Kernel.INTREE_SPARSE_DECODE, "why")
    assert b.ordinal >= 0 and b.ordinal != base.ordinal
    assert b.rerouted_from is None and b.branch == "experiment" and not b.refused  # not a guard reroute
