"""Inside an experiment the plugin routes arm B's calls; outside one it only observes. vLLM here is TEST DOUBLES
(tests/vllm_plugin/doubles.py: 0.33.0's helpers, computing with routescope's torch reference); the experiment is
the project's own (experiments.control.Registry on a multiprocess directory, started as the CLI starts one)."""

from __future__ import annotations

import importlib

import pytest
import torch

from dispatcher import what_if
from experiments import control
from experiments.assignment import STREAM_ARM, uniform
from experiments.config import ExperimentConfig
from routescope.vllm import plugin
from routescope.vllm.experiment import registry_factory
from routescope.vllm.layout import Layout
from tests.dispatcher import aiter_double
from telemetry import Telemetry, TelemetryConfig
from tests.telemetry.cuda_double import CURRENT_STREAM, FakeCuda, FakeEvent, FakeTorch, FakeWait, RocmTorch, reset

from .conftest import Meta, prefill_args, samples, telemetry
from .test_graphs import DeviceLooking

OPUS, INTREE, PA, SPLIT_K = ("aiter.pa_sparse_prefill_opus", "intree.ragged_prefill", "aiter.pa_prefill_sparse",
                             "intree.sparse_decode")


class Server:
    """The doubles, the plugin installed on a what-if platform, and an experiment directory; flushes by hand."""

    def __init__(self, vllm_doubles, tmp_path, arch: str, *, getters: str = "both", env: dict | None = None,
                 layout: Layout | None = None, factory=None, telemetry_factory=None, gfx942_min: int = 512,
                 opus_min: int = 1024) -> None:
        d = vllm_doubles(getters=getters, gfx942_min=gfx942_min)
        self.ops, self.backend, self.fc = d.ops(), d.backend(), d.fc()
        self.ops._GFX950_AITER_SPARSE_PREFILL_OPUS_MIN_QUERIES = opus_min  # small calls: the torch reference is slow
        self.dir = str(tmp_path / "multiproc")
        self.env = {"ROUTESCOPE_VLLM": "1", "ROUTESCOPE_TELEMETRY_MULTIPROC_DIR": self.dir,
                    "ROUTESCOPE_TELEMETRY_FLUSH_INTERVAL_S": "3600", **(env or {})}
        state = plugin.install(env=self.env, platform=what_if(arch), layout=layout, experiment_factory=factory,
                               telemetry_factory=telemetry_factory)
        assert state == "observing"
        self.obs = plugin.current().observer

    def call(self, rows: int, seed: int = 0, **kw) -> tuple[torch.Tensor, torch.Tensor]:
        """One prefill-entry call through vLLM's backend double: (the output the caller got, the reference)."""
        args, expected = prefill_args(rows, seed=seed, **kw)
        self.backend.forward_prefill(*args)
        return args[-1], expected

    def start(self, *, attached: bool = True, **config) -> None:
        """Start an experiment as ``routescope experiment start --multiproc-dir`` does; this process picks it up."""
        if not self.obs.ready(torch.zeros(1)):
            raise AssertionError("the plugin's telemetry did not start")
        control.start(self.dir, ExperimentConfig(**config))
        self.flush()
        assert (self.obs.router.chooser is not None) is attached

    def flush(self) -> None:
        self.obs.router.registry.flush()

    def report(self) -> dict:
        """This process's view of the experiment, after a flush (what it writes to the directory for the service)."""
        self.flush()
        (item,) = self.obs.router.registry.views()
        return item

    def helpers(self, name: str) -> int:
        return sum(1 for e in self.ops.LOG if e[:2] == ("helper", name))

    def entries(self) -> int:
        return sum(1 for e in self.ops.LOG if e[0] == "prefill")


ROWS = 48  # between the candidates' gates (32) and vLLM's own ones (64, lowered from 512 and 1024)


def _opus_server(vllm_doubles, tmp_path, **kw) -> Server:
    s = Server(vllm_doubles, tmp_path, "gfx950", getters="opus_only", opus_min=64, **kw)
    s.ops._ON_GFX950 = True  # vLLM's arch flag, as on a gfx950 (the double's module global)
    return s


def test_without_an_experiment_the_plugin_only_observes(vllm_doubles, tmp_path):
    s = _opus_server(vllm_doubles, tmp_path)
    for i in range(20):
        out, expected = s.call(ROWS, seed=i, sink=True, full_lanes=True)
        assert torch.equal(out, expected)
    assert s.entries() == 20 and s.helpers("opus") == 0  # vLLM's entry ran every call, nothing else launched
    assert s.obs.router.chooser is None and s.obs.status()["routing"]["routed"] == {}


