"""What q and P in fp8 would do to the prefill's output: an emulation in torch, on CPU.

    python scripts/fp8_precision.py --rows 64 --sharpness 1,4,16

On an fp8 pool the kernels convert each kv tile to bf16 before their bf16 products, which cannot be as fast as
a bf16 pool (docs/benchmarks.md, "fp8 kv pools"). A kernel that could would run both products in fp8 (wgmma
e4m3): q and the softmax's P rounded to e4m3 as well as the pool. That changes the math; this says by how much,
on the sweep's own inputs.

Every variant computes the same attention in fp32 from the same operands, rounded as a kernel would round them:

- ``pool``: the exact attention over the pool as stored, the yardstick for the rest;
- ``bf16 P``: P rounded to bf16 before P·V, as every kernel here does today (on bf16 and fp8 pools alike);
- ``e4m3 q, bf16 P`` and ``bf16 q, e4m3 P x448``: one of the two alone (the scores' product in fp8, or P·V's);
- ``e4m3 q, e4m3 P``: q rounded to e4m3 with one scale per call (its largest magnitude to 448), P to e4m3
  unscaled (P <= 1, so its small values fall to e4m3's subnormals);
- ``e4m3 q, e4m3 P x448``: as above, P scaled by 448 before the rounding (its range used in full) and
  the product scaled back;
- ``e4m3 q hi+lo``: q carried as two e4m3 terms (q rounded, then the remainder rounded, each with its own
  scale), as one fp8 scores product with q's two terms side by side (N = 32) would carry it.

The softmax's running sum l is taken from the unrounded P, as the kernels take it. Errors are against
``pool`` on the same pool; the line "fp8 pool vs bf16 pool" shows what storing the pool in e4m3 alone moves
(what a user accepts with ``--kv-dtype float8_e4m3fn``), to set the others beside.

usage: python scripts/fp8_precision.py [--rows 64] [--topk 2048] [--layout 512+64] [--sharpness 1,4] [--seed 0]

``--sharpness`` multiplies the softmax scale: 1 is the sweep's inputs (random normal q and kv, scale
1/sqrt(D): flat attention over 2,048 keys), 4 a peakier softmax, nearer trained attention.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Callable, NamedTuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dispatcher.sweep.grid import parse_layouts  # noqa: E402
from dispatcher.sweep.inputs import topk_indices  # noqa: E402

E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max  # 448


def to_e4m3(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """x rounded to e4m3 after multiplying by ``scale`` and divided back: what an fp8 operand carries, in fp32."""
    return (x * scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).float() / scale


def call_scale(x: torch.Tensor) -> float:
    """One scale per call mapping x's largest magnitude to e4m3's largest value (1 for an all-zero x)."""
    amax = float(x.abs().max())
    return E4M3_MAX / amax if amax > 0 else 1.0


def split_e4m3(x: torch.Tensor) -> torch.Tensor:
    """x as the sum of two e4m3 terms, each with its own call scale (hi = x rounded, lo = the remainder
    rounded): what two fp8 products side by side in one wgmma (N = 2 x 16 heads) would see."""
    hi = _e4m3_call(x)
    return hi + _e4m3_call(x - hi)


class Variant(NamedTuple):
    name: str
    q: Callable[[torch.Tensor], torch.Tensor]  # how q enters the scores
    p: Callable[[torch.Tensor], torch.Tensor]  # how P enters P·V


def _same(x: torch.Tensor) -> torch.Tensor:
    return x


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def _e4m3_call(x: torch.Tensor) -> torch.Tensor:
    """e4m3 with one scale for the whole call (q)."""
    return to_e4m3(x, call_scale(x))


def _e4m3_448(x: torch.Tensor) -> torch.Tensor:
    """e4m3 after scaling by 448 (P <= 1: its range used in full)."""
    return to_e4m3(x, E4M3_MAX)


VARIANTS = (
    Variant("pool", _same, _same),
    Variant("bf16 P", _same, _bf16),
    Variant("e4m3 q, bf16 P", _e4m3_call, _bf16),
    Variant("bf16 q, e4m3 P x448", _same, _e4m3_448),
    Variant("e4m3 q, e4m3 P", _e4m3_call, to_e4m3),
    Variant("e4m3 q, e4m3 P x448", _e4m3_call, _e4m3_448),
    Variant("e4m3 q hi+lo, bf16 P", split_e4m3, _bf16),
    Variant("e4m3 q hi+lo, e4m3 P x448", split_e4m3, _e4m3_448),
)


def attend(q: torch.Tensor, kv: torch.Tensor, idx: torch.Tensor, scale: float, nope: int, v: Variant,
           chunk: int = 8) -> torch.Tensor:
    """[rows, H, nope] fp32: attention of q [rows, H, D] over kv [skv, D] (fp32 values) at idx [rows, K]
    (-1 invalid; a row with no valid slot gives 0), q and P rounded as the variant says. The math of
    ``torch_ref.attend_rows``/``finish``, written again because P's rounding falls between their steps; the
    tests hold the unrounded variant to the reference."""
    qv = v.q(q.float())
    out = torch.zeros(q.shape[0], q.shape[1], nope)
    for r0 in range(0, q.shape[0], chunk):
        sl = idx[r0:r0 + chunk].long()
        valid = sl >= 0
        rows = kv[sl.clamp_min(0)]  # [C, K, D]
        s = torch.bmm(qv[r0:r0 + chunk], rows.transpose(1, 2)) * scale
        s.masked_fill_(~valid[:, None, :], float("-inf"))
        m = s.amax(-1, keepdim=True)
        p = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
        l = p.sum(-1, keepdim=True)
        out[r0:r0 + chunk] = torch.bmm(v.p(p), rows[:, :, :nope]) / l.clamp_min(torch.finfo(torch.float32).tiny)
    return out


class Error(NamedTuple):
    rel_rms: float  # ||o - ref|| / ||ref|| over every row, head and lane
    max_rel: float  # max |o - ref| / max |ref|


def error(o: torch.Tensor, ref: torch.Tensor) -> Error:
    return Error(float((o - ref).norm() / ref.norm()), float((o - ref).abs().max() / ref.abs().max()))


def study(rows: int, topk: int, layout: str, sharpness: float, seed: int = 0) -> dict[str, Error]:
    """Each variant's error on one set of random inputs, and the fp8 pool's own against a bf16 pool."""
    lay = parse_layouts(layout)[0]
    kv_len = max(rows, 4 * topk)  # the sweep's default pool
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn((rows, 16, lay.head_dim), generator=gen).to(torch.bfloat16).float()
    kv32 = torch.randn((kv_len, lay.head_dim), generator=gen)
    idx = topk_indices(rows, topk, kv_len, torch.device("cpu"), gen)
    scale = sharpness / math.sqrt(lay.head_dim)
    kv8 = kv32.to(E4M3).float()
    ref = attend(q, kv8, idx, scale, lay.nope, VARIANTS[0])
    out = {v.name: error(attend(q, kv8, idx, scale, lay.nope, v), ref) for v in VARIANTS[1:]}
    bf16_pool = attend(q, kv32.to(torch.bfloat16).float(), idx, scale, lay.nope, VARIANTS[0])
    out["fp8 pool vs bf16 pool"] = error(ref, bf16_pool)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--layout", default="512+64")
    ap.add_argument("--sharpness", default="1,4", help="softmax scale multipliers, comma-separated")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    try:
        sharp = [float(x) for x in a.sharpness.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--sharpness takes numbers, e.g. 1,4 (got {a.sharpness!r})")
    if a.rows < 1 or a.topk < 1 or not sharp:
        ap.error("--rows and --topk must be >= 1 and --sharpness must name at least one value")
    print(f"rows {a.rows}, H 16, layout {a.layout}, top-k {a.topk}, fp8 pool e4m3fn, seed {a.seed}")
    print("| sharpness | variant | rel. RMS error | max error / max |out| |")
    print("| ---: | --- | ---: | ---: |")
    for s in sharp:
        for name, e in study(a.rows, a.topk, a.layout, s, a.seed).items():
            print(f"| {s:g} | {name} | {e.rel_rms:.2e} | {e.max_rel:.2e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
