"""The compiled Triton kernels on a real GPU at full shapes, bf16 and fp16, every edge case (marker gpu)."""

from __future__ import annotations

import pytest
import torch

from dispatcher.sweep.correctness import run_checks

pytestmark = pytest.mark.gpu


CONFIGS = {"default": None, "one-chain": (32, 4, 2, 1), "two-chains-3-stages": (64, 4, 3, 2),
           "capped-registers": (32, 4, 2, 4, 128)}


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_full_shapes_match_the_reference(compiled, dtype, config):
    prefill, decode = compiled
    cfg = prefill.TileConfig(*CONFIGS[config]) if CONFIGS[config] else None
    launchers = {"prefill": lambda a: prefill.launch(a, config=cfg), "decode": lambda a: decode.launch(a, config=cfg)}
    found = run_checks(launchers, (dtype,), torch.device("cuda"), big=False)
    bad = [c for c in found if not c.ok]
    assert not bad, "\n".join(map(str, bad))


FP8_GPU = ["float8_e4m3fnuz", "float8_e5m2fnuz"] if torch.version.hip else ["float8_e4m3fn", "float8_e5m2"]


@pytest.mark.parametrize("kv_dtype", FP8_GPU)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fp8_pools_match_the_reference_through_the_registry(compiled, dtype, kv_dtype):
    """An fp8 kv pool beside a 16-bit q: the registry's first choice runs it on the GPU (no torch fallback): on
    Hopper in Gluon (the warp-specialised prefill, the one-warpgroup decode), elsewhere in Triton, and every case at
    full shapes, the 16,384-row prefill and the 4.2M-row pool included, matches the reference."""
    from dispatcher.kernels import gluon_sm90
    from dispatcher.kernels.registry import default_registry
    from dispatcher.types import Kernel

    reg = default_registry()
    ran = {"prefill": set(), "decode": set()}

    def via(name, kernel):
        impl = reg.resolve(kernel, "cuda")
        return lambda a: ran[name].add(impl.launch(a) or impl.impl)

    launchers = {"prefill": via("prefill", Kernel.INTREE_RAGGED_PREFILL),
                 "decode": via("decode", Kernel.INTREE_SPARSE_DECODE)}
    found = run_checks(launchers, (dtype,), torch.device("cuda"), kv_dtype=getattr(torch, kv_dtype))
    bad = [c for c in found if not c.ok]
    assert not bad, "\n".join(map(str, bad))
    assert len(found) == 2 * 18 and all(kv_dtype in c.dtype for c in found)
    hopper = gluon_sm90.HAVE_GLUON and gluon_sm90._on_hopper(torch.empty(0, device="cuda"))
    # on Hopper the outputs past 512 lanes go to Triton, as a 16-bit pool's do
    want = {"gluon", "triton"} if hopper else {"triton"}
    assert ran == {"prefill": want, "decode": want}, ran


PTX_CASES = [("float8_e4m3fn", torch.bfloat16, 1), ("float8_e5m2", torch.bfloat16, 2),
             ("float8_e4m3fn", torch.float16, 3), ("float8_e5m2", torch.float16, 4)]


@pytest.mark.skipif(bool(torch.version.hip), reason="PTX: NVIDIA only")
@pytest.mark.parametrize(("kv_dtype", "dtype", "mode"), PTX_CASES, ids=[f"mode{m}" for *_, m in PTX_CASES])
def test_fp8_ptx_conversion_is_exact_for_every_byte(compiled, kv_dtype, dtype, mode):
    """Each PTX conversion of fp8_ptx against torch's for all 256 bytes: the same bits, or NaN for NaN."""
    from dispatcher.kernels import fp8_ptx

    pool = torch.arange(256, dtype=torch.int32, device="cuda").to(torch.uint8).repeat(5).view(getattr(torch, kv_dtype))
    got, want = fp8_ptx.convert(pool, dtype, mode), pool.to(dtype)
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    bad = (got.view(torch.int16) != want.view(torch.int16)) & ~nan
    assert not bad.any(), [(hex(int(b)), float(g), float(w)) for b, g, w in
                           zip(pool.view(torch.uint8)[bad][:8], got[bad][:8], want[bad][:8])]
    assert fp8_ptx.kv_operand(pool, dtype)[1] == mode  # what a launch picks here