def test_gfx950_gate_experiment_sends_the_assigned_calls_to_opus_at_their_positions(vllm_doubles, tmp_path):
    """Calls of 48 rows: vLLM keeps them in-tree (its OPUS gate, lowered to 64); candidate gfx950_32 moves the assigned
    ones to OPUS through vLLM's own _rocm_sparse_attn_prefill_ragged_aiter_opus. Which calls is the pure function
    of (seed, position): no forward context here, so the position is (step 0, call index)."""
    s = _opus_server(vllm_doubles, tmp_path)
    s.start(id="g950", candidate="gfx950_32", fraction=0.1, seed=7)
    b_positions = []
    for i in range(300):
        before = s.helpers("opus")
        out, expected = s.call(ROWS, seed=i, sink=True, full_lanes=True)
        assert torch.equal(out, expected), i  # both arms compute the reference here: the caller's output is right
        if s.helpers("opus") > before:
            b_positions.append(i)
    want = [i for i in range(300) if uniform(7, STREAM_ARM, 0, i) < 0.1]
    assert b_positions == want and 15 <= len(want) <= 45
    # the numerics sample (the first B call of the cell) ran vLLM's entry into the output, B into scratch
    assert s.entries() == 300 - len(want) + 1
    item = s.report()
    (cell,) = item["cells"]
    assert (cell["kernel_a"], cell["kernel_b"], cell["calls_b"]) == (INTREE, OPUS, len(want))
    assert cell["numerics"] == {"checked": 1, "mismatched": 0} and item["state"] == "running"
    tel = telemetry()
    tel.flush()
    assert samples(tel, "routescope_decisions_total", kernel=OPUS, reason="experiment_b") == len(want) - 1
    assert samples(tel, "routescope_calls_total", kernel=OPUS, impl="aiter") == len(want) - 1


def test_routescope_experiment_start_on_the_directory_reaches_the_plugin(vllm_doubles, tmp_path):
    """The command a user types (``routescope experiment start ... --multiproc-dir DIR``), then the stop: the plugin
    picks each up at its next flush."""
    from typer.testing import CliRunner

    from service.experiment_cli import experiment_app

    s = _opus_server(vllm_doubles, tmp_path)
    assert s.obs.ready(torch.zeros(1))
    runner = CliRunner()
    done = runner.invoke(experiment_app, ["start", "gfx950_32", "--fraction", "0.1", "--seed", "7",
                                          "--multiproc-dir", s.dir])
    assert done.exit_code == 0, done.output
    s.flush()
    for i in range(100):
        s.call(ROWS, seed=i, sink=True, full_lanes=True)
    moved = s.helpers("opus")
    assert moved == sum(1 for i in range(100) if uniform(7, STREAM_ARM, 0, i) < 0.1) > 0
    done = runner.invoke(experiment_app, ["stop", "gfx950_32", "--multiproc-dir", s.dir])
    assert done.exit_code == 0, done.output
    s.flush()
    for i in range(100):
        s.call(ROWS, seed=i, sink=True, full_lanes=True)
    assert s.helpers("opus") == moved and s.obs.router.chooser is None


def test_positions_follow_vllms_steps_so_every_rank_assigns_alike(vllm_doubles, tmp_path):
    """The position is (step, call in step): one forward context is one step. Two ranks (the TP rank getter says
    0, then 1, in two fresh installs) running the same steps get the same arms, call for call."""
    runs = []
    for rank in (0, 1):
        s = _opus_server(vllm_doubles, tmp_path / f"rank{rank}")
        importlib.import_module("vllm.distributed").TP_RANK = rank
        s.start(id="ranks", candidate="gfx950_32", fraction=0.1, seed=11)
        seen = []
        for step in range(40):
            with s.fc.set_forward_context({"layer.0": Meta(0, 0, 1, ROWS, ROWS)}):
                for layer in range(3):
                    before = s.helpers("opus")
                    s.call(ROWS, seed=layer, sink=True, full_lanes=True)
                    seen.append((step + 1, layer, s.helpers("opus") > before))
        assert s.obs.rank == str(rank)
        runs.append(seen)
        plugin.uninstall()
    assert runs[0] == runs[1]
    assert [p[:2] for p in runs[0] if p[2]] == [p[:2] for p in runs[0] if uniform(11, STREAM_ARM, *p[:2]) < 0.1]
    assert any(p[2] for p in runs[0])


