"""The GPU runner's scripts (scripts/gpu/) where they run without a GPU: the demo check end to end on CPU, the
profiler pass's plans, the runner's search candidates, and the compile check's specialisation and loop reading."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton.language as tl
from triton.runtime.jit import JITFunction

from dispatcher.kernels import triton_decode, triton_prefill
from dispatcher.sweep.grid import Layout

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "scripts" / "gpu"


def load(name: str):
    """A script as a module by its path (``profile`` would otherwise be the standard library's)."""
    sys.path.insert(0, str(GPU))  # the scripts import each other, as they do when run from there
    try:
        spec = importlib.util.spec_from_file_location(f"gpu_script_{name}", GPU / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(GPU))


def test_demo_check_serves_the_demo_and_reads_back_what_it_counted(tmp_path):
    """The real server on CPU, with the seed's bug on: GLM's decodes land on the prefill kernel and are counted."""
    run = subprocess.run([sys.executable, str(GPU / "demo_check.py"), "--seconds", "3", "--out", str(tmp_path),
                          "--glm-bug"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "glm bug True" in run.stdout
    routing = json.loads((tmp_path / "routing-glm-bug.json").read_text())
    assert routing["demo"]["glm_bug"] is True
    by_model = {m["model"]: m for m in routing["decode_in_prefill"]["by_model"]}
    assert by_model["GLM-5.3-Flash"]["calls"] > 0 and by_model["GLM-5.3-Flash"]["share_of_decode_calls"] == 1.0
    assert by_model["DeepSeek-V4.1-Flash"]["calls"] == 0
    assert "routescope_decode_in_prefill" in (tmp_path / "metrics-glm-bug.txt").read_text()
    assert (tmp_path / "serve-glm-bug.log").exists()


def test_demo_check_says_at_once_why_the_server_did_not_come_up(tmp_path):
    """A server that exits at start (here a bad setting; on the GPU image once a missing package) is reported with
    its log, not waited for."""
    env = dict(os.environ, ROUTESCOPE_GFX942_MIN_ROWS="abc")
    run = subprocess.run([sys.executable, str(GPU / "demo_check.py"), "--seconds", "3", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    assert "the server exited with 2" in run.stderr and "--gfx942-min-rows" in run.stderr
    assert not (tmp_path / "routing.json").exists()


def test_profile_plans_the_shapes_each_mode_names(monkeypatch):
    profile = load("profile")
    monkeypatch.setattr(profile, "preferred", lambda kernel: f"the dispatcher's {kernel}")  # its launches need a GPU
    triton_plan = profile.plan("triton")
    assert [(rows, launch) for rows, launch, _, _ in triton_plan] == [
        (16384, triton_prefill.launch), (16, triton_decode.launch), (2, triton_decode.launch)]
    assert {layout for _, _, layout, _ in triton_plan} == {Layout(512, 64)}
    assert [(rows, launch) for rows, launch, _, _ in profile.plan("dispatcher")] == [
        (16384, "the dispatcher's prefill"), (16, "the dispatcher's decode"), (2, "the dispatcher's decode")]
    layouts = profile.plan("layouts")
    assert [layout for _, _, layout, _ in layouts] == [Layout(448, 64), Layout(512, 0), Layout(512, 64)]
    assert {(rows, launch) for rows, launch, _, _ in layouts} == {(16384, "the dispatcher's prefill")}
    assert [dt for *_, dt in profile.plan("fp8")] == [
        (torch.bfloat16, None), (torch.bfloat16, torch.float8_e4m3fn), (torch.float16, torch.float8_e4m3fn)]
    with pytest.raises(SystemExit, match="unknown mode"):
        profile.plan("ws-prefill")


def test_h200_run_searches_around_the_committed_configs_and_reports_what_it_keeps(monkeypatch):
    """With or without --skip-search the committed configs are among those timed, and chosen() names what runs."""
    h200_run = load("h200_run")
    assert triton_prefill.PREFILL_CONFIG in h200_run.PREFILL_CANDIDATES
    assert triton_decode.DECODE_CONFIG in h200_run.DECODE_CANDIDATES
    assert triton_decode.PROGRAMS_PER_SM in h200_run.PER_SM
    monkeypatch.setattr(triton_prefill, "PREFILL_CONFIG", h200_run.PREFILL_CANDIDATES[-1])
    assert h200_run.chosen()["prefill"] == list(h200_run.PREFILL_CANDIDATES[-1])


def _toy(q_ptr, out_ptr, skv, q_s0, q_s2, sm_scale2, n, D: tl.constexpr, KV8: tl.constexpr = 0):
    pass


def test_compile_check_specialises_arguments_as_a_launch_would():
    """A compiled (not interpreted: other tests set TRITON_INTERPRET) kernel's arguments, as a launch sees them."""
    compile_check = load("compile_check")
    toy = JITFunction(_toy)
    sig, attrs, consts = compile_check.signature(toy, {"D": 576})
    assert sig == {"q_ptr": "*bf16", "out_ptr": "*bf16", "skv": "i32", "q_s0": "i32", "q_s2": "constexpr",
                   "sm_scale2": "fp32", "n": "i32", "D": "constexpr", "KV8": "constexpr"}
    assert consts == {"D": 576, "KV8": 0, "q_s2": 1}  # a left-out constexpr takes its default; unit strides fold
    divisible = {toy.arg_names[i] for (i,) in attrs}
    assert divisible == {"q_ptr", "out_ptr", "skv", "q_s0"}  # not n, which carries no multiple of 16


def test_compile_check_reads_the_longest_backward_loop_of_a_sass_listing():
    compile_check = load("compile_check")
    sass = "\n".join(f"        /*{a:04x}*/                   {insn} ;" for a, insn in [
        (0x00, "IMAD R1, R2, R3, RZ"), (0x10, "LDG.E.128 R4, desc[UR4][R2.64]"),
        (0x20, "HMMA.16816.F32 R8, R4, R6, R8"), (0x30, "HMMA.16816.F32 R12, R4, R6, R12"), (0x40, "@P0 BRA 0x10"), (0x50, "FADD R9, R9, R10"),
        (0x60, "@!P1 BRA 0x50"), (0x70, "BRA 0x90"), (0x80, "NOP"), (0x90, "EXIT")])
    got = compile_check.sass_loop(sass)
    assert got["sass"] == 10
    assert got["loop"] == 4 and got["loop_mix"] == "HMMA:2,LDG:1,BRA:1"  # 0x10-0x40, not the 2-long one nor a jump


def test_decode_ab_pairs_the_one_launch_with_the_two_it_replaced(monkeypatch):
    """Where the Hopper decode is one cooperative launch, the A/B gets both recipes of its plan; where it is not (one
    split a row from 132 rows, or too many programs), nothing to compare."""
    from dispatcher.kernels import gluon_sm90

    if not gluon_sm90.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    ab = load("decode_ab")
    monkeypatch.setattr(triton_decode, "sm_count", lambda device: 132)  # an H200's, as the split count sees it
    from dispatcher.sweep.correctness import build

    make = lambda rows: build(rows, layout=Layout(512, 64), dtype=torch.bfloat16,  # noqa: E731
                              device=torch.device("cpu"), topk=2048, kv_len=8192)
    pair = ab.variants(make(16))
    assert set(pair) == {"one_launch", "two_launches"} and all(callable(f) for f in pair.values())
    assert ab.variants(make(132)) == {} and ab.variants(make(100)) == {}
    assert [layout for layout, _ in ab.SHAPES].count(Layout(512, 64)) == 2  # a 16-bit pool and an fp8 one


def test_prefill_redo_ab_pairs_the_redo_in_the_kernel_with_its_launch():
    """Where the prefill keeps a reference max, the A/B gets the default recipe with the redo in the kernel and with
    Triton's redo launch, whatever the row count; where it keeps the exact max, nothing to compare. The flagged
    call it builds is a reference-max call."""
    from dispatcher.kernels import gluon_sm90, gluon_sm90_ws

    if not gluon_sm90.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    ab = load("prefill_redo_ab")
    from dispatcher.sweep.correctness import build

    cpu = torch.device("cpu")
    make = lambda rows, topk: build(rows, layout=Layout(512, 64), dtype=torch.bfloat16,  # noqa: E731
                                    device=cpu, topk=topk, kv_len=8192)
    for rows in (2, 300):
        pair = ab.variants(make(rows, 2048))
        assert set(pair) == {"redo_in_kernel", "redo_launch"} and all(callable(f) for f in pair.values())
    assert ab.variants(make(2, 128)) == {}
    keep = gluon_sm90_ws.redo_in_kernel
    with ab.redo_here(False):
        assert gluon_sm90_ws.redo_in_kernel(make(2, 2048)) is False
    assert gluon_sm90_ws.redo_in_kernel is keep
    call = ab.flagged_call(Layout(512, 0), torch.bfloat16, None, cpu)
    assert gluon_sm90_ws.prefill_reference(call) and call.kv.shape[0] == 8192 + 128