@pytest.mark.parametrize("kv_dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_pools_through_to_match_the_reference(compiled, kv_dtype):
    """The ``.to()`` conversion the PTX replaced, still taken on ROCm and before sm_89, forced here on one dtype."""
    prefill, decode = compiled
    launchers = {"prefill": lambda a: prefill.launch(a, kv8=0), "decode": lambda a: decode.launch(a, kv8=0)}
    found = run_checks(launchers, (torch.bfloat16,), torch.device("cuda"), big=False,
                       kv_dtype=getattr(torch, kv_dtype))
    bad = [c for c in found if not c.ok]
    assert not bad, "\n".join(map(str, bad))


@pytest.mark.parametrize(("impl", "split_counts", "lanes"), [
    ("triton", (1, 2, 5, 22, 64), 64), ("sm90", (1, 2, 5, 11, 64), 64), ("sm90-ws", (1, 2, 3, 11, 64), 64),
    ("sm90", (1, 2, 5, 11, 64), 0)])  # D = 512: the pipelined partial kernel (decode_config)
def test_forced_split_counts_agree(compiled, impl, split_counts, lanes):
    """Every split count, including more splits than tiles, gives the same implementation's prefill answer."""
    from dispatcher.sweep.correctness import build
    from dispatcher.sweep.grid import Layout

    prefill, decode = compiled
    if impl.startswith("sm90"):
        g = _hopper()
        ws = impl == "sm90-ws"  # the warp-specialised kernel's partials (splits as work items)
        prefill_launch = g.launch_prefill

        def decode_launch(a, splits):
            g.launch_decode(a, splits=splits, ws=ws)
    else:
        prefill_launch, decode_launch = prefill.launch, decode.launch
    args = build(16, layout=Layout(512, lanes), dtype=torch.bfloat16, device=torch.device("cuda"), topk=700)
    base = args._replace(output=torch.full_like(args.output, float("nan")))
    prefill_launch(base)
    for splits in split_counts:
        a = args._replace(output=torch.full_like(args.output, float("nan")))
        decode_launch(a, splits=splits)
        torch.testing.assert_close(a.output.float(), base.output.float(), atol=2e-2, rtol=2e-2)


def test_dispatcher_reports_triton_on_gpu(compiled):
    from dispatcher import Dispatcher
    from dispatcher.kernels.registry import default_registry
    from dispatcher.types import Kernel

    reg = default_registry(gluon=False)
    assert reg.resolve(Kernel.INTREE_RAGGED_PREFILL, "cuda").impl == "triton"
    assert reg.resolve(Kernel.INTREE_SPARSE_DECODE, "cuda").impl == "triton"
    d = Dispatcher(registry=reg)
    q = torch.randn(4, 16, 576, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(64, 1, 576, device="cuda", dtype=torch.bfloat16)
    idx = torch.randint(0, 64, (4, 32), device="cuda", dtype=torch.int32)
    out = torch.empty(4, 16, 512, device="cuda", dtype=torch.bfloat16)
    decision = d(q, kv, idx, None, 0.04, 576, 512, 64, None, out)
    assert decision.kernel in (Kernel.INTREE_RAGGED_PREFILL, Kernel.INTREE_SPARSE_DECODE)
    assert torch.isfinite(out.float()).all()


@pytest.mark.parametrize("rows", [2, 16, 300])
def test_pdl_reduce_matches_a_plain_launch(compiled, rows):
    """PDL changes when the reduce is scheduled, never what it computes: outputs are bitwise equal."""
    from dispatcher.sweep.correctness import build
    from dispatcher.sweep.grid import Layout

    _, decode = compiled
    if not decode.pdl_supported(torch.device("cuda")):
        pytest.skip("this GPU or Triton has no programmatic dependent launch")
    args = build(rows, layout=Layout(512, 64), dtype=torch.bfloat16, device=torch.device("cuda"), topk=2048)
    outs = []
    for pdl in (False, True):
        a = args._replace(output=torch.full_like(args.output, float("nan")))
        decode.launch(a, pdl=pdl)
        outs.append(a.output)
    assert torch.equal(outs[0], outs[1])


def test_decode_replays_in_a_cuda_graph(compiled):
    """vLLM captures decode in CUDA graphs: a captured split-K decode (PDL included) replays to the eager answer."""
    from dispatcher.sweep.correctness import build
    from dispatcher.sweep.grid import Layout

    _, decode = compiled
    args = build(16, layout=Layout(512, 64), dtype=torch.bfloat16, device=torch.device("cuda"), topk=2048)
    eager = args._replace(output=torch.full_like(args.output, float("nan")))
    decode.launch(eager)
    captured = args._replace(output=torch.full_like(args.output, float("nan")))
    decode.launch(captured)  # compile and warm outside the capture
    captured.output.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode.launch(captured)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured.output, eager.output)


# ---- the Hopper Gluon kernels (dispatcher/kernels/gluon_sm90.py) ---------------------------------------------

def _hopper():
    from dispatcher.kernels import gluon_sm90

    if not gluon_sm90.HAVE_GLUON or not gluon_sm90._on_hopper(torch.empty(0, device="cuda")):
        pytest.skip("needs an sm_90 GPU and a Triton with Gluon")
    return gluon_sm90


SM90_CONFIGS = {"default": None, "3-stages-one-rope-buffer": {"stages": 3, "rope1": True, "chains": 2},
                "one-chain": {"stages": 2, "chains": 1},
                "ws-decode": "ws", "ws-whole-stages": "whole",
                # every prefill with the exact running max, or with the reference max (flags and the redo),
                # whatever gluon_sm90_ws.reference_pays would choose: gluon_sm90_ws's two specialisations
                "prefill-exact-max": "exact", "prefill-reference-max": "reference"}


@pytest.mark.parametrize("config", list(SM90_CONFIGS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_sm90_full_shapes_match_the_reference(compiled, dtype, config, monkeypatch):
    """Every correctness case; the calls the Hopper kernels do not take go to Triton (counted, and few)."""
    g = _hopper()
    prefill, decode = compiled
    spec = SM90_CONFIGS[config]
    if spec in ("exact", "reference"):
        from dispatcher.kernels import gluon_sm90_ws

        monkeypatch.setattr(gluon_sm90_ws, "prefill_reference", lambda a: spec == "reference")
    kw = {"config": g.Sm90Config(**spec)} if isinstance(spec, dict) else {}
    took = {"gluon": 0, "triton": 0}

    def either(fast, slow):
        def fn(a):
            if g.supports(a):
                took["gluon"] += 1
                if spec == "whole" and fast is g.launch_prefill:  # gluon_sm90_ws, whole-stage hand-over, any layout
                    from dispatcher.kernels import gluon_sm90_ws

                    gluon_sm90_ws.launch_prefill_ws(a, halves=False)
                    return
                fast(a, **kw, **({"ws": True} if spec == "ws" and fast is g.launch_decode else {}))
            else:
                took["triton"] += 1
                slow(a)
        return fn

    launchers = {"prefill": either(g.launch_prefill, prefill.launch), "decode": either(g.launch_decode, decode.launch)}
    found = run_checks(launchers, (dtype,), torch.device("cuda"), big=False)
    bad = [c for c in found if not c.ok]
    assert not bad, "\n".join(map(str, bad))
    assert took["gluon"] >= 3 * took["triton"], took


REDO_CASES = {  # kv rows c q (head 0) in tile 16 of rows 3 and 7: (c, the rows flagged in bf16, in fp16)
    "2^200-above": (6.0, [3, 7], [3, 7]),  # P would overflow float32 in either dtype
    "2^30-above": (1.0, [], [3, 7]),  # P fits bf16 (kept), not fp16 (largest 65,504)
}


@pytest.mark.parametrize("layout", ["512+64", "512+0"])
@pytest.mark.parametrize("case", list(REDO_CASES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_sm90_prefill_computes_again_the_items_whose_scores_pass_its_reference(compiled, dtype, case, layout,
                                                                               monkeypatch):
    """The warp-specialised prefill keeps each item's first finite max as P's reference. In rows 3 and 7, tile 16's
    64 slots hold kv rows c q of head 0, so head 0 scores there far above it: the items whose P outgrows its
    dtype are flagged, and only those, Triton computes them again, and every row matches the reference; the
    default launch at 64 items computes them again in the kernel itself, to the same bits elsewhere. With rope
    lanes (512+64) and at D = 512 (512+0): the prefill takes this kernel at both layouts."""
    g = _hopper()
    from dispatcher.kernels import gluon_sm90_ws
    from dispatcher.kernels.torch_ref import ragged_prefill
    from dispatcher.sweep.correctness import build
    from dispatcher.sweep.grid import Layout

    dev = torch.device("cuda")
    a = build(64, layout=Layout(*map(int, layout.split("+"))), dtype=dtype, device=dev, kv_len=8192, pad=False,
              bad_slots=False)
    idx, extra = a.index.indices.clone(), []
    for k, r in enumerate((3, 7)):
        idx[r, 1024:1088] = 8192 + 64 * k + torch.arange(64, device=dev, dtype=idx.dtype)
        extra.append((REDO_CASES[case][0] * a.q[r, 0].float()).to(dtype).expand(64, 1, -1))
    a = a._replace(kv=torch.cat([a.kv] + extra), index=a.index._replace(indices=idx))
    flagged = []
    redo = gluon_sm90_ws.redo_flagged
    monkeypatch.setattr(gluon_sm90_ws, "redo_flagged", lambda args, flags: (flagged.append(flags.clone()),
                                                                            redo(args, flags)))
    got = a._replace(output=torch.full_like(a.output, float("nan")))
    assert gluon_sm90_ws.prefill_reference(got) and g.ws_module(got) is gluon_sm90_ws  # top-k 2048: it pays
    gluon_sm90_ws.launch_prefill_ws(got)  # the kernel, then redo_flagged with its flags
    assert torch.nonzero(flagged[0]).flatten().tolist() == REDO_CASES[case][1 if dtype == torch.bfloat16 else 2]
    # the prefill's default (gluon_sm90_ws at either layout): at 64 items the same kernel computes its flagged items
    # again itself (gluon_sm90_redo): every other row the same bits, the flags zeroed for the next call
    default = a._replace(output=torch.full_like(a.output, float("nan")))
    assert gluon_sm90_ws.redo_in_kernel(default)
    g.launch_prefill(default)
    torch.cuda.synchronize()
    again = set(torch.nonzero(flagged[0]).flatten().tolist())
    kept = [r for r in range(64) if r not in again]
    assert all(torch.equal(default.output[r], got.output[r]) for r in kept)
    from dispatcher.kernels.scratch import scratch

    flags = scratch().get("redo_flags", 1, torch.int32, dev, torch.cuda.current_stream().cuda_stream, zeroed=True)
    assert not flags.any()  # zeroed by the kernel that read them, for the next call
    ref = a._replace(output=torch.empty(a.output.shape, dtype=torch.float32, device=dev))
    ragged_prefill(ref)
    for out in (got.output.float(), default.output.float()):  # Triton's redo, and the kernel's own
        assert torch.isfinite(out).all()
        for r in range(64):
            err = ((out[r] - ref.output[r]).norm() / ref.output[r].norm().clamp_min(1e-6)).item()
            assert err < 1e-2, (r, err)


@pytest.mark.parametrize("stages", [3, 2])
@pytest.mark.parametrize("kv_dtype", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_sm90_decode_reads_fp8_pools(compiled, dtype, kv_dtype, stages):
    """The Hopper partial kernel on an fp8 pool's bytes, each tile converted in shared memory: every case; the calls
    it does not take (output rows past 512 lanes) go to Triton, as a 16-bit pool's do."""
    g = _hopper()
    _, triton_decode = compiled
    cfg = g.Sm90Config(stages)
    took = {"gluon": 0, "triton": 0}

    def decode(a):
        assert not g.supports(a)  # the one-warpgroup prefill takes no fp8 pool
        if g.supports_decode(a):
            took["gluon"] += 1
            g.launch_decode(a, config=cfg)
        else:
            took["triton"] += 1
            triton_decode.launch(a)

    found = run_checks({"decode": decode}, (dtype,), torch.device("cuda"), big=stages == 3,
                       kv_dtype=getattr(torch, kv_dtype))
    bad = [c for c in found if not c.ok]
    assert not bad, "\n".join(map(str, bad))
    assert took["gluon"] >= 3 * took["triton"] and len(found) >= 16, took


@pytest.mark.parametrize("kv_dtype", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_sm90_ws_kernel_reads_fp8_pools(compiled, dtype, kv_dtype):
    """The warp-specialised kernel on an fp8 pool, each tile's bytes converted in the stage they land in: the
    prefill at full shapes (the 16,384-row call included) and its split-K partials (``ws=True``) on every
    case; rows past 512 output lanes go to Triton."""
    from dispatcher.kernels import gluon_sm90_ws

    g = _hopper()
    triton_prefill, triton_decode = compiled
    took = {"gluon": 0, "triton": 0}

    def pick(launch, fallback):
        def fn(a):
            assert g.supports_prefill(a) == g.supports_decode(a)
            ok = g.supports_prefill(a)
            took["gluon" if ok else "triton"] += 1
            (launch if ok else fallback)(a)
        return fn

    launchers = {"prefill": pick(gluon_sm90_ws.launch_prefill_ws, triton_prefill.launch),
                 "decode": pick(lambda a: g.launch_decode(a, ws=True, pdl=False), triton_decode.launch)}
    found = run_checks(launchers, (dtype,), torch.device("cuda"), big=dtype == torch.bfloat16,
                       kv_dtype=getattr(torch, kv_dtype))
    bad = [c for c in found if not c.ok]
    assert not bad, "\n".join(map(str, bad))
    assert took["gluon"] >= 3 * took["triton"] and len(found) >= 32, took


def test_registry_runs_gluon_on_hopper_and_hands_fp32_to_triton(compiled):
    from dispatcher import Dispatcher
    from dispatcher.kernels.common import KernelArgs, SparseIndex
    from dispatcher.kernels.registry import default_registry
    from dispatcher.types import Kernel

    _hopper()
    reg = default_registry(gluon=True)
    for kernel in (Kernel.INTREE_RAGGED_PREFILL, Kernel.INTREE_SPARSE_DECODE):
        impl = reg.resolve(kernel, "cuda")
        assert impl.impl == "gluon"
        for dtype, expected in ((torch.bfloat16, "gluon"), (torch.float32, "triton")):
            q = torch.randn(4, 16, 576, device="cuda", dtype=dtype)
            kv = torch.randn(64, 1, 576, device="cuda", dtype=dtype)
            idx = torch.randint(0, 64, (4, 32), device="cuda", dtype=torch.int32)
            out = torch.full((4, 16, 512), float("nan"), device="cuda", dtype=dtype)
            assert impl.launch(KernelArgs(q, kv, SparseIndex(idx, None), 0.04, None, out)) == expected
            assert torch.isfinite(out.float()).all()
    d = Dispatcher(registry=reg)
    q = torch.randn(4, 16, 576, device="cuda", dtype=torch.bfloat16)
    out = torch.full((4, 16, 512), float("nan"), device="cuda", dtype=torch.bfloat16)
    d(q, torch.randn(64, 1, 576, device="cuda", dtype=torch.bfloat16),
      torch.randint(0, 64, (4, 32), device="cuda", dtype=torch.int32), None, 0.04, 576, 512, 64, None, out)
    assert torch.isfinite(out.float()).all()


@pytest.mark.parametrize("lanes", [64, 0], ids=["512+64", "512+0-pipelined"])
def test_sm90_decode_replays_in_a_cuda_graph(compiled, lanes):
    from dispatcher.sweep.correctness import build
    from dispatcher.sweep.grid import Layout

    g = _hopper()
    args = build(16, layout=Layout(512, lanes), dtype=torch.bfloat16, device=torch.device("cuda"), topk=2048)
    eager = args._replace(output=torch.full_like(args.output, float("nan")))
    g.launch_decode(eager, fused=False)  # a capture takes the two launches (an eager call, the one: gluon_sm90)
    captured = args._replace(output=torch.full_like(args.output, float("nan")))
    g.launch_decode(captured)
    captured.output.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g.launch_decode(captured)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured.output, eager.output)