def test_a_b_that_raises_reruns_on_a_the_call_succeeds_and_the_experiment_stops(vllm_doubles, tmp_path):
    s = _opus_server(vllm_doubles, tmp_path)
    s.start(id="raises", candidate="gfx950_32", fraction=0.1, seed=3)

    real = s.ops._rocm_sparse_attn_prefill_ragged_aiter_opus
    launches = []

    def opus_failing_after_the_sample(**kw):
        """The cell's first B call (its numerics sample) passes; the next B launch raises."""
        launches.append(kw["q"].shape[0])
        if len(launches) > 1:
            raise RuntimeError("planted: B's launch fails")
        return real(**kw)

    s.ops._rocm_sparse_attn_prefill_ragged_aiter_opus = opus_failing_after_the_sample
    for i in range(120):
        out, expected = s.call(ROWS, seed=i, sink=True, full_lanes=True)
        assert torch.equal(out, expected), i
    item = s.report()
    assert item["state"] == "stopped" and item["stop_reason"] == "b_raised"
    assert len(launches) == 2  # the sample, then the B call that raised: the experiment stopped there
    routed = s.obs.status()["routing"]["routed"]
    assert routed == {**{k: v for k, v in routed.items() if k == "a_timed"}, "b_checked": 1, "b_failed": 1}
    assert s.entries() == 120  # vLLM's own entry ran for every call: the sample's A, and A again after B raised
    tel = telemetry()
    tel.flush()
    assert samples(tel, "routescope_kernel_errors_total", kernel=OPUS) == 1  # B's failure, as the Dispatcher counts it
    assert samples(tel, "routescope_calls_total", kernel=INTREE) == 120 and s.obs.errors == {}


def test_a_wrong_b_stops_the_experiment_and_the_caller_only_ever_gets_as_output(vllm_doubles, tmp_path):
    """A planted wrong arm: B writes garbage. A cell's first B call is a numerics sample (A into the output, B into
    scratch), which stops the experiment; every output the caller got is A's, bit for bit."""
    s = _opus_server(vllm_doubles, tmp_path)
    s.start(id="wrong", candidate="gfx950_32", fraction=0.1, seed=5)

    def wrong_opus(*, q, kv, indices, indptr, scale, attn_sink, output):
        output.fill_(3.0)
        return True

    s.ops._rocm_sparse_attn_prefill_ragged_aiter_opus = wrong_opus
    for i in range(80):
        out, expected = s.call(ROWS, seed=i, sink=True, full_lanes=True)
        assert torch.equal(out, expected), i
    item = s.report()
    assert item["state"] == "stopped" and item["stop_reason"] == "numerics"
    assert item["cells"][0]["numerics"] == {"checked": 1, "mismatched": 1}
    assert s.entries() == 80


@pytest.fixture(params=["cuda", "rocm"])
def on_device(vllm_doubles, tmp_path, request):
    """The OPUS server with telemetry and the experiment given tests/telemetry/cuda_double.py's stand-in for
    torch.cuda (as CUDA, or as torch's ROCm build presents HIP), and q a CPU tensor reporting is_cuda; the
    experiment's stream gate waits through the double's FakeWait (``s.wait``) for the Triton kernel."""
    reset()
    torch_module = FakeTorch
    if request.param == "rocm":
        torch_module = RocmTorch
        RocmTorch.use()
    events: list = []

    class Event(FakeEvent):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            events.append(self)

        def record(self, stream=None):
            if stream is CURRENT_STREAM and not FakeCuda.capturing:  # the call's stream: a kernel ran before it
                FakeEvent.clock += KERNEL_US / 1000
            super().record(stream)

    FakeCuda.Event = Event

    def telemetry_factory(*, platform, policy, model, rank, **_):
        return Telemetry(TelemetryConfig(models=(model,), rank=rank, timing_gate=False), platform=platform,
                         policy=policy, torch_module=torch_module)

    wait = FakeWait()

    def factory(*, env):
        return registry_factory(env=env, torch_mod=torch_module, gate_launcher=wait.launcher)

    s = _opus_server(vllm_doubles, tmp_path, factory=factory, telemetry_factory=telemetry_factory)
    s.events = events
    s.wait = wait
    yield s
    FakeCuda.Event = FakeEvent
    reset()


