"""The GPU labs' parts that need no GPU: the stamps' arithmetic, the tensor-map patch, the flags they set.

The labs themselves (scripts/gpu/) run on the H200 only; their figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dispatcher.kernels import gluon_sm90

LABS = Path(__file__).resolve().parents[2] / "scripts" / "gpu"
needs_gluon = pytest.mark.skipif(not gluon_sm90.HAVE_GLUON, reason="this Triton has no Gluon")


@pytest.fixture(scope="module")
def labs():
    sys.path.insert(0, str(LABS))
    try:
        yield
    finally:
        sys.path.remove(str(LABS))


@needs_gluon
def test_prefill_trace_intervals_read_each_tiles_stamps(labs):
    import prefill_trace

    # two programs; tile t's P ready at 1000 t + 100 + p, its P·V done at 1000 t + 600 + 2 p (program p)
    stamps = torch.zeros((2, 24), dtype=torch.int64)
    for p in range(2):
        for t in range(8):
            stamps[p, 3 + 2 * t] = 1000 * t + 100 + p
            stamps[p, 4 + 2 * t] = 1000 * t + 600 + 2 * p
    got = prefill_trace.intervals(stamps)  # medians over programs: torch's, the lower of two middle values
    assert got["period"] == [1000.0] * 6
    assert got["P after P·V free"] == [499.0] * 6  # 500 (program 0) and 499 (program 1)
    assert got["P·V once both are in"] == [500.0] * 6  # 500 and 501
    stamps[:, 3 + 2 * 3] = 5000  # tile 3's P arrives late for both programs
    got = prefill_trace.intervals(stamps)
    assert got["P after P·V free"][2] == 5000 - 2602 and got["P after P·V free"][1] == 499.0
    assert got["P·V once both are in"][2] == 3600 - 5000  # P·V done before its P: a sign the stamps are off


@needs_gluon
def test_tma_probe_patches_the_swizzle_before_the_first_launch_only(labs):
    import tma_probe

    compiled = SimpleNamespace(module=None, metadata=SimpleNamespace(
        tensordesc_meta=[{"swizzle": 0, "block_size": [1, 64]}, {"swizzle": 0, "block_size": [1, 64]}]))
    tma_probe.swizzle_rows(compiled)
    assert [m["swizzle"] for m in compiled.metadata.tensordesc_meta] == [3, 3]  # CU_TENSOR_MAP_SWIZZLE_128B
    compiled.module = object()  # loaded: its launcher has encoded the maps already
    with pytest.raises(AssertionError):
        tma_probe.swizzle_rows(compiled)
    # the box the kernel compiles: one row of 64 16-bit lanes, unswizzled (Triton wants 8 rows to swizzle)
    assert tma_probe.ROW_BOX.swizzle_byte_width == 0 and tma_probe.ROW_BOX.element_bitwidth == 16


@needs_gluon
def test_tma_probe_whole_row_boxes_cover_a_row_and_compile_apart(labs):
    import tma_probe

    kv = torch.zeros(100, 576, dtype=torch.bfloat16)
    desc = tma_probe.whole_row_desc(kv)  # the pool as [slots, 9, 64]; a box: one row's 512 lanes
    assert list(desc.shape) == [100, 9, 64] and list(desc.strides) == [576, 64, 1]
    assert list(desc.block_shape) == [1, 8, 64] and desc.layout.swizzle_byte_width == 0
    with pytest.raises(AssertionError):
        tma_probe.whole_row_desc(torch.zeros(100, 512, dtype=torch.bfloat16))  # no rope lanes: not this pool
    assert set(tma_probe.ROW_MODES) <= set(tma_probe.MODES)
    # every mode its own MODE constant, so its own compiled kernel: the swizzle patch reaches only "row576sw"
    assert len({m for m, _ in tma_probe.MODES.values()}) == len(tma_probe.MODES)
    assert {n for n, b in tma_probe.ROW_MODES.items() if b == 9} == {"row576", "row576x4", "row576sw"}
    modes = ("cp512", "cp576", "hybrid", "row512x4", "row576sw")
    assert [tma_probe.lanes_of(m) for m in modes] == [512, 576, 576, 512, 576]
    # what the check compares: the read-back writes the 512-lane stage (rope buffer unread) or the whole row
    assert [tma_probe.checked_lanes(m) for m in modes] == [512, 512, 512, 512, 576]


def test_ncu_waits_splits_partitions_and_charges_each_barrier_wait(labs):
    """A made-up source page: two partitions after their USETMAXREG, a wait (inline try, then the branch
    into the retry loop at the end) in each, and a short hand-off stretch that is no partition."""
    import ncu_waits

    head = ["Address", "Source", "Warp Stall Sampling (All Samples)", "stall_long_sb", "stall_barrier",
            "stall_long_sb (Not Issued)"]
    code = [("USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xa0", 0, 0, 0)]  # partition "regs 160"
    code += [("SYNCS.PHASECHK.TRANS64.TRYWAIT P4, [R29+URZ+0x38a80], R24", 5, 0, 5),
             ("@!P4 BRA 0x1000", 30, 30, 0)] + [("FMUL R1, R2, R3", 1, 0, 0)] * 20
    code += [("USETMAXREG.DEALLOC.CTAPOOL 0x50", 0, 0, 0), ("NOP", 7, 0, 0)]  # a hand-off: 2 instructions
    code += [("USETMAXREG.DEALLOC.CTAPOOL 0x38", 0, 0, 0)]  # partition "regs 56"
    code += [("@!P5 BRA 0x1010", 40, 40, 0)] + [("LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64]", 2, 2, 0)] * 20
    code += [("USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0x100", 0, 0, 0)]  # the retry loops, at the end
    loops = {0x1000: "SYNCS.PHASECHK.TRANS64.TRYWAIT P4, [R29+URZ+0x38a80], R24",
             0x1010: "SYNCS.PHASECHK.TRANS64.TRYWAIT P5, [UR7+0x38af0], R41"}
    lines = ['"Kernel Name","_ws_kernel",', ",".join(f'"{h}"' for h in head)]
    for i, (src, n, lsb, bar) in enumerate(code):
        lines.append(f'"{hex(0x10 * i)}","{src}","{n}","{lsb}","{bar}","0"')
    for addr, src in loops.items():
        lines.append(f'"{hex(addr)}","{src}","0","0","0","0"')
    insns = ncu_waits.parse(lines)
    assert insns[1].stalls == {"long_sb": 0.0, "barrier": 5.0}  # the "(Not Issued)" columns are left out
    parts = ncu_waits.partitions(insns)
    assert [p.name for p in parts] == ["regs 160 #1", "regs 56 #1"]  # the 2-instruction hand-off is not one
    assert ncu_waits.barrier_waits(insns, parts[0]) == {"0x38a80": 35.0}  # inline try 5 + branch 30
    assert ncu_waits.barrier_waits(insns, parts[1]) == {"0x38af0": 40.0}
    text = ncu_waits.report(insns, {"0x38af0": "buf_empty"})
    assert "waits on buf_empty" in text and "regs 56 #1" in text
    with pytest.raises(ValueError, match="SourceCounters"):
        ncu_waits.parse(['"Kernel Name","k",', '"Address","Source"'])


@needs_gluon
def test_depth_probe_modes_parse_and_bad_ones_fail_before_anything_runs(labs):
    import depth_probe

    assert depth_probe.parse_mode("ring64x3") == {"rows": 64, "depth": 3, "ring": True, "reg_frac": 0.0, "pf": 0}
    assert depth_probe.parse_mode("ring32x6+reg0.25+pf128") == {"rows": 32, "depth": 6, "ring": True,
                                                                 "reg_frac": 0.25, "pf": 128}
    assert depth_probe.parse_mode("reg") == {"rows": 64, "depth": 1, "ring": False, "reg_frac": 1.0, "pf": 0}
    for bad in ("ring64x4", "ring48x2", "ring32x7", "ring64x0", "ring64x2+pf100", "ring64x2+foo", "reg+pf64", "cp576"):
        with pytest.raises(ValueError):
            depth_probe.parse_mode(bad)  # 64 x 4 rows of 576 lanes would not fit in shared memory
    for mode in depth_probe.MODES:
        depth_probe.parse_mode(mode)


@needs_gluon
def test_depth_probe_register_reference_folds_each_programs_tiles(labs):
    import depth_probe

    skv, sms = 40, 3
    torch.manual_seed(1)
    kv = torch.randint(-2**15, 2**15, (skv, depth_probe.LANES), dtype=torch.int16).view(torch.bfloat16)
    ridx = torch.randint(0, skv, (7, 64), dtype=torch.int32)
    ridx[:, 5] = -1
    ridx[:, 9] = skv + 3  # past the pool: zeros, as the kernel's masked loads give
    got = depth_probe.reg_xor_reference(kv, ridx, sms)
    k = kv.view(torch.int16)
    for p in range(sms):  # program p loads tiles p, p + sms, ...: 64 rows, 4 chunks of 128 lanes each
        want = torch.zeros(64, 128, dtype=torch.int16)
        for t in range(p, ridx.shape[0], sms):
            for r in range(64):
                s = int(ridx[t, r])
                if 0 <= s < skv:
                    for c in range(4):
                        want[r] ^= k[s, 128 * c:128 * c + 128]
        assert torch.equal(got[p], want)
    assert got[0].any() and not got[:, 5].any() and not got[:, 9].any()


def test_jit_probe_names_the_arguments_whose_specialisation_changed(labs):
    import jit_probe

    before = "_k[num_warps=4, num_ctas=1](q_ptr: *bf16, rows: i32, width: i32 (D), H: i32)"
    after = "_k[num_warps=4, num_ctas=1](q_ptr: *bf16, rows: i32 (D), width: i32 (D), H: constexpr)"
    assert jit_probe.arg_diff(before, after) == ["rows: i32 -> i32 (D)", "H: i32 -> constexpr"]
    assert jit_probe.arg_diff(before, before) == []


def test_cvt_rate_times_each_conversion_as_written_with_its_output_fed_back(labs):
    """cvt_rate.py's loop step: the mode's own PTX, its two output words xor-ed into the step's one result, its
    input the previous step's result (the kernels' $2 becomes the step's $1)."""
    import cvt_rate

    for name, (ptx, _, _) in cvt_rate.MODES.items():
        step = cvt_rate.as_loop_step(ptx)
        assert "$2" not in step, name
        assert step.count("$0") == 1 and step.rstrip().endswith("xor.b32 $0, o0, o1;\n}"), name
        assert step.count("$1") == ptx.count("$2"), name  # every read of the input, none of an output
        assert step.count("o0") == ptx.count("$0") + 2 and step.count("o1") == ptx.count("$1") + 2, name
    assert cvt_rate.int_e4m3_bf16(nan=True).count("mul.lo.u32") == 2  # the NaN step, once per output word
    assert "mul.lo.u32" not in cvt_rate.int_e4m3_bf16(nan=False)


