"""The dispatcher end to end on CPU: validate, decide, launch, probe; AITER through a named double."""

from __future__ import annotations

import pytest
import torch

from dispatcher import (
    CallClass, DecodeInPrefillError, Dispatcher, GuardMode, Kernel, Policy, sparse_attn_prefill, what_if,
)
from dispatcher.kernels import KernelImpl, KernelRegistry, default_registry
from dispatcher.kernels.aiter import AiterSymbolMissing
from dispatcher.kernels.common import KernelArgs, SparseIndex
from dispatcher.kernels.torch_ref import ragged_prefill

from . import aiter_double

H, NOPE, ROPE = 2, 48, 16
D = NOPE + ROPE


def call_args(rows, *, full_out=False, sink=False, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, H, D, generator=g).to(dtype)
    kv = torch.randn(40, 1, D, generator=g).to(dtype)
    idx = torch.randint(-1, 40, (rows, 16), generator=g, dtype=torch.int32)
    out = torch.full((rows, H, D if full_out else NOPE), float("nan"), dtype=dtype)
    s = torch.randn(H, generator=g) if sink else None
    return [q, kv, idx, None, 0.2, D, NOPE, ROPE, s, out]


def expected(args):
    q, kv, idx, tl, scale, _, _, _, s, out = args
    ref = torch.empty_like(out)
    ragged_prefill(KernelArgs(q, kv, SparseIndex(idx, tl), scale, s, ref))
    return ref


class RecordingProbe:
    """A real (if minimal) probe: records what the dispatcher tells it."""

    def __init__(self, fail_in=None):
        self.events = []
        self.fail_in = fail_in

    def start(self, decision, shape, batch, model, q, stream, impl=None):
        if self.fail_in == "start":
            raise RuntimeError("probe broke")
        self.events.append(("start", decision.kernel, shape.rows, batch.call_class, model))
        return f"t{len(self.events)}"  # not an int: the dispatcher always calls stop

    def stop(self, token, impl, announced=None):
        if self.fail_in == "stop":
            raise RuntimeError("probe broke")
        self.events.append(("stop", token, impl))

    def error(self, token, exc, impl=None, announced=None):
        self.events.append(("error", token, type(exc).__name__))


@pytest.fixture
def aiter_mod():
    mod = aiter_double.install()
    yield mod
    aiter_double.uninstall()


def dispatcher_for(arch, *, aiter_module=aiter_double.NAME, **policy):
    return Dispatcher(
        platform=what_if(arch, aiter=True),
        policy=Policy(**policy),
        registry=default_registry(aiter_module=aiter_module, triton=False),
    )


def test_cpu_default_runs_intree_and_writes_output():
    args = call_args(7)
    d = Dispatcher(platform=what_if("cpu"), policy=Policy(), registry=default_registry(triton=False))
    decision = d(*args)
    assert decision.kernel is Kernel.INTREE_RAGGED_PREFILL
    torch.testing.assert_close(args[-1], expected(args))


def test_module_function_uses_env_policy(monkeypatch):
    monkeypatch.setenv("ROUTESCOPE_GFX942_MIN_ROWS", "3")
    args = call_args(4)
    decision = sparse_attn_prefill(*args, query_lens=[1, 3])
    assert decision.kernel is Kernel.INTREE_RAGGED_PREFILL  # this machine is not gfx942
    assert decision.call_class is CallClass.MIXED


def test_short_call_imports_nothing(aiter_mod):
    d = dispatcher_for("gfx942", gfx942_min_rows=8)
    symbol = d.registry.resolve(Kernel.AITER_PA_PREFILL_SPARSE, "cpu").launch.symbol
    assert d(*call_args(7)).kernel is Kernel.INTREE_RAGGED_PREFILL
    assert symbol.loads == 0 and aiter_mod.calls == []


@pytest.mark.parametrize("full_out,uses_out", [(True, True), (False, False)])
def test_eligible_call_launches_aiter(aiter_mod, full_out, uses_out):
    d = dispatcher_for("gfx942", gfx942_min_rows=8)
    args = call_args(8, full_out=full_out, dtype=torch.float16)
    decision = d(*args)
    assert decision.kernel is Kernel.AITER_PA_PREFILL_SPARSE
    assert aiter_mod.calls == [("pa_prefill_sparse", uses_out)]  # out= only when output matches q
    torch.testing.assert_close(args[-1], expected(args))


def test_missing_symbol_on_eligible_call_raises_naming_it():
    d = dispatcher_for("gfx942", aiter_module="routescope_no_such_aiter", gfx942_min_rows=8)
    # the module AITER defines it in (aiter/ops/triton/attention/pa_prefill_sparse.py), the symbol, the failure
    where = r"routescope_no_such_aiter\.ops\.triton\.attention\.pa_prefill_sparse\.pa_prefill_sparse"
    with pytest.raises(AiterSymbolMissing, match=where + r" is needed for this call .*ModuleNotFoundError"):
        d(*call_args(8, dtype=torch.bfloat16))


def test_gfx950_opus_and_fall_through(aiter_mod):
    d = dispatcher_for("gfx950", gfx950_min_rows=8)
    args = call_args(8, full_out=True, sink=True, dtype=torch.bfloat16)
    assert d(*args).kernel is Kernel.AITER_OPUS
    torch.testing.assert_close(args[-1], expected(args))
    aiter_double.install(with_opus=False)
    d2 = dispatcher_for("gfx950", gfx950_min_rows=8)
    args2 = call_args(8, full_out=True, sink=True, dtype=torch.bfloat16)
    decision = d2(*args2)
    assert decision.kernel is Kernel.INTREE_RAGGED_PREFILL and decision.reason_code == "gfx950_symbol"
    assert d2.platform.opus_importable is False
    torch.testing.assert_close(args2[-1], expected(args2))