KERNEL_US = 2.0  # in on_device, what a pair on the call's stream reads beyond an empty pair on a side stream


def _device_call(s: Server, i: int) -> None:
    args, expected = prefill_args(ROWS, seed=i, sink=True, full_lanes=True)
    s.backend.forward_prefill(args[0].as_subclass(DeviceLooking), *args[1:])
    assert torch.equal(args[-1], expected)


def test_captured_calls_are_never_moved(on_device):
    """Inside a graph capture the experiment moves nothing; the captured calls its draws picked (B or a timed A) are
    counted with the reason, the rest with A's calls (the capture is asked only where it changes what runs)."""
    s = on_device
    s.start(id="capture", candidate="gfx950_32", fraction=0.1, seed=1)
    FakeCuda.capturing = True
    try:
        for i in range(50):
            _device_call(s, i)
    finally:
        FakeCuda.capturing = False
    assert s.helpers("opus") == 0 and s.entries() == 50
    report = s.report()
    captured = report["never_moved"]["capture"]
    assert 0 < captured < 50  # f = 0.1: about 2 x 5 of the 50 calls are picks
    assert sum(c["calls_b"] for c in report["cells"]) == 0
    assert sum(c["calls_a"] for c in report["cells"]) + captured == 50


def _device_runs(s: Server) -> None:
    """The device reaches everything queued: the gates' waits released, every event recorded so far complete."""
    s.wait.run()
    for e in s.events:
        e.done = True


def test_on_a_device_both_arms_are_timed_by_gated_event_pairs_read_at_flush(on_device):
    """Eager calls on a device: every B call and A's timed sample get an event pair behind the stream gate (vLLM's
    kernels write no stamps), read by query() at flush and less the device's calibrated offset; nothing synchronises
    (the double raises if anything does)."""
    s = on_device
    s.start(id="events", candidate="gfx950_32", fraction=0.1, seed=2)
    for i in range(30):  # until a timed call asks for the gate, which the flush builds, then its empty pairs
        _device_call(s, i)
    for _ in range(3):
        s.report()
        _device_runs(s)
    clock = s.obs.router.registry.current._clock
    assert [cal.offset_ns for cal in clock.devices.values()] == [4000]  # the double's event record: 4 µs
    before, dropped = dict(s.obs.status()["routing"]["routed"]), clock.dropped
    assert dropped > 0  # the timed calls before the flush built the gate
    (cell,) = s.report()["cells"]
    timed_b, timed_a = cell["timed_b"], cell["timed_a"]
    for i in range(150):
        _device_call(s, 100 + i)
    routed = s.obs.status()["routing"]["routed"]
    (cell,) = s.report()["cells"]
    assert (cell["timed_b"], cell["timed_a"]) == (timed_b, timed_a)  # no event has completed: nothing read or waited
    _device_runs(s)
    (cell,) = s.report()["cells"]
    new_b = routed["b"] + routed["b_checked"] - before["b"] - before["b_checked"]
    assert cell["timed_b"] - timed_b == new_b >= 5
    assert cell["timed_a"] - timed_a == routed["a_timed"] - before["a_timed"] >= 5
    # the empty pairs' 4 µs taken off: what is left is the kernel (to the ns the float clock of the double rounds)
    kernel = pytest.approx(KERNEL_US * 1e-6, abs=2e-9)
    assert cell["mean_a_s"] == kernel and cell["mean_b_s"] == kernel
    assert clock.dropped == dropped  # once the gate is there, every timed call is read


def test_batch_invariant_mode_moves_nothing(vllm_doubles, tmp_path):
    s = _opus_server(vllm_doubles, tmp_path, env={"VLLM_BATCH_INVARIANT": "1"})
    s.start(id="invariant", candidate="gfx950_32", fraction=0.1, attached=False)
    for i in range(30):
        s.call(ROWS, seed=i, sink=True, full_lanes=True)
    assert s.helpers("opus") == 0 and s.entries() == 30
    assert s.obs.status()["routing"]["batch_invariant"] is True
    assert s.report()["never_moved"]["batch_invariant"] == 30


