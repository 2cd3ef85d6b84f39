"""The Hopper Gluon kernels off the GPU: which calls they take, the Triton fallback, and what they compile to.

Gluon kernels do not run under Triton's interpreter, so their answers are checked on an H200 (test_triton_gpu.py
and test_launch_gpu.py, marker gpu). What can be checked without one is checked here: ``supports()`` refuses what
the kernel cannot take, the registry's ``gluon`` launch hands those calls to Triton and says so, the launchers
hand the warp-specialised kernel the grid and work items they should (its launch replaced by a recording test
double), and the kernels (one-warpgroup prefill and decode partials, both warp-specialised kernels) compile for
sm_90a to wgmma (HGMMA in the SASS) within one multiprocessor's shared memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from dispatcher.kernels import gluon_sm90
from dispatcher.kernels.torch_ref import ragged_prefill as torch_prefill
from dispatcher.sweep.correctness import build
from dispatcher.sweep.grid import Layout

ROOT = Path(__file__).resolve().parents[3]
needs_gluon = pytest.mark.skipif(not gluon_sm90.HAVE_GLUON, reason="this Triton has no Gluon")


def reference_max(kw: dict) -> bool:
    """Whether a recorded ws launch keeps a reference max: int32 flags, one an item (else one unread int8 flag,
    which specialises the kernel to the exact running max)."""
    flags = kw["redo_ptr"]
    assert flags.dtype == torch.int32 or (flags.dtype == torch.int8 and flags.numel() == 1), flags
    return flags.dtype == torch.int32


def args_for(layout: Layout, dtype: torch.dtype = torch.bfloat16, rows: int = 3):
    return build(rows, layout=layout, dtype=dtype, device=torch.device("cpu"), topk=40, kv_len=200)


def test_the_decode_pipelines_at_d512_only():
    # D = 512 in all: GLM's 512+0, and DSV4's 448+64, whose rope lanes sit inside the 512-lane block.
    for layout in (Layout(512, 0), Layout(448, 64)):
        assert gluon_sm90.decode_config(args_for(layout)) == gluon_sm90.DECODE_SM90_D512
    assert gluon_sm90.decode_config(args_for(Layout(512, 64))) == gluon_sm90.DECODE_SM90
    # Three 576-lane stages do not fit in shared memory: asked for, the pipelined kernel says so.
    with pytest.raises(ValueError, match="D = 512"):
        gluon_sm90._consts(args_for(Layout(512, 64)), gluon_sm90.Sm90Config(3, pipe=True))
    with pytest.raises(ValueError, match="stages=3"):
        gluon_sm90._consts(args_for(Layout(512, 0)), gluon_sm90.Sm90Config(2, pipe=True))
    assert gluon_sm90._consts(args_for(Layout(512, 0)), gluon_sm90.DECODE_SM90_D512)["PIPE"] is True


def test_supports_refuses_cpu_tensors_and_unsupported_shapes(monkeypatch):
    assert not gluon_sm90.supports(args_for(Layout(512, 64)))  # a CPU call, whatever its shape
    # With the device check out of the way, the shape rules alone decide.
    monkeypatch.setattr(gluon_sm90, "_on_hopper", lambda t: True)
    assert gluon_sm90.supports(args_for(Layout(512, 64)))
    assert gluon_sm90.supports(args_for(Layout(512, 0)))
    assert gluon_sm90.supports(args_for(Layout(448, 64)))
    assert gluon_sm90.supports(args_for(Layout(512, 64), torch.float16))
    assert not gluon_sm90.supports(args_for(Layout(512, 64), torch.float32))  # no fp32 wgmma path
    assert not gluon_sm90.supports(args_for(Layout(256, 64)))  # D = 320: not a production layout
    assert not gluon_sm90.supports(args_for(Layout(512, 128)))
    a = args_for(Layout(512, 64))
    for width in (580, 584):  # rows 1160 and 1168 bytes apart: Triton cannot prove 16-byte alignment
        kv_strided = torch.zeros(a.kv.shape[0], 1, width, dtype=a.kv.dtype)[:, :, :576]
        assert not gluon_sm90.supports(a._replace(kv=kv_strided))
    kv_padded = torch.zeros(a.kv.shape[0], 1, 592, dtype=a.kv.dtype)[:, :, :576]
    assert gluon_sm90.supports(a._replace(kv=kv_padded))  # a padded pool with 16-aligned rows is fine
    monkeypatch.setattr(gluon_sm90, "HAVE_GLUON", False)
    assert not gluon_sm90.supports(a)


def test_the_decode_and_the_default_prefill_take_fp8_pools_on_hopper(monkeypatch):
    monkeypatch.setattr(gluon_sm90, "_on_hopper", lambda t: True)
    for q in (torch.bfloat16, torch.float16):
        for kv in (torch.float8_e4m3fn, torch.float8_e5m2):
            for layout in (Layout(512, 64), Layout(512, 0), Layout(448, 64)):
                a = build(3, layout=layout, dtype=q, device=torch.device("cpu"), topk=40, kv_len=200, kv_dtype=kv)
                assert gluon_sm90.supports_decode(a) and gluon_sm90.supports_prefill(a), (q, kv, layout)
                assert not gluon_sm90.supports(a), (q, kv, layout)  # the one-warpgroup prefill: 16-bit pools
                assert gluon_sm90.decode_config(a) == gluon_sm90.DECODE_SM90_FP8
    for q, kv in ((torch.bfloat16, torch.float8_e4m3fnuz), (torch.float32, torch.float8_e4m3fn)):
        a = build(3, layout=Layout(512, 64), dtype=q, device=torch.device("cpu"), topk=40, kv_len=200, kv_dtype=kv)
        assert not gluon_sm90.supports_decode(a) and not gluon_sm90.supports_prefill(a), (q, kv)  # ROCm's; fp32
    a = args_for(Layout(512, 64))
    assert gluon_sm90.supports_decode(a) == gluon_sm90.supports_prefill(a) == gluon_sm90.supports(a) is True
    fp8 = build(3, layout=Layout(512, 64), dtype=torch.bfloat16, device=torch.device("cpu"), topk=40, kv_len=200,
                kv_dtype=torch.float8_e4m3fn)
    monkeypatch.setattr(gluon_sm90, "PREFILL_WARP_SPECIALISED", False)  # then the prefill is the one-warpgroup one
    assert not gluon_sm90.supports_prefill(fp8) and gluon_sm90.supports_prefill(a)


def test_the_launches_refuse_an_fp8_pool_where_no_kernel_reads_one():
    a = build(3, layout=Layout(512, 64), dtype=torch.bfloat16, device=torch.device("cpu"), topk=40, kv_len=200,
              kv_dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="one-warpgroup prefill reads a pool in q's dtype"):
        gluon_sm90.launch_prefill(a, config=gluon_sm90.PREFILL_SM90)
    if gluon_sm90.HAVE_GLUON:  # the fp8 pool lands and is converted by halves: whole stages cannot take it
        from dispatcher.kernels import gluon_sm90_ws

        with pytest.raises(ValueError, match="halves"):
            gluon_sm90_ws.launch_prefill_ws(a, halves=False)


def test_an_fp8_pool_takes_neither_the_pipelined_kernel_nor_one_rope_buffer():
    a = args_for(Layout(512, 0))
    assert gluon_sm90._consts(a, gluon_sm90.DECODE_SM90_FP8, 1)["KV8"] == 1
    assert "KV8" not in gluon_sm90._consts(a, gluon_sm90.DECODE_SM90_D512)  # 16-bit pools compile as before
    with pytest.raises(ValueError, match="fp8"):
        gluon_sm90._consts(a, gluon_sm90.DECODE_SM90_D512, 1)
    with pytest.raises(ValueError, match="fp8"):
        gluon_sm90._consts(args_for(Layout(512, 64)), gluon_sm90.Sm90Config(3, rope1=True), 2)


@needs_gluon
@pytest.mark.parametrize("kernel", ["prefill", "decode"])
def test_registry_launch_hands_unsupported_calls_to_triton_and_says_so(interp, kernel):
    from dispatcher.kernels.registry import default_registry
    from dispatcher.types import Kernel

    name = Kernel.INTREE_RAGGED_PREFILL if kernel == "prefill" else Kernel.INTREE_SPARSE_DECODE
    impl = default_registry(gluon=True).impls(name)[0]
    assert impl.impl == "gluon"
    a = build(5, layout=Layout(64, 16), dtype=torch.float16, device=torch.device("cpu"), topk=40, kv_len=200)
    a = a._replace(output=torch.full_like(a.output, float("nan")))
    assert impl.launch(a) == "triton"  # on CPU, under the interpreter: Triton ran it
    ref = a._replace(output=torch.empty(a.output.shape, dtype=torch.float32))
    torch_prefill(ref)
    torch.testing.assert_close(a.output.float(), ref.output, atol=3e-3, rtol=3e-3)


def recording(monkeypatch, *kernels) -> dict:
    """Each (module, kernel name) replaced by a ``RecordingLaunch``: {name: its recorder}."""
    recs = {}
    for mod, name in kernels:
        recs[name] = RecordingLaunch(getattr(mod, name))
        monkeypatch.setattr(mod, name, recs[name])
    return recs


def pretend_sms(monkeypatch, n: int = 132) -> None:
    """The launchers' multiprocessor count, as on an H200 (on CPU, ``sm_count`` says 8)."""
    from dispatcher.kernels import gluon_sm90_ws, triton_decode

    for mod in (gluon_sm90_ws, triton_decode):  # the ws grid; the decode's split count
        monkeypatch.setattr(mod, "sm_count", lambda device: n)


