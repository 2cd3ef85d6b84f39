"""The Triton prefill and split-K decode under TRITON_INTERPRET=1, against the torch reference and a float64 loop.

The interpreter's tl.dot is exact for fp16 and fp32 operands (it returns garbage for bf16),
so these tests use those; bf16 is checked on a GPU (test_triton_gpu.py).
"""

from __future__ import annotations

import pytest
import torch

from dispatcher.kernels.torch_ref import ragged_prefill as torch_prefill

from .cases import Case, make_case

TOL = {torch.float16: dict(atol=3e-3, rtol=3e-3), torch.float32: dict(atol=2e-5, rtol=2e-5)}


def run(kernels, which: str, case: Case, **kw) -> torch.Tensor:
    prefill, decode = kernels
    if "config" in kw:  # a plain tuple here, so collecting this file does not import triton
        kw = {**kw, "config": prefill.TileConfig(*kw["config"])}
    args = case.fresh_output()
    (prefill.launch if which == "prefill" else decode.launch)(args, **kw)
    return args.output


def check(case: Case, got: torch.Tensor, dtype: torch.dtype) -> None:
    assert not torch.isnan(got).any(), "an output element was never written"
    exp = case.expected()
    torch.testing.assert_close(got.double(), exp, **TOL[dtype])
    ref_args = case.fresh_output()
    torch_prefill(ref_args)
    torch.testing.assert_close(got.float(), ref_args.output.float(), **TOL[dtype])
    for i, slots in enumerate(case.slots):
        if not slots:
            assert torch.equal(got[i], torch.zeros_like(got[i])), f"row {i} has no valid slot and must be 0"


ONE_CHAIN = (16, 4, 2, 1)  # block_n 16, the head block as one MMA chain (the default cuts it in up to 4)
KERNELS = [("prefill", {}), ("decode", {}), ("decode", {"splits": 3}), ("decode", {"splits": 1}),
           ("prefill", {"config": ONE_CHAIN}),
           ("decode", {"config": ONE_CHAIN, "splits": 3, "reduce_values": 32}),
           ("decode", {"splits": 3, "reduce_heads": 4, "reduce_values": 128})]
KERNEL_IDS = ["prefill", "decode", "decode-3splits", "decode-1split", "prefill-one-chain",
              "decode-one-chain-3splits-16lanes", "decode-3splits-4heads-reduced-together"]


@pytest.mark.parametrize(("which", "kw"), KERNELS, ids=KERNEL_IDS)
@pytest.mark.parametrize("layout", ["v32", "dsv4", "glm", "odd"])
@pytest.mark.parametrize("out_full", [False, True], ids=["nope-out", "full-out"])
@pytest.mark.parametrize("sink", [False, True], ids=["nosink", "sink"])
def test_layouts_sinks_outputs(interp, which, kw, layout, out_full, sink):
    case = make_case(1, layout=layout, sink=sink, out_full=out_full)
    check(case, run(interp, which, case, **kw), torch.float16)


EDGE = {
    "interleaved-minus-one": dict(interleaved=True),
    "topk-length-short": dict(topk_length="short"),
    "topk-length-wild": dict(topk_length="wild", sink=True),
    "ragged": dict(ragged=True),
    "ragged-topk-length": dict(ragged=True, topk_length="wild", sink=True),
    "int64-indices": dict(index_dtype=torch.int64, topk_length="short"),
    "int64-ragged": dict(ragged=True, index_dtype=torch.int64, sink=True),
    "two-head-blocks": dict(heads=20, sink=True),
    "one-head": dict(heads=1),
    "wide-topk": dict(topk=150, skv=200),
    "tiny-topk": dict(topk=1, skv=3),
    "fp32": dict(dtype=torch.float32, sink=True, out_full=True),
    "fp32-ragged": dict(dtype=torch.float32, ragged=True, topk_length="short"),
}


@pytest.mark.parametrize(("which", "kw"), KERNELS, ids=KERNEL_IDS)
@pytest.mark.parametrize("edge", list(EDGE))
def test_edge_cases(interp, which, kw, edge):
    opts = EDGE[edge]
    case = make_case(7, **opts)
    check(case, run(interp, which, case, **kw), opts.get("dtype", torch.float16))


