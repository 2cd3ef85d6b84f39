"""Full-shape correctness of the Triton kernels against the torch reference, on a GPU, every edge case.

Used by the GPU tests (marker ``gpu``) and by the H200 runner. The reference runs in
fp32 and writes fp32, so the error measured is the kernel's own (bf16 operands: 1e-3 to 1e-2
by docs/benchmarks.md, "Correctness on GPU"); outputs are poisoned with NaN first so an unwritten element fails.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch

from ..kernels.common import KernelArgs, SparseIndex, row_slots
from ..kernels.torch_ref import ragged_prefill as torch_ref
from .grid import Layout
from .inputs import topk_indices

BOUND = {torch.bfloat16: 1e-2, torch.float16: 3e-3, torch.float32: 1e-3}


class Check(NamedTuple):
    """One kernel on one case: relative error against the reference and the other checks."""

    case: str
    kernel: str
    dtype: str
    rel_err: float
    bound: float
    all_written: bool
    empty_rows_zero: bool

    @property
    def ok(self) -> bool:
        return self.rel_err <= self.bound and self.all_written and self.empty_rows_zero


def build(rows: int, *, layout: Layout, dtype: torch.dtype, device: torch.device, heads: int = 16, topk: int = 2048,
          kv_len: int = 8192, seed: int = 0, sink: bool = True, out_full: bool = False, pad: bool = True,
          interleave: bool = False, bad_slots: bool = True, topk_length: str | None = None, ragged: bool = False,
          index_dtype: torch.dtype = torch.int32, high_slots: bool = False,
          kv_dtype: torch.dtype | None = None) -> KernelArgs:
    """Random operands at full size with the requested edge cases (row 0 is always empty); ``kv_dtype``: the pool's
    dtype when it is not q's (an fp8 pool)."""
    g = torch.Generator(device=device).manual_seed(seed)
    d = layout.head_dim
    q = torch.randn((rows, heads, d), device=device, generator=g).to(dtype)
    kv = torch.randn((kv_len, 1, d), device=device, generator=g).to(kv_dtype or dtype)
    idx = topk_indices(rows, topk, min(kv_len, 1 << 16), device, g).long()
    if high_slots:  # push slots to the top of a huge pool: offsets past 2**31 elements
        idx = torch.where(idx >= 0, idx + (kv_len - (1 << 16)), idx)
    pos = torch.arange(topk, device=device)
    lens = torch.randint(0, topk + 1, (rows,), device=device, generator=g)
    lens[-1] = topk
    if pad:
        idx = torch.where(pos[None, :] < lens[:, None], idx, -1)
    if interleave:
        idx[:, 1::7] = -1
    if bad_slots and rows > 2 and topk >= 3:
        idx[1, :3] = torch.tensor([kv_len, kv_len + 99, -5], device=device)
    idx[0] = -1
    length = None
    if topk_length == "short":
        length = (lens - 5).clamp_min(0)
    elif topk_length == "wild":
        length = torch.randint(-3, topk + 50, (rows,), device=device, generator=g)
    index = SparseIndex(idx.to(index_dtype), None if length is None else length.to(index_dtype))
    if ragged:
        widths = torch.randint(0, topk + 1, (rows,), device=device, generator=g)
        widths[0], widths[-1] = 0, topk
        keep = pos[None, :] < widths[:, None]
        ptr = torch.zeros(rows + 1, dtype=torch.long, device=device)
        ptr[1:] = widths.cumsum(0)
        index = SparseIndex(None, index.topk_length, idx[keep].to(index_dtype), ptr.to(index_dtype))
    s = torch.randn((heads,), device=device, generator=g) * 2 if sink else None
    lanes = d if out_full else layout.nope
    out = torch.full((rows, heads, lanes), float("nan"), device=device, dtype=dtype)
    return KernelArgs(q, kv, index, 1.0 / d**0.5, s, out)


def check(name: str, kernel: str, launch: Callable[[KernelArgs], None], args: KernelArgs) -> Check:
    """Run ``launch`` and the fp32 reference on the same operands and compare."""
    launch(args)
    ref = args._replace(output=torch.empty(args.output.shape, dtype=torch.float32, device=args.output.device))
    torch_ref(ref)
    got = args.output.double()
    exp = ref.output.double()
    written = not bool(torch.isnan(got).any())
    rel = float(torch.linalg.vector_norm(torch.nan_to_num(got, nan=1e9) - exp) / torch.linalg.vector_norm(exp).clamp_min(1e-30))
    _, valid = row_slots(args.index, 0, args.q.shape[0], args.kv.shape[0])
    empty = ~valid.any(dim=1)
    zero = bool((got[empty] == 0).all()) if bool(empty.any()) else True
    dtype = str(args.q.dtype).removeprefix("torch.")
    if args.kv.dtype != args.q.dtype:
        dtype += " (kv " + str(args.kv.dtype).removeprefix("torch.") + ")"
    return Check(name, kernel, dtype, rel, BOUND[args.q.dtype], written, zero)


def cases(dtype: torch.dtype, device: torch.device, *, big: bool = True,
          kv_dtype: torch.dtype | None = None) -> Iterator[tuple[str, KernelArgs]]:
    """Every layout and output width at 257 rows, then the edge cases at 64 rows, then the target shapes."""
    make = functools.partial(build, dtype=dtype, device=device, kv_dtype=kv_dtype)
    for lay in (Layout(512, 64), Layout(448, 64), Layout(512, 0)):
        for full in (False, True):
            yield f"{lay} {'D' if full else 'nope'}-out 257 rows", make(257, layout=lay, out_full=full, seed=1)
    v32 = Layout(512, 64)
    edge = {
        "interleaved -1, bad slots, no sink": dict(interleave=True, sink=False),
        "topk_length wild": dict(topk_length="wild"),
        "topk_length short, int64": dict(topk_length="short", index_dtype=torch.int64),
        "ragged": dict(ragged=True),
        "ragged + topk_length": dict(ragged=True, topk_length="wild"),
        "20 heads (two blocks)": dict(heads=20),
        "128 heads": dict(heads=128, topk=512),
        "top-k 1": dict(topk=1, kv_len=16),
    }
    for name, kw in edge.items():
        yield f"{name} 64 rows", make(64, layout=v32, seed=2, **kw)
    for rows in (2, 16):
        yield f"decode shape {rows} rows", make(rows, layout=v32, pad=False, bad_slots=False, seed=3)
    if big:
        yield "int64 offsets (pool 4.2M rows)", make(8, layout=v32, kv_len=4_200_000, high_slots=True, seed=4)
        yield "prefill shape 16384 rows", make(16384, layout=v32, pad=False, bad_slots=False, kv_len=16384, seed=5)


def run_checks(launchers: dict[str, Callable[[KernelArgs], None]], dtypes: tuple[torch.dtype, ...],
               device: torch.device, *, big: bool = True, kv_dtype: torch.dtype | None = None) -> list[Check]:
    """Each launcher on each case (fresh operands per launcher, so neither sees the other's output); ``kv_dtype``
    puts every case's pool in that dtype (fp8), q and the output staying in each of ``dtypes``."""
    found = []
    for dtype in dtypes:
        for name, args in cases(dtype, device, big=big, kv_dtype=kv_dtype):
            for kname, launch in launchers.items():
                fresh = args._replace(output=torch.full_like(args.output, float("nan")))
                found.append(check(name, kname, launch, fresh))
            del args
    return found