class RecordingLaunch:
    """Test double for a Gluon kernel's ``kernel[grid](...)`` launch (no Hopper GPU here): records what it is given."""

    def __init__(self, fn) -> None:
        self.arg_names = fn.arg_names
        self.calls: list[tuple[tuple, dict]] = []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.calls.append((grid, {**dict(zip(self.arg_names, args)), **kw}))
        return launch


@needs_gluon
def test_ws_launchers_pass_the_grid_work_items_and_mode(monkeypatch):
    """Prefill: one program per SM at most, items = rows x head blocks, no partials; the decode with ws=True:
    items = rows x splits x head blocks, splits chosen for one program per SM, partials then Triton's reduce."""
    from dispatcher.kernels import gluon_sm90_ws, triton_decode

    rec = RecordingLaunch(gluon_sm90_ws._ws_kernel)
    monkeypatch.setattr(gluon_sm90_ws, "_ws_kernel", rec)
    pretend_sms(monkeypatch)
    reduced, redone = [], []
    monkeypatch.setattr(triton_decode, "reduce_partials", lambda *a, **k: reduced.append(a))
    monkeypatch.setattr(gluon_sm90_ws, "redo_flagged", lambda a, flags: redone.append((a, flags)))
    a = build(300, layout=Layout(512, 64), dtype=torch.bfloat16, device=torch.device("cpu"), topk=2048, kv_len=4096)
    gluon_sm90_ws.launch_prefill_ws(a)
    grid, kw = rec.calls[-1]
    assert grid == (132,) and kw["n_items"] == 300 and kw["splits"] == 1 and kw["partial"] == 0
    assert kw["DB"] == 64 and kw["PDL"] is False and kw["maxnreg"] == 128
    # the prefill keeps a reference max, flagging items to compute again: one zeroed int32 flag per item,
    # handed to redo_flagged after the kernel
    assert reference_max(kw) and kw["redo_ptr"].shape == (300,)
    assert not kw["redo_ptr"].any() and redone[-1][0] is a and redone[-1][1] is kw["redo_ptr"]
    assert kw["HALVES"] is gluon_sm90_ws.STAGE_HALVES is True  # stages handed over in halves by default
    gluon_sm90_ws.launch_prefill_ws(a, halves=False)
    assert rec.calls[-1][1]["HALVES"] is False
    gluon_sm90_ws.launch_prefill_ws(a, redo=False)  # the exact max, asked for: no flags, no redo
    assert not reference_max(rec.calls[-1][1]) and rec.calls[-1][1]["redo_ptr"].numel() == 1 and len(redone) == 2
    narrow = build(300, layout=Layout(512, 64), dtype=torch.bfloat16, device=torch.device("cpu"), topk=128,
                   kv_len=4096)
    gluon_sm90_ws.launch_prefill_ws(narrow)  # too narrow for the reference to pay: the exact max by default
    assert not reference_max(rec.calls[-1][1]) and len(redone) == 2
    gluon_sm90_ws.launch_prefill_ws(narrow, redo=True)  # asked for, it is kept
    assert reference_max(rec.calls[-1][1]) and len(redone) == 3
    redone.pop()
    a20 = build(40, layout=Layout(512, 0), dtype=torch.bfloat16, device=torch.device("cpu"), topk=2048, kv_len=4096,
                heads=20)
    gluon_sm90_ws.launch_prefill_ws(a20)
    grid, kw = rec.calls[-1]
    assert grid == (80,) and kw["n_items"] == 80 and kw["n_hb"] == 2 and kw["DB"] == 0  # 20 heads: two blocks
    d = build(16, layout=Layout(512, 64), dtype=torch.bfloat16, device=torch.device("cpu"), topk=2048, kv_len=8192)
    gluon_sm90.launch_decode(d, ws=True, pdl=True)
    grid, kw = rec.calls[-1]
    assert kw["splits"] == 8 and kw["n_items"] == 16 * 8 and grid == (128,)  # one program per SM: 8 splits of 4 tiles
    assert kw["partial"] == 1 and kw["PDL"] is True and kw["HALVES"] is gluon_sm90_ws.STAGE_HALVES
    assert not reference_max(kw) and len(redone) == 3  # the decode's partials keep the exact running max
    assert kw["part_o_ptr"].shape == (16, 8, 16, 512) and kw["part_lse_ptr"].shape == (16, 8, 16)
    assert kw["part_o_ptr"].dtype == torch.bfloat16 and kw["part_lse_ptr"].dtype == torch.float32  # 16-bit partials
    assert len(reduced) == 1 and reduced[0][4] == 8  # the reduce combines the 8 splits
    n = len(rec.calls)
    one, red = RecordingLaunch(gluon_sm90._partial_kernel), RecordingLaunch(triton_decode._reduce_kernel)
    monkeypatch.setattr(gluon_sm90, "_partial_kernel", one)
    monkeypatch.setattr(triton_decode, "_reduce_kernel", red)
    monkeypatch.setattr(gluon_sm90, "SPLIT_REDUCE", False)  # the two launches (the one launch: below)
    gluon_sm90.launch_decode(d)  # the default: the one-warpgroup partials, the ws kernel untouched
    assert len(rec.calls) == n and len(one.calls) == 1 and len(red.calls) == 1
    (grid, kw), (rgrid, rkw) = one.calls[0], red.calls[0]
    assert grid == (16, kw["splits"], 1) and kw["o_ptr"] is rkw["o_ptr"] and kw["lse_ptr"] is rkw["lse_ptr"]
    assert kw["o_ptr"].dtype == torch.bfloat16 and kw["o_ld"] == 512 and rkw["splits"] == kw["splits"]
    assert kw["stamp_first"] == kw["stamp_last"] == rkw["stamp_first"] == rkw["stamp_last"] == -1  # not stamped