def test_sass_diff_tells_renamed_registers_from_changed_code(labs, tmp_path):
    """sass_diff.py: addresses, encodings and branch targets never count; register names are reported apart;
    a changed or missing instruction, or a variant in one folder only, fails."""
    import sass_diff

    def listing(*insns: str, at: int = 0) -> str:
        return "\n".join(f"        /*{at + 16 * i:04x}*/                   {x} ;   /* 0x000fe2000001ff00 */"
                         for i, x in enumerate(insns))

    base = listing("IMAD R2, R3, R4, RZ", "@P0 BRA `(.L_x_12)", "HGMMA.64x16x16.F32.BF16 R24, gdesc[UR4], R24")
    moved = listing("IMAD R2, R3, R4, RZ", "@P0 BRA `(.L_x_40)", "HGMMA.64x16x16.F32.BF16 R24, gdesc[UR4], R24",
                    at=0x100)
    renamed = listing("IMAD R7, R3, R4, RZ", "@P1 BRA `(.L_x_12)", "HGMMA.64x16x16.F32.BF16 R24, gdesc[UR6], R24")
    changed = listing("IMAD R2, R3, R4, RZ", "@P0 BRA `(.L_x_12)", "FMUL R2, R2, R5",
                      "HGMMA.64x16x16.F32.BF16 R24, gdesc[UR4], R24")
    assert len(sass_diff.instructions(base)) == 3
    assert sass_diff.compare(sass_diff.instructions(base), sass_diff.instructions(moved)) == "identical"
    assert sass_diff.compare(sass_diff.instructions(base), sass_diff.instructions(renamed)) == \
        "registers renamed (3 instructions)"
    assert sass_diff.compare(sass_diff.instructions(base), sass_diff.instructions(changed)).startswith(
        "differs: 1 instructions changed, 3 -> 4 instructions")

    before, after = tmp_path / "before", tmp_path / "after"
    before.mkdir()
    after.mkdir()
    (before / "a.sass").write_text(base)
    (after / "a.sass").write_text(renamed)
    assert sass_diff.main([str(before), str(after)]) == 0
    (after / "b.sass").write_text(base)  # in one folder only
    assert sass_diff.main([str(before), str(after)]) == 1
    (before / "b.sass").write_text(changed)
    assert sass_diff.main([str(before), str(after)]) == 1
    assert sass_diff.main([str(before)]) == 2