def test_probe_sees_start_and_stop():
    probe = RecordingProbe()
    d = Dispatcher(platform=what_if("cpu"), policy=Policy(), registry=default_registry(triton=False), probe=probe)
    d(*call_args(5), query_lens=[1, 1, 3], model="glm")
    assert probe.events == [
        ("start", Kernel.INTREE_RAGGED_PREFILL, 5, CallClass.MIXED, "glm"),
        ("stop", "t1", "torch"),
    ]


def test_an_int_token_skips_stop_unless_another_implementation_ran():
    """An int token is the probe's whole record of the call: stop only for a fallback, told what was announced."""

    class IntProbe(RecordingProbe):
        def start(self, decision, shape, batch, model, q, stream, impl=None):
            self.events.append(("start", impl))
            return 7

        def stop(self, token, impl, announced=None):
            self.events.append(("stop", token, impl, announced))

    ran = iter([None, "triton"])
    reg = KernelRegistry()
    reg.register(KernelImpl(Kernel.INTREE_RAGGED_PREFILL, "gluon", lambda args: next(ran)))
    probe = IntProbe()
    d = Dispatcher(platform=what_if("cpu"), policy=Policy(), registry=reg, probe=probe)
    d(*call_args(5), model="glm")
    d(*call_args(5), model="glm")
    assert probe.events == [("start", "gluon"), ("start", "gluon"), ("stop", 7, "triton", "gluon")]


@pytest.mark.parametrize("where", ["start", "stop"])
def test_broken_probe_never_breaks_the_call(where):
    d = Dispatcher(platform=what_if("cpu"), policy=Policy(), registry=default_registry(triton=False),
                   probe=RecordingProbe(fail_in=where))
    args = call_args(5)
    assert d(*args).kernel is Kernel.INTREE_RAGGED_PREFILL
    assert d.probe_failures == 1
    torch.testing.assert_close(args[-1], expected(args))


def test_kernel_error_reaches_probe_and_is_reraised_unchanged():
    class Boom(RuntimeError):
        pass

    def broken(args):
        raise Boom("kernel fault")

    reg = default_registry(triton=False)
    reg.register(KernelImpl(Kernel.INTREE_RAGGED_PREFILL, "torch", broken), prefer=True)
    probe = RecordingProbe()
    d = Dispatcher(platform=what_if("cpu"), policy=Policy(), registry=reg, probe=probe)
    with pytest.raises(Boom, match="kernel fault"):
        d(*call_args(3))
    assert probe.events[-1] == ("error", "t1", "Boom")


def test_guard_raise_refuses_pure_decode():
    probe = RecordingProbe()
    d = Dispatcher(platform=what_if("cpu"), policy=Policy(guard=GuardMode.RAISE), registry=default_registry(triton=False), probe=probe)
    with pytest.raises(DecodeInPrefillError, match="pure-decode batch .*reached intree.ragged_prefill"):
        d(*call_args(2), query_lens=[1, 1], model="glm")
    assert probe.events[-1][2] == "DecodeInPrefillError"
    assert d(*call_args(3), query_lens=[1, 2]).kernel is Kernel.INTREE_RAGGED_PREFILL  # mixed passes


def test_guard_reroute_runs_split_k_with_same_result():
    d = Dispatcher(platform=what_if("cpu"), policy=Policy(guard=GuardMode.REROUTE), registry=default_registry(triton=False))
    args = call_args(4, sink=True)
    decision = d(*args, num_decodes=4, num_decode_tokens=4)
    assert decision.kernel is Kernel.INTREE_SPARSE_DECODE
    assert decision.rerouted_from is Kernel.INTREE_RAGGED_PREFILL
    torch.testing.assert_close(args[-1], expected(args), rtol=1e-5, atol=1e-6)


def test_bad_input_raises_before_probe():
    probe = RecordingProbe()
    d = Dispatcher(platform=what_if("cpu"), policy=Policy(), registry=default_registry(triton=False), probe=probe)
    args = call_args(3)
    args[5] = D + 1
    with pytest.raises(ValueError, match="head_dim"):
        d(*args)
    assert probe.events == []


def test_a_known_signature_keeps_its_implementation_until_the_registry_changes():
    """A call of a known signature runs the implementation resolved for it before (no lookup); a registration
    after that, even into the same registry, is seen by the next call; a dispatcher given another registry too."""
    ran = []
    reg = KernelRegistry()
    reg.register(KernelImpl(Kernel.INTREE_RAGGED_PREFILL, "first", lambda args: ran.append("first")))
    d = Dispatcher(platform=what_if("cpu"), policy=Policy(), registry=reg)
    resolved = []
    resolve = reg.resolve
    reg.resolve = lambda kernel, device: resolved.append(kernel) or resolve(kernel, device)
    for _ in range(3):
        d(*call_args(5), model="glm")
    assert ran == ["first"] * 3 and len(resolved) == 1  # resolved for the signature's first call only
    reg.register(KernelImpl(Kernel.INTREE_RAGGED_PREFILL, "second", lambda args: ran.append("second")), prefer=True)
    d(*call_args(5), model="glm")
    assert ran[-1] == "second" and len(resolved) == 2
    other = KernelRegistry()
    other.register(KernelImpl(Kernel.INTREE_RAGGED_PREFILL, "third", lambda args: ran.append("third")))
    d.registry = other
    d(*call_args(5), model="glm")
    assert ran[-1] == "third"