@needs_gluon
def test_d512_launchers_pass_the_work_items_and_the_workers_registers(monkeypatch):
    """gluon_sm90_ws_d512's launches: the prefill and the decode's partials, each with the workers' registers
    (both softmax warpgroups at 160, the loader at 56) and the exact running max."""
    from dispatcher.kernels import gluon_sm90_ws_d512

    rec = RecordingLaunch(gluon_sm90_ws_d512._ws_kernel)
    monkeypatch.setattr(gluon_sm90_ws_d512, "_ws_kernel", rec)
    pretend_sms(monkeypatch)
    a = build(40, layout=Layout(448, 64), dtype=torch.bfloat16, device=torch.device("cpu"), topk=2048, kv_len=4096)
    gluon_sm90_ws_d512.launch_prefill_ws(a)
    kw = rec.calls[-1][1]
    assert kw["WREGS"] == gluon_sm90_ws_d512.WORKER_REGS == (160, 160, 56)
    assert kw["DB"] == 0 and kw["partial"] == 0 and kw["maxnreg"] == 128 and rec.calls[-1][0] == (40,)
    assert not reference_max(kw)  # this kernel keeps the exact running max
    part_o = torch.empty(40, 2, 16, 512)
    gluon_sm90_ws_d512.launch_partials_ws(a, part_o, torch.empty(40, 2, 16), 2, pdl=False)
    kw = rec.calls[-1][1]
    assert kw["partial"] == 1 and kw["splits"] == 2 and kw["n_items"] == 80 and kw["WREGS"] == (160, 160, 56)


@pytest.mark.parametrize(("items", "width", "pays"), [
    (1, 2048, True), (16, 2048, True), (16384, 2048, True),  # 32 tiles an item: faster from one row
    (256, 1024, False), (512, 1024, True),  # within 0.2 µs at 256 rows; 3.9-5.5% faster at 512
    (512, 512, False), (1024, 512, True),  # 0.9-2.3% slower at 512 rows; 2.5-3.7% faster at 1,024
    (2048, 256, False), (16384, 256, True),  # 0.8-2.9% slower at 2,048 rows; 0.6-3.2% faster at 16,384
    (16384, 128, False), (10 ** 6, 128, False),  # two tiles an item: 8% slower even at 16,384 rows
    (64, 600.5, False), (1024, 600.5, True),  # a ragged index's mean width
])
def test_the_reference_max_is_kept_where_it_pays(items, width, pays):
    """The prefill keeps a reference max only where it measured the faster, or within 0.2 µs (by kernel time, 40
    points a layout: docs/kernels.md, "Prefill kernel design figures")."""
    from dispatcher.kernels import gluon_sm90_ws

    assert gluon_sm90_ws.reference_pays(items, width) is pays


def test_the_reference_decision_reads_a_calls_shapes():
    """Items are rows x head blocks of 16; a ragged index's width is its positions per row on average."""
    from dispatcher.kernels import gluon_sm90_ws
    from dispatcher.kernels.common import SparseIndex

    cpu = torch.device("cpu")
    a = build(512, layout=Layout(512, 64), dtype=torch.bfloat16, device=cpu, topk=512, kv_len=1024)
    assert not gluon_sm90_ws.prefill_reference(a)  # 512 x 512 positions: short of 2^19
    wide = build(512, layout=Layout(512, 64), dtype=torch.bfloat16, device=cpu, topk=512, kv_len=1024, heads=32)
    assert gluon_sm90_ws.prefill_reference(wide)  # two head blocks: 1,024 items

    def ragged(per_row: int):
        ptr = torch.arange(0, 513 * per_row, per_row, dtype=torch.int32)
        return a._replace(index=SparseIndex(None, None, torch.zeros(512 * per_row, dtype=torch.int32), ptr))

    assert gluon_sm90_ws.prefill_reference(ragged(1100))  # 1,100 positions a row on average: 563,200 in all
    assert not gluon_sm90_ws.prefill_reference(ragged(600))
    empty = a._replace(q=a.q[:0], output=a.output[:0], index=SparseIndex(a.index.indices[:0], None))
    assert not gluon_sm90_ws.prefill_reference(empty)


