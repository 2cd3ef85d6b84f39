"""fp8_ptx: which conversion a launch picks, the interpreter's ``.to()`` path, and the PTX compiled for sm_90.

The PTX itself runs only on an NVIDIA GPU: tests/dispatcher/kernels/test_triton_gpu.py checks every
conversion against torch's for all 256 bytes there. Here the compile for sm_90 (Triton carries ptxas)
checks what the PTX path exists for: each kv tile converted once, its loads asynchronous, no spills.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from dispatcher.kernels import fp8_ptx
from dispatcher.kernels.fp8_ptx import E4M3_BF16, E4M3_F16, E5M2_BF16, E5M2_F16, TO, kv8_mode

ROOT = Path(__file__).resolve().parents[3]
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
HOPPER = ("cuda", (9, 0))


@pytest.mark.parametrize(("kv", "q", "mode"), [
    (E4M3, torch.bfloat16, E4M3_BF16), (E5M2, torch.bfloat16, E5M2_BF16),
    (E4M3, torch.float16, E4M3_F16), (E5M2, torch.float16, E5M2_F16)])
def test_nvidia_sm89_onwards_reads_ocp_fp8_beside_16_bit_q_through_ptx(kv, q, mode):
    assert kv8_mode(kv, q, *HOPPER) == mode
    assert kv8_mode(kv, q, "cuda", (8, 9)) == mode  # Ada has cvt.f16x2.e4m3x2 too


@pytest.mark.parametrize(("kv", "q", "backend", "capability"), [
    (E4M3, torch.bfloat16, "cuda", (8, 0)),  # Ampere: no fp8 cvt
    (E4M3, torch.bfloat16, "cuda", None),
    (E4M3, torch.bfloat16, "cpu", None),  # the interpreter runs no PTX
    (E4M3, torch.bfloat16, "hip", (9, 4)),
    (torch.float8_e4m3fnuz, torch.bfloat16, *HOPPER),  # not a format the PTX reads
    (E4M3, torch.float32, *HOPPER),  # fp32 q: .to() is a plain widening
    (torch.bfloat16, torch.bfloat16, *HOPPER)])  # a 16-bit pool: no conversion at all
def test_everything_else_converts_with_to(kv, q, backend, capability):
    assert kv8_mode(kv, q, backend, capability) == TO


def test_kv_operand_hands_the_bits_only_to_a_ptx_conversion():
    pool = torch.randn(8, 1, 32).to(E4M3)
    same, mode = fp8_ptx.kv_operand(pool, torch.bfloat16)
    assert mode == TO and same is pool  # a CPU tensor: the interpreter's .to()
    bits, mode = fp8_ptx.kv_operand(pool, torch.bfloat16, E4M3_BF16)
    assert mode == E4M3_BF16 and bits.dtype == torch.uint8
    assert bits.data_ptr() == pool.data_ptr() and bits.stride() == pool.stride()
    assert torch.equal(bits, pool.view(torch.uint8))


def test_an_fp8_pool_through_ptx_gets_its_own_tile_config():
    from dispatcher.kernels.triton_prefill import FP8_CONFIG, PREFILL_CONFIG, TileConfig, config_for

    asked = TileConfig(16, 2, 1, 1)
    assert config_for(None, PREFILL_CONFIG, E4M3_BF16) == FP8_CONFIG != PREFILL_CONFIG
    assert config_for(None, PREFILL_CONFIG, TO) == PREFILL_CONFIG
    assert config_for(asked, PREFILL_CONFIG, E4M3_BF16) == asked


@pytest.mark.parametrize("kv", [E4M3, E5M2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz])
def test_the_interpreters_to_path_converts_every_finite_byte_as_torch_does(interp, kv):
    """Every finite value, bit for bit. Triton's interpreter maps fp8 NaN and inf to finite values (e4m3fn's 0xFF
    to -480), where torch and the compiled conversions keep them (the GPU test checks those bytes too)."""
    conv = sys.modules["dispatcher.kernels.fp8_ptx"]  # the interpreted module the fixture loaded
    pool = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(kv)
    got, want = conv.convert(pool, torch.bfloat16), pool.to(torch.bfloat16)
    keep = want.isfinite()
    assert int(keep.sum()) >= 248  # e5m2 has 2 infs and 6 NaNs
    assert torch.equal(got[keep].view(torch.int16), want[keep].view(torch.int16))  # -0.0 included


COMPILE = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from dispatcher.kernels import triton_decode, triton_prefill
    from tests.dispatcher.kernels.sm90_build import compile_sm90, stack_bytes

    cfg = triton_prefill.FP8_CONFIG
    found = {}
    for kv, q, mode in (("bf16", "bf16", 0), ("u8", "bf16", 1), ("u8", "bf16", 2), ("u8", "fp16", 3),
                        ("u8", "fp16", 4)):
        ptrs = {"q_ptr": "*" + q, "kv_ptr": "*" + kv, "out_ptr": "*" + q}
        consts = {"D": 576, "CH": 512 // cfg.chunks, "NCH": cfg.chunks, "BLOCK_B": 64, "HAS_B": True, "V_B": False,
                  "BLOCK_N": cfg.block_n, "HB": 16, "IEEE": False, "CNT_BLOCK": 2048, "KV8": mode, "PDL": False}
        for fn in (triton_prefill._prefill_kernel, triton_decode._partial_kernel):
            k = compile_sm90(fn, consts, ptrs, **cfg.launch_options())
            ttgir = k.asm["ttgir"]
            found[f"{fn.__name__}_{mode}"] = {
                "async_copies": ttgir.count("async_copy_global_to_local"), "asm": ttgir.count("elementwise_inline_asm"),
                "stack": stack_bytes(k, Path(sys.argv[1]) / f"{fn.__name__}_{mode}.cubin")}
    print(json.dumps(found))
""")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_the_ptx_path_compiles_for_sm90_with_each_tile_converted_once_and_loaded_asynchronously(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), TRITON_CACHE_DIR=str(tmp_path / "cache"))
    res = subprocess.run([sys.executable, "-c", COMPILE, str(tmp_path)], capture_output=True, text=True, env=env,
                         timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    found = json.loads(res.stdout.strip().splitlines()[-1])
    for kernel in ("_prefill_kernel", "_partial_kernel"):
        bf16 = found[f"{kernel}_0"]
        assert bf16["asm"] == 0 and bf16["stack"] == 0, bf16
        for mode in (1, 2, 3, 4):
            got = found[f"{kernel}_{mode}"]
            # at 512+64 a tile is loaded as 4 chunks of 128 lanes and 64 rope lanes: one conversion each, and
            # as many asynchronous copies as a bf16 pool's (a .to() conversion leaves only 4 of 12)
            assert got["asm"] == 5, (kernel, mode, got)
            assert got["async_copies"] == bf16["async_copies"] >= 10, (kernel, mode, got, bf16)
            assert got["stack"] == 0, (kernel, mode, got)  # FP8_CONFIG spills nowhere