@pytest.mark.parametrize(("which", "kw"), KERNELS[:2] + KERNELS[4:], ids=KERNEL_IDS[:2] + KERNEL_IDS[4:])
def test_strided_operands(interp, which, kw):
    """q, kv and output as non-contiguous views: the kernels must honour every stride."""
    case = make_case(3, layout="v32", sink=True)
    a = case.args
    q_big = torch.randn(a.q.shape[0], a.q.shape[1] * 2, a.q.shape[2] + 8).half()
    q_big[:, ::2, 4 : 4 + a.q.shape[2]] = a.q
    kv_big = torch.randn(a.kv.shape[0], 1, a.kv.shape[2] + 16).half()
    kv_big[:, :, : a.kv.shape[2]] = a.kv
    args = a._replace(q=q_big[:, ::2, 4 : 4 + a.q.shape[2]], kv=kv_big[:, :, : a.kv.shape[2]])
    out_big = torch.full((a.output.shape[1], a.output.shape[0], a.output.shape[2]), float("nan")).half()
    args = args._replace(output=out_big.transpose(0, 1))
    prefill, decode = interp
    if "config" in kw:
        kw = {**kw, "config": prefill.TileConfig(*kw["config"])}
    (prefill.launch if which == "prefill" else decode.launch)(args, **kw)
    check(case, args.output, torch.float16)


@pytest.mark.parametrize("which", ["prefill", "decode"])
def test_no_rows_is_a_no_op(interp, which):
    case = make_case(2, sq=3)
    a = case.args
    empty = a._replace(q=a.q[:0], output=a.output[:0], index=a.index._replace(indices=a.index.indices[:0]))
    prefill, decode = interp
    (prefill.launch if which == "prefill" else decode.launch)(empty)


@pytest.mark.parametrize("which", ["prefill", "decode"])
def test_unsupported_dtypes_fall_back_to_torch(interp, which):
    """kv in another 16/32-bit dtype than q is served by the torch implementation, same answer."""
    case = make_case(4, dtype=torch.float32, sink=True)
    a = case.args
    args = a._replace(kv=a.kv.to(torch.bfloat16), output=torch.full_like(a.output, float("nan")))
    prefill, decode = interp
    (prefill.launch if which == "prefill" else decode.launch)(args)
    ref = a._replace(kv=args.kv, output=torch.full_like(a.output, float("nan")))
    torch_prefill(ref)
    torch.testing.assert_close(args.output, ref.output, atol=1e-5, rtol=1e-5)


def test_prefill_redo_writes_only_the_flagged_items(interp):
    """``redo`` (the Hopper prefill's items to compute again): an item is (row, head block of 16), flagged row-major;
    flagged items get the reference's answer, the rest of the output is left as it was."""
    prefill, _ = interp
    case = make_case(7, sq=5, heads=20)  # two head blocks: heads 0-15 and 16-19
    args = case.fresh_output()
    flags = torch.zeros(5 * 2, dtype=torch.int32)
    flags[2 * 2 + 1] = 1  # row 2, heads 16-19
    flags[4 * 2 + 0] = 1  # row 4, heads 0-15
    prefill.launch(args, redo=flags)
    got, exp = args.output, case.expected()
    torch.testing.assert_close(got[2, 16:].double(), exp[2, 16:], **TOL[torch.float16])
    torch.testing.assert_close(got[4, :16].double(), exp[4, :16], **TOL[torch.float16])
    written = torch.zeros(got.shape[:2], dtype=torch.bool)
    written[2, 16:] = written[4, :16] = True
    assert torch.isnan(got[~written]).all() and not torch.isnan(got[written]).any()


def test_prefill_redo_programs_scan_spans_of_flags_and_compute_each_flagged_item(interp):
    """80 items (40 rows, two head blocks) on the interpreter's 8 "multiprocessors": 16 programs of 5 items each.
    Flags on both sides of a program's edge, two in one span and the very last item: exactly those are written."""
    prefill, _ = interp
    assert prefill.redo_span(80, 8) == 5
    case = make_case(7, sq=40, heads=20)
    args = case.fresh_output()
    flags = torch.zeros(80, dtype=torch.int32)
    picked = [4, 5, 6, 79]  # items 4 | 5, 6 (program 0 | 1) and 79 (the last program's last)
    flags[picked] = 1
    prefill.launch(args, redo=flags)
    got, exp = args.output, case.expected()
    written = torch.zeros(got.shape[:2], dtype=torch.bool)
    for w in picked:
        row, hb = divmod(w, 2)
        written[row, 16 * hb:16 * hb + 16] = True
        torch.testing.assert_close(got[row, 16 * hb:16 * hb + 16].double(), exp[row, 16 * hb:16 * hb + 16],
                                   **TOL[torch.float16])
    assert torch.isnan(got[~written]).all() and not torch.isnan(got[written]).any()