@needs_gluon
def test_the_warp_specialised_kernel_is_chosen_by_layout_and_by_reference(monkeypatch):
    """The prefill takes gluon_sm90_ws at every layout, with its reference max where that pays (wide, big calls) and
    the exact max elsewhere; ws=True decode partials, which keep the exact max, take gluon_sm90_ws_d512 at D = 512
    (448+64, 512+0: its one rope buffer is the faster there) and gluon_sm90_ws with rope lanes (512+64)."""
    from dispatcher.kernels import gluon_sm90_ws, gluon_sm90_ws_d512, triton_decode

    recs = {}
    for mod in (gluon_sm90_ws, gluon_sm90_ws_d512):
        recs[mod] = RecordingLaunch(mod._ws_kernel)
        monkeypatch.setattr(mod, "_ws_kernel", recs[mod])
    pretend_sms(monkeypatch)
    monkeypatch.setattr(triton_decode, "reduce_partials", lambda *a, **k: None)
    monkeypatch.setattr(gluon_sm90_ws, "redo_flagged", lambda a, flags: None)
    cpu = torch.device("cpu")
    for layout, partials in ((Layout(512, 64), gluon_sm90_ws), (Layout(448, 64), gluon_sm90_ws_d512),
                             (Layout(512, 0), gluon_sm90_ws_d512)):
        big = build(30, layout=layout, dtype=torch.bfloat16, device=cpu, topk=2048, kv_len=4096)
        a = build(30, layout=layout, dtype=torch.bfloat16, device=cpu, topk=256, kv_len=1024)
        before = {m: len(r.calls) for m, r in recs.items()}
        for call, reference in ((big, True), (a, False)):
            assert gluon_sm90.ws_module(call) is gluon_sm90_ws, layout
            assert gluon_sm90.ws_module(call, prefill=False) is partials, layout
            gluon_sm90.launch_prefill(call)
            kw = recs[gluon_sm90_ws].calls[-1][1]
            assert kw["partial"] == 0 and reference_max(kw) is reference, layout
        gluon_sm90.launch_decode(a, ws=True, pdl=False)
        assert recs[partials].calls[-1][1]["partial"] == 1, layout
        assert not reference_max(recs[partials].calls[-1][1]), layout  # the decode's partials: the exact max
        ran = {m: len(r.calls) - before[m] for m, r in recs.items()}
        assert ran == ({gluon_sm90_ws: 3, gluon_sm90_ws_d512: 0} if partials is gluon_sm90_ws
                       else {gluon_sm90_ws: 2, gluon_sm90_ws_d512: 1}), layout
        # an fp8 pool: gluon_sm90_ws at every layout (only it converts one), the pool itself as the kv operand
        f = build(30, layout=layout, dtype=torch.bfloat16, device=cpu, topk=256, kv_len=1024,
                  kv_dtype=torch.float8_e5m2)
        assert gluon_sm90.ws_module(f) is gluon_sm90_ws, layout
        gluon_sm90.launch_prefill(f)
        kw = recs[gluon_sm90_ws].calls[-1][1]
        assert kw["kv_ptr"].dtype == torch.float8_e5m2 and kw["HALVES"] is True and kw["partial"] == 0
        assert kw["DB"] == layout.nope + layout.rope - 512 and not reference_max(kw)  # narrow: the exact max