def test_a_b_kernel_this_build_lacks_leaves_the_calls_on_a_counted(vllm_doubles, tmp_path):
    s = _opus_server(vllm_doubles, tmp_path)
    s.ops.HAVE_OPUS = False  # the AITER build ships no OPUS: vLLM's getter returns None
    s.start(id="no-opus", candidate="gfx950_32", fraction=0.1, seed=2)
    for i in range(100):
        out, expected = s.call(ROWS, seed=i, sink=True, full_lanes=True)
        assert torch.equal(out, expected)
    assert s.helpers("opus") == 0 and s.entries() == 100
    item = s.report()
    assert item["never_moved"]["candidate_unavailable"] >= 1 and item["state"] == "running"
    assert s.obs.status()["routing"]["unavailable"] == {OPUS: 1}  # asked once: the cell then stays on A


def _ragged_call(s: Server, rows: int, seed: int, *, whole: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """One ragged-only call as GLM's pure-decode path makes it (indices=None, the backend's paged_kv_indices of
    rows x W slots and paged_kv_indptr); ``whole=False``: row 0 one slot short, so the buffer is not rows x W."""
    args, expected = prefill_args(rows, seed=seed, sink=True)
    idx = args[2]
    keep = idx >= 0
    ptr = torch.zeros(rows + 1, dtype=torch.int32)
    ptr[1:] = keep.sum(1).cumsum(0)
    flat = torch.zeros(idx.numel(), dtype=torch.int32)
    flat[: int(ptr[-1])] = idx[keep]
    if not whole:
        flat, ptr = flat[1:ptr[-1]], ptr - torch.tensor([0] + [1] * rows, dtype=torch.int32)
        idx = idx.clone()
        idx[0] = torch.cat([idx[0, 1:], idx.new_full((1,), -1)])  # the reference drops row 0's first slot too
        expected = _reference(args, idx)
    s.backend.forward_prefill(args[0], args[1], None, None, *args[4:], ragged_indices=flat, ragged_indptr=ptr)
    return args[-1], expected


def _reference(args: tuple, indices: torch.Tensor) -> torch.Tensor:
    from dispatcher.kernels.common import KernelArgs, SparseIndex
    from dispatcher.kernels.torch_ref import ragged_prefill

    out = torch.zeros_like(args[-1])
    ragged_prefill(KernelArgs(args[0], args[1], SparseIndex(indices, None), args[4], args[8], out))
    return out


def test_gfx942_arm_through_routescopes_aiter_adapter_on_a_vllm_without_the_branch(vllm_doubles, tmp_path):
    """vLLM 0.33.0 has no gfx942 branch: every call stays in-tree. Candidate gfx942_32 measures the seed's change
    (gate 32 here) anyway, launching pa_prefill_sparse through routescope's lazy AITER adapter (tests/dispatcher/aiter_double.py,
    AITER's TEST DOUBLE), for dense calls (made ragged by the adapter) and for ragged-only ones in vLLM's layout,
    handed over as AITER's CSR arguments, a buffer packed with no room to spare too."""
    aiter = aiter_double.install()
    try:
        s = Server(vllm_doubles, tmp_path, "gfx942", getters="opus_only", layout=Layout(aiter_module=aiter_double.NAME))
        # a gate below the active one sends mixed batches' decode rows onto pa_prefill_sparse: allowed explicitly
        s.start(id="g942", candidate="gfx942_32", fraction=0.1, seed=4, allow_decode_on_prefill=True)
        for i in range(200):
            out, expected = s.call(ROWS, seed=i, sink=True)
            assert torch.equal(out, expected), i
            s.call(16, seed=i)  # under the candidate's gate: the arms agree, not eligible
        n_dense = sum(1 for name, _ in aiter.calls if name == "pa_prefill_sparse")
        for i in range(200):
            out, expected = _ragged_call(s, ROWS, seed=1000 + i)
            assert torch.equal(out, expected), i
        n_b = sum(1 for name, _ in aiter.calls if name == "pa_prefill_sparse")
        item = s.report()
        cells = {c["shape"]: c for c in item["cells"]}
        assert len(cells) == 2 and {(c["kernel_a"], c["kernel_b"]) for c in cells.values()} == {(INTREE, PA)}
        ragged = next(c for shape, c in cells.items() if "ragged" in shape)
        dense = next(c for shape, c in cells.items() if "ragged" not in shape)
        assert dense["calls_b"] == n_dense >= 5 and ragged["calls_b"] == n_b - n_dense >= 5
        assert item["state"] == "running" and ragged["numerics"]["checked"] >= 1
        assert all(c["numerics"]["mismatched"] == 0 for c in cells.values())
        assert item["never_moved"].get("candidate_unavailable", 0) == 0
        for i in range(100):  # packed with no room to spare: still AITER's CSR form, handed over as it is
            out, expected = _ragged_call(s, ROWS, seed=2000 + i, whole=False)
            assert torch.equal(out, expected), i
        assert sum(1 for name, _ in aiter.calls if name == "pa_prefill_sparse") > n_b
        item = s.report()
        assert item["never_moved"].get("candidate_unavailable", 0) == 0 and item["state"] == "running"
        assert all(c["numerics"]["mismatched"] == 0 for c in item["cells"])
    finally:
        aiter_double.uninstall()


def test_gfx942_gate_raised_sends_seed_branch_calls_back_in_tree(vllm_doubles, tmp_path):
    """The seed's variant (the gfx942 branch in vLLM, its gate lowered to 32): candidate gfx942_64 runs the assigned
    48-row calls on vLLM's own in-tree helper (dense indices: _rocm_sparse_attn_prefill_triton)."""
    s = Server(vllm_doubles, tmp_path, "gfx942", gfx942_min=32)
    s.ops._ON_GFX942 = True
    # allowed explicitly: moving mixed batches' decode rows between two prefill kernels is refused by default
    s.start(id="up", candidate="gfx942_64", fraction=0.1, seed=9, allow_decode_on_prefill=True)
    for i in range(200):
        out, expected = s.call(ROWS, seed=i)
        assert torch.equal(out, expected)
    (cell,) = s.report()["cells"]
    assert (cell["kernel_a"], cell["kernel_b"]) == (PA, INTREE)
    assert s.helpers("intree_dense") == cell["calls_b"] >= 5
    assert sum(1 for e in s.ops.LOG if e[0] == "pa") == 200 - cell["calls_b"] + 1  # + the numerics sample's A


def test_split_below_and_decodes_split_k_use_vllms_split_k_decode(vllm_doubles, tmp_path):
    """No AITER branch on this arch (an H200's what-if): split_below_64 sends small prefill-entry calls to vLLM's
    rocm_sparse_attn_decode_bf16, called unwrapped (not counted as a decode-entry call)."""
    s = Server(vllm_doubles, tmp_path, "h200")
    s.start(id="split", candidate="split_below_64", fraction=0.1, seed=6)
    for i in range(200):
        out, expected = s.call(16, seed=i, sink=True, nope=12, rope=4)  # 16 lanes: vLLM's reduce needs a power of 2
        assert torch.equal(out, expected)
    item = s.report()
    (cell,) = item["cells"]
    assert (cell["kernel_a"], cell["kernel_b"]) == (INTREE, SPLIT_K)
    decodes = sum(1 for e in s.ops.LOG if e[:2] == ("decode", "rocm_sparse_attn_decode_bf16"))
    assert decodes == cell["calls_b"] >= 5
    tel = telemetry()
    tel.flush()
    assert samples(tel, "routescope_decode_path_calls_total") == 0
    assert "candidate_unavailable" not in item["never_moved"]
    for i in range(100):  # 8 + 4 lanes: vLLM's split-K cannot take them, so they stay on A
        out, expected = s.call(16, seed=i, sink=True, nope=8, rope=4)
        assert torch.equal(out, expected)
    assert s.report()["never_moved"]["candidate_unavailable"] >= 1
    assert sum(1 for e in s.ops.LOG if e[:2] == ("decode", "rocm_sparse_attn_decode_bf16")) == decodes


def test_decodes_split_k_moves_pure_decodes_reaching_the_prefill_entry(vllm_doubles, tmp_path):
    s = Server(vllm_doubles, tmp_path, "h200")
    s.start(id="dsk", candidate="decodes_split_k", fraction=0.1, seed=8)
    for step in range(150):
        with s.fc.set_forward_context({"layer.0": Meta(8, 8, 0, 0, 8)}):
            out, expected = s.call(8, seed=step, sink=True, nope=12, rope=4)
            assert torch.equal(out, expected)
        with s.fc.set_forward_context({"layer.0": Meta(0, 0, 1, 8, 8)}):
            s.call(8, seed=step, sink=True, nope=12, rope=4)  # a prefill: the arms agree
    (cell,) = s.report()["cells"]
    assert (cell["kernel_a"], cell["kernel_b"], cell["call_class"]) == (INTREE, SPLIT_K, "pure_decode")
    assert cell["calls_a"] + cell["calls_b"] == 150


def test_aa_runs_the_active_kernel_on_both_arms(vllm_doubles, tmp_path):
    s = Server(vllm_doubles, tmp_path, "h200")
    s.start(id="aa", candidate="aa", fraction=0.1, seed=10)
    for i in range(200):
        out, expected = s.call(32, seed=i)
        assert torch.equal(out, expected)
    (cell,) = s.report()["cells"]
    assert cell["kernel_a"] == cell["kernel_b"] == INTREE
    assert s.helpers("intree_dense") == cell["calls_b"] >= 5


def test_a_chooser_that_raises_leaves_the_call_on_a(vllm_doubles, tmp_path, monkeypatch):
    s = _opus_server(vllm_doubles, tmp_path)
    s.start(id="boom", candidate="gfx950_32", fraction=0.1)

    def boom(*a, **k):
        raise ValueError("planted chooser bug")

    monkeypatch.setattr(s.obs.router.chooser, "choose", boom)
    for i in range(10):
        out, expected = s.call(ROWS, seed=i, sink=True, full_lanes=True)
        assert torch.equal(out, expected)
    assert s.entries() == 10 and s.obs.status()["routing"]["errors"] == {"choose": 10}


def test_experiments_off_by_switch_or_without_a_directory(vllm_doubles, tmp_path):
    s = _opus_server(vllm_doubles, tmp_path, env={"ROUTESCOPE_VLLM_EXPERIMENTS": "0"})
    assert s.obs.router is None
    plugin.uninstall()
    d = vllm_doubles(getters="opus_only")
    d.ops()
    assert plugin.install(env={"ROUTESCOPE_VLLM": "1"}, platform=what_if("gfx950")) == "observing"
    assert plugin.current().observer.router is None


def test_a_stopped_experiment_moves_nothing_more(vllm_doubles, tmp_path):
    s = _opus_server(vllm_doubles, tmp_path)
    s.start(id="stopme", candidate="gfx950_32", fraction=0.1, seed=12)
    control.stop(s.dir, "stopme")
    s.flush()
    n = s.helpers("opus")
    for i in range(100):
        s.call(ROWS, seed=i, sink=True, full_lanes=True)
    assert s.helpers("opus") == n and s.entries() == 100
    assert s.report()["state"] == "stopped"


def test_an_experiment_refused_here_is_logged_and_nothing_is_moved(vllm_doubles, tmp_path, caplog):
    """gfx942_32 below the active gate would put mixed batches' decode rows on pa_prefill_sparse: every process
    refuses it when it picks the config up, says why, and the plugin goes on observing."""
    s = Server(vllm_doubles, tmp_path, "gfx942", getters="opus_only")
    with caplog.at_level("WARNING"):
        s.start(id="harm", candidate="gfx942_32", fraction=0.1, attached=False)
    assert any("would send decode rows onto a prefill kernel" in r.getMessage() for r in caplog.records)
    for i in range(20):
        out, expected = s.call(ROWS, seed=i)
        assert torch.equal(out, expected)
    assert s.entries() == 20 and s.obs.status()["routing"]["routed"] == {}


def test_a_kill_switch_on_the_call_path_stops_every_process(vllm_doubles, tmp_path):
    """A stop that fires inside a call (here the numerics sample) reaches the directory at the next flush: the stop
    file every other process honours, and this process's final state for the service."""
    s = _opus_server(vllm_doubles, tmp_path)
    s.start(id="spread", candidate="gfx950_32", fraction=0.1, seed=5)
    other = control.Registry(s.obs.platform, s.obs.policy, torch_mod=torch, directory=s.dir)  # another rank's
    other.flush()
    assert other.current is not None and other.current.running

    def wrong_opus(*, q, kv, indices, indptr, scale, attn_sink, output):
        output.fill_(3.0)
        return True

    s.ops._rocm_sparse_attn_prefill_ragged_aiter_opus = wrong_opus
    for i in range(80):
        s.call(ROWS, seed=i, sink=True, full_lanes=True)
    assert s.report()["state"] == "stopped"  # this process stopped at the numerics sample
    (shared,) = control.experiments(s.dir)  # what the service and every other process read
    assert shared["state"] == "stopped" and shared["stop_reason"] == "numerics"
    other.flush()
    assert not other.current.running and other.current.stop_reason == "numerics"
    other.close()