def test_redo_span_keeps_about_two_programs_a_multiprocessor_and_at_most_64_flags_each():
    from dispatcher.kernels.triton_prefill import REDO_SPAN, redo_span

    assert redo_span(16384, 132) == 63 and redo_span(16384 * 2, 132) == REDO_SPAN == 64
    assert redo_span(2048, 132) == 8 and redo_span(16, 132) == 1 and redo_span(1, 132) == 1
    assert redo_span(10 ** 9, 132) == 64  # a huge call: more programs, never a longer scan


def test_prefill_redo_flags_must_be_one_int32_per_item(interp):
    prefill, _ = interp
    case = make_case(7, sq=5, heads=20)
    for bad in (torch.zeros(5, dtype=torch.int32), torch.zeros(10, dtype=torch.int64)):
        with pytest.raises(ValueError, match="one int32 flag per item"):
            prefill.launch(case.fresh_output(), redo=bad)


FP8 = [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
       if hasattr(torch, n)]


@pytest.mark.parametrize(("which", "kw"), KERNELS[:3] + KERNELS[4:5], ids=KERNEL_IDS[:3] + KERNEL_IDS[4:5])
@pytest.mark.parametrize("kv_dtype", FP8, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("layout", ["v32", "odd"])
def test_fp8_kv_pools_run_in_triton_with_the_references_answer(interp, which, kw, kv_dtype, layout):
    """An fp8 pool beside an fp16 q: Triton runs it (no torch fallback), converting each tile exactly."""
    prefill, _ = interp
    case = make_case(11, layout=layout, sink=True, interleaved=True, kv_dtype=kv_dtype)
    assert case.args.kv.dtype == kv_dtype and prefill.triton_supports(case.args)
    check(case, run(interp, which, case, **kw), torch.float16)


def test_fp8_kv_support_follows_the_device(interp):
    prefill, _ = interp
    e4m3, e5m2 = torch.float8_e4m3fn, torch.float8_e5m2
    assert set(prefill.fp8_kv_dtypes(torch.device("cpu"))) == set(FP8)  # the interpreter converts all four
    gpu = prefill.fp8_kv_dtypes(torch.device("cuda"))
    assert set(gpu) == ({torch.float8_e4m3fnuz, torch.float8_e5m2fnuz} if torch.version.hip else {e4m3, e5m2})
    case = make_case(12, kv_dtype=e4m3)
    assert not prefill.triton_supports(case.args._replace(q=case.args.q.to(torch.int8)))  # q must be a float


def test_split_choice_covers_the_gpu_and_respects_bounds(interp):
    _, decode = interp
    assert decode.choose_splits(2, 1, 2048, 32, 132) == 64  # capped by MAX_SPLITS and tiles
    assert decode.choose_splits(16, 1, 2048, 32, 132) == 16  # 4 tiles each, 256 programs
    assert decode.choose_splits(16384, 1, 2048, 32, 132) == 1
    assert decode.choose_splits(2, 1, 40, 32, 132) == 2  # never more splits than tiles
    for rows in (1, 2, 3, 16, 100, 300, 5000):
        s = decode.choose_splits(rows, 1, 2048, 32, 132)
        assert 1 <= s <= decode.MAX_SPLITS


def test_reduce_blocks_cover_every_split_and_lane(interp):
    _, decode = interp
    assert decode.reduce_blocks(64, 512, 4096) == (64, 64)
    assert decode.reduce_blocks(64, 512, 2048) == (64, 32)
    assert decode.reduce_blocks(3, 24, 32) == (4, 16)  # several lane blocks for a 24-lane output
    assert decode.reduce_blocks(1, 576, 4096) == (2, 1024)
    assert decode.reduce_blocks(8, 512, 8192, heads=2) == (8, 512)  # two heads' 512 lanes in one program
    assert decode.reduce_blocks(8, 512, 4096, heads=4) == (8, 128)


@pytest.mark.parametrize("heads", [0, 3])
def test_reduce_heads_per_program_must_be_a_power_of_two(interp, heads):
    _, decode = interp
    case = make_case(2)
    with pytest.raises(ValueError, match="power of two"):
        decode.launch(case.fresh_output(), splits=2, reduce_heads=heads)


def test_head_dim_split(interp):
    prefill, _ = interp
    assert prefill.split_head_dim(576) == (512, 64)
    assert prefill.split_head_dim(512) == (512, 0)
    assert prefill.split_head_dim(48) == (32, 16)
    assert prefill.split_head_dim(40) == (32, 16)  # remainder 8 padded to tl.dot's minimum
    assert prefill.split_head_dim(56) == (32, 32)


def test_pdl_only_where_the_device_can_do_it(interp, monkeypatch):
    """Programmatic dependent launch needs an NVIDIA GPU: never on CPU, never on ROCm, never without gdc."""
    _, decode = interp
    assert decode.pdl_supported(torch.device("cpu")) is False
    monkeypatch.setattr(decode, "HAVE_GDC", False)
    assert decode.pdl_supported(torch.device("cuda", 0)) is False  # answered before any CUDA call
    monkeypatch.setattr(decode, "HAVE_GDC", True)
    monkeypatch.setattr(torch.version, "hip", "6.2", raising=False)
    assert decode.pdl_supported(torch.device("cuda", 0)) is False


def test_chunks_shrink_to_fit_the_head_block(interp):
    prefill, _ = interp
    assert prefill.chunks_for(512, 4) == 4  # 128-lane chunks
    assert prefill.chunks_for(512, 3) == 2  # only 1, 2 or 4
    assert prefill.chunks_for(32, 4) == 2  # 16 lanes is the least a chunk may have
    assert prefill.chunks_for(16, 4) == 1
    assert prefill.chunks_for(64, 1) == 1


def _stamp_table():
    from dispatcher.kernels.stamps import DeviceStamp

    times, counts = torch.zeros(8, 2, dtype=torch.int64), torch.zeros(8, dtype=torch.int32)
    return times, counts, lambda at: DeviceStamp(times, counts, at)


@pytest.mark.parametrize("which", ["prefill", "decode"])
def test_a_stamped_call_gets_its_start_from_the_first_kernel_and_its_end_from_the_last(interp, which):
    """Under the interpreter the clock is a constant (start 1, end 2): the entry asked for is written, by the right
    kernels, the counter is back to zero for the entry's next use, and the stamp is armed; no other entry moves."""
    prefill, decode = interp
    times, counts, stamp_at = _stamp_table()
    case = make_case(3, sq=6, heads=20)
    for _ in range(2):  # twice: the counter the first call left must serve the second
        args = case.fresh_output()._replace(stamp=stamp_at(3))
        (prefill if which == "prefill" else decode).launch(args)
        assert args.stamp.armed
        assert times[3].tolist() == [1, 2] and not times[torch.arange(8) != 3].any()
        assert not counts.any()
        check(case, args.output, torch.float16)
        times.zero_()


def test_an_unstamped_call_writes_no_stamp(interp):
    prefill, decode = interp
    times, counts, _ = _stamp_table()
    case = make_case(3, sq=6, heads=20)
    for mod in (prefill, decode):
        args = case.fresh_output()
        mod.launch(args)
        check(case, args.output, torch.float16)
    assert not times.any() and not counts.any()


def test_the_redo_ends_the_call_and_leaves_its_flags_zeroed(interp):
    """After the Hopper prefill (which wrote the start) the redo kernel writes the end, and zeroes every flag it
    scanned: the flags need no memset before the next call."""
    prefill, _ = interp
    times, counts, stamp_at = _stamp_table()
    case = make_case(7, sq=40, heads=20)
    args = case.fresh_output()._replace(stamp=stamp_at(5))
    flags = torch.zeros(80, dtype=torch.int32)
    flags[[4, 5, 79]] = 1
    prefill.launch(args, redo=flags)
    assert times[5].tolist() == [0, 2] and not counts.any()
    assert not flags.any()