COMPILE = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from dispatcher.kernels import gluon_sm90, gluon_sm90_ws, gluon_sm90_ws_d512
    from tests.dispatcher.kernels.sm90_build import compile_sm90, cuobjdump, stack_bytes


    def ptrs(q="bf16", kv="bf16"):
        return {"q_ptr": "*" + q, "kv_ptr": "*" + kv, "sink_ptr": "*" + q, "out_ptr": "*" + q, "o_ptr": "*" + q}


    def compile_one(key, fn, consts, ptr_types, opts):
        k = compile_sm90(fn, consts, ptr_types, **opts)
        sass = cuobjdump(k, "sass", Path(sys.argv[1]) / f"{key}.cubin")
        return {"shared": k.metadata.shared, "hgmma": sass.count("HGMMA."), "warps": k.metadata.num_warps,
                "setmaxnreg": sass.count("USETMAXREG"), "hmma": sass.count("HMMA."),
                "stack": stack_bytes(k, Path(sys.argv[1]) / f"{key}.cubin"), "l1_prefetch": sass.count("CCTL.E.PF1"),
                "asm": k.asm["ttgir"].count("elementwise_inline_asm"), "coop": bool(k.metadata.launch_cooperative_grid),
                "acquire": k.asm["ptx"].count(".acquire"), "release": k.asm["ptx"].count("atom.global.gpu.acq_rel"),
                "cg_vectors": k.asm["ptx"].count("ld.global.cg.v")}


    SPLIT = {"S_BLOCK": 32, "V_BLOCK": 32, "TPW_S": 4}  # the one-launch decode's reduce tile at 2 rows (32 splits)


    found = {}
    if sys.argv[2] == "fp8ws":  # the warp-specialised kernel on each fp8 format, beside a 16-bit pool's
        for db in (64, 0):
            for kv, q in (("bf16", "bf16"), ("fp8e4nv", "bf16"), ("fp8e5", "fp16")):
                consts = {"DB": db, "PDL": True, "WREGS": tuple(gluon_sm90_ws.WORKER_REGS), "HALVES": True,
                          "idx_s1": 1, "o_s2": 1, "CLOCK": 1}
                found[f"{db}_{kv}"] = compile_one(f"ws_{db}_{kv}", gluon_sm90_ws._ws_kernel, consts, ptrs(q, kv),
                                                  {"num_warps": 4, "maxnreg": 128})
    elif sys.argv[2] == "redo":  # the prefill's ws kernel with a reference max, its redo launched or its own
        for db, kv, kv8 in ((64, "bf16", 0), (0, "bf16", 0), (64, "fp8e4nv", 1)):
            for here in (False, True):
                consts = {"DB": db, "PDL": False, "WREGS": tuple(gluon_sm90_ws.WORKER_REGS), "HALVES": True,
                          "idx_s1": 1, "o_s2": 1, "CLOCK": 1, "REDO_HERE": here, "REDO_KV8": kv8 if here else 0}
                found[f"{db}_{kv}_{int(here)}"] = compile_one(f"redo_{db}_{kv}_{int(here)}", gluon_sm90_ws._ws_kernel,
                                                              consts, {**ptrs("bf16", kv), "redo_ptr": "*i32"},
                                                              {"num_warps": 4, "maxnreg": 128})
    elif sys.argv[2] == "fp8":  # the decode's kernels on an fp8 pool's bytes, every mode, both block shapes: the
        # partials, and the whole-row kernel a decode of one split a row runs
        for db, kv8, q in ((64, 0, "bf16"), (64, 1, "bf16"), (0, 2, "bf16"), (64, 3, "fp16"), (0, 4, "fp16")):
            cfg = gluon_sm90.DECODE_SM90_FP8 if kv8 else gluon_sm90.DECODE_SM90
            consts = {"DB": db, "STAGES": cfg.stages, "ROPE1": False, "CHAINS": 1, "PIPE": False,
                      "CNT_BLOCK": 2048, "PDL": True, "KV8": kv8, "idx_s1": 1, "o_s2": 1, "CLOCK": 1}
            for name, fn in (("p", gluon_sm90._partial_kernel), ("whole", gluon_sm90._prefill_kernel),
                             ("split", gluon_sm90._split_decode_kernel)):
                extra, opts = ({}, {"num_warps": 4}) if name != "split" else (
                    SPLIT, {"num_warps": 4, "launch_cooperative_grid": True})
                found[f"{name}_{db}_{kv8}"] = compile_one(f"{name}_{db}_{kv8}", fn, {**consts, **extra},
                                                          ptrs(q, "u8" if kv8 else q), opts)
    else:
        for db in (64, 0):
            d512 = (gluon_sm90_ws_d512._ws_kernel,) if db == 0 else ()  # used only at D = 512
            for fn in (gluon_sm90._prefill_kernel, gluon_sm90._partial_kernel, gluon_sm90._split_decode_kernel,
                       gluon_sm90_ws._ws_kernel) + d512:
                cfg = gluon_sm90.PREFILL_SM90
                split = fn is gluon_sm90._split_decode_kernel
                if fn is gluon_sm90._partial_kernel or split:  # the decode's default per layout: pipelined at D = 512
                    cfg = gluon_sm90.DECODE_SM90_D512 if db == 0 else gluon_sm90.DECODE_SM90
                consts = {"DB": db, "STAGES": cfg.stages, "ROPE1": cfg.rope1, "CHAINS": cfg.chains,
                          "PIPE": cfg.pipe, "CNT_BLOCK": 2048, "PDL": True, "idx_s1": 1, "o_s2": 1,
                          "WREGS": tuple(gluon_sm90_ws.WORKER_REGS), "HALVES": gluon_sm90_ws.STAGE_HALVES, "KV8": 0,
                          "CLOCK": 1 if db else 0}  # the stamps' clock: %globaltimer, or (plain launches) none
                if d512 and fn is d512[0]:  # its own workers' registers
                    consts.update(WREGS=gluon_sm90_ws_d512.WORKER_REGS)
                opts = {"num_warps": 4, "maxnreg": 168} if fn is gluon_sm90_ws._ws_kernel else {"num_warps": 4}
                if split:
                    consts.update(SPLIT)
                    opts["launch_cooperative_grid"] = True
                key = ("d512" if d512 and fn is d512[0] else "") + fn.__name__ + f"_{db}"
                found[key] = compile_one(key, fn, consts, ptrs(), opts)
    print(json.dumps(found))
