"""The plugin's capture path on a real CUDA GPU (marker gpu): vLLM's prefill entry called while a CUDA graph is
captured gets a stamp bracket, and its replays read within 10% of CUPTI's span of the same replayed calls, median and
p90, at 2, 16, 256 and 4,096 rows, in graphs of 1 and of 8 calls, synced and back to back (as the Dispatcher's test,
tests/telemetry/test_gpu_graph_clock.py).

vLLM here is the TEST DOUBLES of tests/vllm_plugin/doubles.py, except for the attention itself: the double's in-tree
branch (under 512 rows) and its AITER branch (``pa_prefill_sparse``, from 512 rows on gfx942) both launch the
project's prefill kernel with its stamps withheld (a kernel that writes no stamps, as vLLM's own), on CUDA tensors,
inside a real torch.cuda.graph capture. The observer, its wrappers and telemetry are the plugin's own."""

from __future__ import annotations

import pytest
import torch

from dispatcher import Dispatcher, Policy, detect, what_if
from dispatcher.sweep.grid import Layout
from dispatcher.sweep.inputs import make_sets
from routescope.vllm import plugin
from telemetry import Telemetry, TelemetryConfig
from telemetry.bench.fidelity import _call_args, unstamped_registry
from telemetry.bench.graph_fidelity import BURST, REGIMES, calibrated, cupti_call_us, drive

from .conftest import Meta, telemetry

pytestmark = pytest.mark.gpu

LAYOUT = Layout(512, 64)
REPLAYS = 40  # per regime: synced replays, or back-to-back bursts


@pytest.mark.parametrize("calls", [1, 8])
@pytest.mark.parametrize("rows", [2, 16, 256, 4096])
def test_graph_replays_on_the_plugins_path_read_within_ten_percent_of_cupti(vllm_doubles, rows, calls):
    d = vllm_doubles()
    ops, backend, fc = d.ops(), d.backend(), d.fc()
    ops._ON_GFX942 = True
    bare = Dispatcher(platform=detect(), policy=Policy(), registry=unstamped_registry())

    def attend(q, kv, indices, topk_length, scale, attn_sink, out):  # the kernel vLLM would run: no stamps
        bare(q, kv, indices, topk_length, scale, LAYOUT.head_dim, LAYOUT.nope, LAYOUT.rope, attn_sink, out,
             num_decodes=q.shape[0], num_decode_tokens=q.shape[0], num_prefills=0)

    ops._attend = attend

    def factory(*, platform, policy, model, rank, **_):
        return Telemetry(TelemetryConfig(models=(model,), rank=rank, sample_first=1 << 30, sample_every=1,
                                         keep_samples=True, timing_gate=False), platform=platform, policy=policy)

    assert plugin.install(env={"ROUTESCOPE_VLLM": "1"}, platform=what_if("gfx942"), telemetry_factory=factory) \
        == "observing"
    sets = make_sets(rows, 2048, 16, LAYOUT, 8192, dtype=torch.bfloat16, device=torch.device("cuda"))
    work = [_call_args(sets[i % len(sets)], LAYOUT)[0] for i in range(calls)]

    def step():
        for args in work:  # one layer's call each, as a decode step's graph holds
            with fc.set_forward_context({"layer.0": Meta(rows, rows, 0, 0, rows)}):
                backend.forward_prefill(*args)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    tel = telemetry()
    assert calibrated(tel) > 0
    tel.flush()
    before = sum(tel.flush().replayed.values())
    for regime in REGIMES:
        tel.drain_samples()
        made = drive(graph, regime, REPLAYS, tel)
        got = sorted(s["seconds"] * 1e6 for s in tel.drain_samples() if s["clock"] == "bracket")
        ref = sorted(cupti_call_us(graph, regime, REPLAYS, calls, tel))
        assert len(got) >= REPLAYS // 2 * calls, (regime, len(got))
        assert len(ref) == made * calls, (regime, len(ref))
        for q in (0.5, 0.9):
            t, c = got[int(q * (len(got) - 1))], ref[int(q * (len(ref) - 1))]
            assert abs(t - c) / c <= 0.10, (regime, q, t, c)
    s = tel.flush()
    assert sum(s.replayed_untimed.values()) == 0
    assert sum(s.replayed.values()) - before >= 2 * (REPLAYS + REPLAYS * BURST) * calls, "every replayed call counted"
    assert plugin.current().observer.errors.get("prefill", 0) == 0