""")


def compiled_for_sm90(tmp_path, which: str) -> dict:
    """Each kernel of a COMPILE set ("16bit", "fp8", "fp8ws") compiled for sm_90a in a process without the
    interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), TRITON_CACHE_DIR=str(tmp_path / "cache"), TRITON_DEFAULT_FP_FUSION="1")
    res = subprocess.run([sys.executable, "-c", COMPILE, str(tmp_path), which], capture_output=True, text=True,
                         env=env, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@needs_gluon
def test_the_kernels_compile_for_sm90a_to_wgmma_in_shared_memory(tmp_path):
    found = compiled_for_sm90(tmp_path, "16bit")
    # Per 64-slot tile: scores 512/16 (+ 64/16 rope) wgmma k-steps, P·V 8 row blocks x 4 k-steps. The
    # warp-specialised kernel has the scores twice (two softmax warpgroups) and P·V once; the pipelined
    # partial kernel (D = 512) has both twice: tile 0's scores and the last P·V outside its loop.
    for key, got in found.items():
        db = int(key.rsplit("_", 1)[1])
        scores = 32 + (4 if db else 0)
        ws = "_ws_kernel" in key
        pipe = key in ("_partial_kernel_0", "_split_decode_kernel_0")
        assert got["hgmma"] == (2 * scores + 32 if ws else 2 * (scores + 32) if pipe else scores + 32), (key, got)
        assert got["hmma"] == 0, (key, got)  # no mma.sync fallback anywhere
        # the slot numbers asked of L1 ahead of their loads: the 2-stage one-warpgroup kernels where
        # topk_length or ragged indices are given, the warp-specialised loaders for every item (the pipelined
        # decode at D = 512 has none: lengths cost it nothing); ptxas must keep them
        assert (got["l1_prefetch"] == 0) if pipe else (got["l1_prefetch"] >= 1), (key, got)
        assert got["shared"] <= 232448, (key, got)  # one H100/H200 multiprocessor's shared memory for a block
        if ws:  # four warpgroups, registers moved between them; at 128 registers a thread (16 warps) ptxas
            # spills a few scalars of the item loop (96 B at 512+64 with Triton 3.6): bounded, not zero
            assert got["warps"] == 16 and got["setmaxnreg"] >= 4, (key, got)
            assert got["stack"] <= 256, (key, got)
        else:
            assert got["stack"] == 0, (key, got)  # no spills
    assert len(found) == 9 and "d512_ws_kernel_0" in found
    for db in (64, 0):  # the one-launch decode: the partial kernel's products and shared memory, then the reduce
        split, part = found[f"_split_decode_kernel_{db}"], found[f"_partial_kernel_{db}"]
        assert split["hgmma"] == part["hgmma"] and split["shared"] == part["shared"], (db, split, part)
        assert split["coop"] and not part["coop"]  # launched cooperatively: every program resident at once
        # it counts itself in with a release and waits with acquires; the partials are read past L1, in vectors
        assert split["release"] >= 1 and split["acquire"] >= 1 and split["cg_vectors"] >= 1, (db, split)
        assert part["release"] == part["acquire"] == part["cg_vectors"] == 0, (db, part)


@needs_gluon
def test_the_fp8_decode_kernels_compile_for_sm90a_without_spills(tmp_path):
    found = compiled_for_sm90(tmp_path, "fp8")
    assert len(found) == 15
    for key, got in found.items():
        name, db, kv8 = key.split("_")
        db, kv8 = int(db), int(kv8)
        # the same wgmma as a 16-bit pool's: scores 512/16 (+ 64/16 rope) k-steps, P·V 8 row blocks x 4
        assert got["hgmma"] == 32 + (4 if db else 0) + 32 and got["hmma"] == 0, (key, got)
        assert got["stack"] == 0, (key, got)  # the converted tile's index is opaque: no hoisted descriptors
        assert got["shared"] <= 232448, (key, got)
        # with KV8, one conversion a 256-lane half of the tile (2) and one for the rope lanes, plus the opaque
        # zero, beside the asm statements each kernel always has (the partials' PDL and L1 prefetch, the stamps)
        assert got["asm"] == found[f"{name}_64_0"]["asm"] + (2 + (1 if db else 0) + 1 if kv8 else 0), (key, got)


@needs_gluon
def test_the_ws_kernel_converts_an_fp8_pool_in_its_own_stages(tmp_path):
    """On an fp8 pool the warp-specialised kernel keeps a 16-bit pool's shared memory (each tile's bytes land in
    the stage they are converted into) and its wgmma; each softmax warpgroup converts its tiles' two halves (8
    conversions each: 32 slots x 64 lanes at a time) and its rope lanes (2)."""
    found = compiled_for_sm90(tmp_path, "fp8ws")
    for db in (64, 0):
        base = found[f"{db}_bf16"]
        for kv in ("fp8e4nv", "fp8e5"):
            got = found[f"{db}_{kv}"]
            assert got["shared"] == base["shared"] <= 232448, (db, kv, got, base)
            assert got["hgmma"] == base["hgmma"] == 2 * (32 + (4 if db else 0)) + 32 and got["hmma"] == 0, (db, kv)
            assert got["asm"] == base["asm"] + 2 * (16 + (2 if db else 0)), (db, kv, got, base)
            assert got["warps"] == 16 and got["stack"] <= 256, (db, kv, got)  # a few spilled scalars, bounded


@needs_gluon
def test_a_stamped_call_hands_its_stamp_to_its_first_and_last_kernels(monkeypatch):
    """The Hopper launches give a stamped call's entry to the kernel that starts it and the one that ends it: the
    decode's partials and reduce; the prefill's warp-specialised kernel alone (the exact max), or it and the redo
    kernel (the reference max). The stamp is armed; an unstamped call passes -1."""
    from dispatcher.kernels import gluon_sm90_ws, triton_decode, triton_prefill
    from dispatcher.kernels.stamps import DeviceStamp

    recs = recording(monkeypatch, (gluon_sm90, "_partial_kernel"), (triton_decode, "_reduce_kernel"),
                     (gluon_sm90, "_split_decode_kernel"), (gluon_sm90_ws, "_ws_kernel"),
                     (triton_prefill, "_redo_kernel"))
    pretend_sms(monkeypatch)
    cpu = torch.device("cpu")

    def stamped(a):
        return a._replace(stamp=DeviceStamp(torch.zeros(8, 2, dtype=torch.int64), torch.zeros(8, dtype=torch.int32), 6))

    def last(name):
        kw = recs[name].calls[-1][1]
        return kw["stamp_first"], kw["stamp_last"]

    d = stamped(build(100, layout=Layout(512, 64), dtype=torch.bfloat16, device=cpu, topk=2048, kv_len=8192))
    gluon_sm90.launch_decode(d)  # 100 rows x 2 splits: more programs than multiprocessors, two launches
    assert d.stamp.armed and last("_partial_kernel") == (6, -1) and last("_reduce_kernel") == (-1, 6)
    one = stamped(build(16, layout=Layout(512, 64), dtype=torch.bfloat16, device=cpu, topk=2048, kv_len=8192))
    gluon_sm90.launch_decode(one)  # 16 rows: the partials and the reduce are one kernel, which writes both
    assert one.stamp.armed and last("_split_decode_kernel") == (6, 6)
    wide = stamped(build(200, layout=Layout(512, 64), dtype=torch.bfloat16, device=cpu, topk=2048, kv_len=8192))
    gluon_sm90.launch_prefill(wide)  # top-k 2048, 200 items: the reference max, then the redo kernel ends the call
    assert reference_max(recs["_ws_kernel"].calls[-1][1]) and not recs["_ws_kernel"].calls[-1][1].get("REDO_HERE")
    assert last("_ws_kernel") == (6, -1) and last("_redo_kernel") == (-1, 6) and wide.stamp.armed
    redos = len(recs["_redo_kernel"].calls)
    one = stamped(build(64, layout=Layout(512, 64), dtype=torch.bfloat16, device=cpu, topk=2048, kv_len=8192))
    gluon_sm90.launch_prefill(one)  # 64 items, one pass of the grid: the kernel computes its flagged items itself
    kw = recs["_ws_kernel"].calls[-1][1]
    assert reference_max(kw) and kw["REDO_HERE"] is True and kw["REDO_KV8"] == 0
    assert last("_ws_kernel") == (6, 6) and len(recs["_redo_kernel"].calls) == redos and one.stamp.armed
    fp8 = build(64, layout=Layout(512, 64), dtype=torch.bfloat16, device=cpu, topk=2048, kv_len=8192,
                kv_dtype=torch.float8_e4m3fn)
    from dispatcher.kernels import fp8_ptx

    # the PTX conversion a Hopper GPU would pick for e4m3 beside bf16 q (off CUDA, kv_operand picks none)
    monkeypatch.setattr(fp8_ptx, "kv_operand", lambda kv, q_dtype, mode=None: (kv.view(torch.uint8), 1))
    gluon_sm90.launch_prefill(fp8)  # an fp8 pool: the redo reads its bytes, converted by that mode
    assert recs["_ws_kernel"].calls[-1][1]["REDO_KV8"] == 1 and len(recs["_redo_kernel"].calls) == redos
    narrow = stamped(build(64, layout=Layout(512, 64), dtype=torch.bfloat16, device=cpu, topk=128, kv_len=8192))
    redos = len(recs["_redo_kernel"].calls)
    gluon_sm90.launch_prefill(narrow)  # the exact max: the warp-specialised kernel starts and ends the call
    assert last("_ws_kernel") == (6, 6) and len(recs["_redo_kernel"].calls) == redos
    gluon_sm90.launch_prefill(narrow._replace(stamp=None))
    assert last("_ws_kernel") == (-1, -1)


@needs_gluon
@pytest.mark.parametrize("layout", [Layout(512, 64), Layout(512, 0)], ids=str)
def test_a_decode_of_one_split_a_row_is_one_launch(monkeypatch, layout):
    """From one row a multiprocessor the split count is 1: the decode is one launch of the whole-row kernel with
    the decode's config, which writes the output and both stamps; no partials, no reduce. Fewer rows keep the
    split-K pair."""
    from dispatcher.kernels import triton_decode
    from dispatcher.kernels.stamps import DeviceStamp

    recs = recording(monkeypatch, (gluon_sm90, "_partial_kernel"), (gluon_sm90, "_prefill_kernel"),
                     (triton_decode, "_reduce_kernel"))
    pretend_sms(monkeypatch)
    cpu = torch.device("cpu")
    stamp = DeviceStamp(torch.zeros(8, 2, dtype=torch.int64), torch.zeros(8, dtype=torch.int32), 3)
    wide = build(132, layout=layout, dtype=torch.bfloat16, device=cpu, topk=2048, kv_len=8192)._replace(stamp=stamp)
    gluon_sm90.launch_decode(wide)
    (grid, kw), = recs["_prefill_kernel"].calls
    assert grid == (132, 1) and not recs["_partial_kernel"].calls and not recs["_reduce_kernel"].calls
    assert kw["out_ptr"] is wide.output and (kw["stamp_first"], kw["stamp_last"]) == (3, 3) and stamp.armed
    cfg = gluon_sm90.decode_config(wide)
    assert (kw["STAGES"], kw["PIPE"], kw["DB"]) == (cfg.stages, cfg.pipe, layout.head_dim - 512)
    assert kw["has_sink"] == 1 and kw["sink_ptr"] is wide.attn_sink and kw["lanes"] == layout.nope
    gluon_sm90.launch_decode(wide._replace(stamp=None))
    assert recs["_prefill_kernel"].calls[-1][1]["stamp_first"] == -1
    narrow = build(131, layout=layout, dtype=torch.bfloat16, device=cpu, topk=2048, kv_len=8192)
    gluon_sm90.launch_decode(narrow)  # 131 rows: two splits a row, the partials and the reduce
    assert recs["_partial_kernel"].calls[-1][0] == (131, 2, 1) and len(recs["_reduce_kernel"].calls) == 1
    assert len(recs["_prefill_kernel"].calls) == 2


@needs_gluon
def test_an_explicit_config_runs_the_prefill_on_the_whole_row_kernel(monkeypatch):
    """The prefill with a ``config``: one launch a call of the whole-row kernel with that config, the grid
    (rows, head blocks), the output and the call's scale; no stamps unless the call carries one."""
    rec = RecordingLaunch(gluon_sm90._prefill_kernel)
    monkeypatch.setattr(gluon_sm90, "_prefill_kernel", rec)
    cfg = gluon_sm90.Sm90Config(3, rope1=True, chains=2)
    a = build(20, layout=Layout(512, 64), dtype=torch.bfloat16, device=torch.device("cpu"), topk=256, kv_len=1024)
    for scale in (0.5, 0.25):
        gluon_sm90.launch_prefill(a._replace(scale=scale), config=cfg)
    assert len(rec.calls) == 2
    grid, kw = rec.calls[-1]
    assert grid == (20, 1) and kw["out_ptr"] is a.output and kw["sm_scale2"] == pytest.approx(0.25 * 1.4426950408889634)
    assert (kw["STAGES"], kw["ROPE1"], kw["CHAINS"], kw["PIPE"]) == (3, True, 2, False)
    assert (kw["stamp_first"], kw["stamp_last"]) == (-1, -1)


@needs_gluon
def test_the_prefill_flags_come_from_scratch_once_zeroed(monkeypatch):
    """No memset a call: the reference max's flags are one zeroed buffer per stream, handed out again; the redo
    kernel (tested under the interpreter) zeroes what it read."""
    from dispatcher.kernels import gluon_sm90_ws

    rec = RecordingLaunch(gluon_sm90_ws._ws_kernel)
    monkeypatch.setattr(gluon_sm90_ws, "_ws_kernel", rec)
    redone = []
    monkeypatch.setattr(gluon_sm90_ws, "redo_flagged", lambda a, flags: redone.append(flags))
    pretend_sms(monkeypatch)
    cpu = torch.device("cpu")
    for rows in (40, 20, 40):
        gluon_sm90_ws.launch_prefill_ws(build(rows, layout=Layout(512, 64), dtype=torch.bfloat16, device=cpu,
                                              topk=2048, kv_len=4096))
    assert redone[0] is redone[1] is redone[2] and redone[0].numel() == 40 and not redone[0].any()


def test_the_gpu_tests_explicit_configs_are_valid_configs():
    """The GPU tests' explicit one-warpgroup configs build (a stale positional tuple once set pipe and zeroed
    chains, and the GPU test failed on the config, not the kernel)."""
    from tests.dispatcher.kernels.test_triton_gpu import SM90_CONFIGS

    specs = [s for s in SM90_CONFIGS.values() if isinstance(s, dict)]
    assert len(specs) == 2
    for spec in specs:
        cfg = gluon_sm90.Sm90Config(**spec)
        assert not cfg.pipe and cfg.chains in (1, 2), cfg
        for layout in (Layout(512, 64), Layout(512, 0)):
            assert gluon_sm90._consts(args_for(layout), cfg)["STAGES"] == spec["stages"]


@needs_gluon
@pytest.mark.parametrize("layout", [Layout(512, 64), Layout(512, 0)], ids=str)
@pytest.mark.parametrize("rows", [1, 2, 16, 66])
def test_a_decode_whose_grid_fits_is_one_cooperative_launch(monkeypatch, layout, rows):
    """Under one program a multiprocessor (132 on an H200), the split-K decode is one cooperative launch of
    ``_split_decode_kernel``: the partials from the stream's scratch, a zeroed int32 counter a (row, head block),
    every split of a row in the reduce's tile; no partial kernel, no reduce kernel."""
    from dispatcher.kernels import triton_decode
    from dispatcher.kernels.scratch import scratch

    recs = recording(monkeypatch, (gluon_sm90, "_partial_kernel"), (gluon_sm90, "_split_decode_kernel"),
                     (triton_decode, "_reduce_kernel"))
    pretend_sms(monkeypatch)
    a = build(rows, layout=layout, dtype=torch.bfloat16, device=torch.device("cpu"), topk=2048, kv_len=8192)
    for _ in range(2):
        gluon_sm90.launch_decode(a)
    assert not recs["_partial_kernel"].calls and not recs["_reduce_kernel"].calls
    (grid, kw), again = recs["_split_decode_kernel"].calls
    splits = triton_decode.choose_splits(rows, 1, 2048, 64, 132, 1)
    assert grid == (rows, splits, 1) and rows * splits <= 132 and splits > 1 and again[0] == grid
    assert kw["launch_cooperative_grid"] is True and "PDL" not in kw and kw["splits"] == splits
    assert (kw["S_BLOCK"], kw["V_BLOCK"], kw["TPW_S"]) == gluon_sm90.reduce_tile(splits) and kw["S_BLOCK"] >= splits
    cfg = gluon_sm90.decode_config(a)
    assert (kw["STAGES"], kw["PIPE"], kw["DB"]) == (cfg.stages, cfg.pipe, layout.head_dim - 512)
    assert kw["out_ptr"] is a.output and kw["sink_ptr"] is a.attn_sink and kw["has_sink"] == 1
    assert kw["o_ld"] == kw["lanes"] == layout.nope and kw["o_ptr"].numel() >= rows * splits * 16 * layout.nope
    arrivals = kw["cnt_ptr"]
    assert arrivals.dtype == torch.int32 and arrivals.numel() >= rows and not arrivals.any()
    assert scratch().holds(arrivals) and again[1]["cnt_ptr"] is arrivals  # kept, not made per call


@needs_gluon
def test_a_decode_that_does_not_fit_keeps_two_launches(monkeypatch):
    """More programs than multiprocessors, heads that are not whole blocks, or the one launch switched off: the
    partials and the reduce; ``fused=True`` there is refused, ``fused=False`` anywhere gives the two launches."""
    from dispatcher.kernels import triton_decode

    recs = recording(monkeypatch, (gluon_sm90, "_partial_kernel"), (gluon_sm90, "_split_decode_kernel"),
                     (triton_decode, "_reduce_kernel"))
    pretend_sms(monkeypatch)
    cpu = torch.device("cpu")
    wide = build(100, layout=Layout(512, 64), dtype=torch.bfloat16, device=cpu, topk=2048, kv_len=8192)
    odd_heads = build(4, layout=Layout(512, 64), dtype=torch.bfloat16, device=cpu, topk=2048, kv_len=8192, heads=20)
    for a in (wide, odd_heads):
        gluon_sm90.launch_decode(a)
        with pytest.raises(ValueError, match="cooperative"):
            gluon_sm90.launch_decode(a, fused=True)
    small = build(2, layout=Layout(512, 64), dtype=torch.bfloat16, device=cpu, topk=2048, kv_len=8192)
    gluon_sm90.launch_decode(small, fused=False)
    assert len(recs["_partial_kernel"].calls) == len(recs["_reduce_kernel"].calls) == 3
    assert not recs["_split_decode_kernel"].calls
    monkeypatch.setattr(gluon_sm90, "SPLIT_REDUCE", False)
    gluon_sm90.launch_decode(build(2, layout=Layout(512, 0), dtype=torch.bfloat16, device=cpu, topk=2048,
                                   kv_len=8192))
    assert len(recs["_reduce_kernel"].calls) == 4 and not recs["_split_decode_kernel"].calls
    gluon_sm90.launch_decode(small, fused=True, splits=4)  # the one launch with a split count of one's own
    (grid, kw), = recs["_split_decode_kernel"].calls
    assert grid == (2, 4, 1) and kw["splits"] == 4
    with pytest.raises(ValueError, match="no ws, no pdl"):
        gluon_sm90.launch_decode(small, fused=True, pdl=True)


@needs_gluon
@pytest.mark.parametrize("splits", [2, 3, 4, 8, 11, 16, 17, 32, 64])
def test_the_reduce_tile_holds_every_split_in_one_warps_reach(splits):
    """Every split in the tile, spread over at most 8 lanes of a warp (the rest in each thread's registers); the
    vectors across the remaining lanes and the 4 warps, with no lane left idle; 8,192 values a tile."""
    s_block, v_block, tpw_s = gluon_sm90.reduce_tile(splits)
    assert s_block >= splits and s_block & (s_block - 1) == 0 and s_block % tpw_s == 0 and tpw_s <= 8
    assert s_block * v_block * 8 == gluon_sm90.REDUCE_SLICE_VALUES
    assert v_block % (32 // tpw_s * 4) == 0  # the lanes and warps along the vectors fit in the tile


@needs_gluon
def test_the_prefill_redoes_its_items_in_the_same_shared_memory(tmp_path):
    """With its redo in the kernel (``REDO_HERE``), the warp-specialised prefill keeps its shared memory: the
    one-warpgroup loop after the partitions join reuses what they held. It adds that loop's wgmma (scores 512/16,
    + 64/16 rope, and P·V 32) and a bounded stack: ptxas spills a few words (24 bytes at 512+64 with Triton 3.6),
    which is why only calls of one pass of the grid take it (``gluon_sm90_ws.redo_in_kernel``)."""
    found = compiled_for_sm90(tmp_path, "redo")
    for db, kv in ((64, "bf16"), (0, "bf16"), (64, "fp8e4nv")):
        launched, own = found[f"{db}_{kv}_0"], found[f"{db}_{kv}_1"]
        assert own["shared"] == launched["shared"] <= 232448, (db, kv, own, launched)
        assert own["hgmma"] == launched["hgmma"] + 32 + (4 if db else 0) + 32 and own["hmma"] == 0, (db, kv, own)
        assert own["stack"] <= 256 and own["warps"] == 16, (db, kv, own)
