"""Test inputs for the Triton kernels, and an independent float64 loop to check them against.

``loop_attention`` is written from the contract of docs/kernels.md alone, one query row at a time, and shares no
code with the kernels or with the torch reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dispatcher.kernels.common import KernelArgs, SparseIndex

# Scaled-down head layouts with the production structure (power-of-two part + remainder):
# name: (nope, rope). 512+64 -> 32+16, 448+64 -> 48+16, 512+0 -> 32+0, plus odd splits.
LAYOUTS = {
    "v32": (32, 16),  # D=48: a power-of-two block plus a rope block (like 512+64)
    "dsv4": (48, 16),  # D=64: nope is not a power of two (like 448+64)
    "glm": (32, 0),  # no rope (like 512+0)
    "odd": (40, 24),  # nope spills past the power-of-two block; remainder not a power of two
}


def loop_attention(q, kv, rows_slots, scale, sink, lanes) -> torch.Tensor:
    """Attention per row over its listed slots (already filtered to the valid ones), in float64."""
    sq, heads, _ = q.shape
    out = torch.zeros(sq, heads, lanes, dtype=torch.float64)
    kv64 = kv[:, 0, :].double()
    for i, slots in enumerate(rows_slots):
        qi = q[i].double()  # [H, D]
        if slots:
            k = kv64[torch.tensor(slots, dtype=torch.long)]  # [n, D]
            s = scale * (qi @ k.T)  # [H, n]
            m = s.max(dim=1).values
        else:
            s = torch.zeros(heads, 0, dtype=torch.float64)
            m = torch.full((heads,), float("-inf"), dtype=torch.float64)
        if sink is not None:
            m = torch.maximum(m, sink.double())
        if not slots and sink is None:
            continue
        w = torch.exp(s - m[:, None])
        denom = w.sum(dim=1) + (torch.exp(sink.double() - m) if sink is not None else 0.0)
        if slots:
            out[i] = (w @ k[:, :lanes]) / denom[:, None]
    return out


def valid_slots(indices, topk_length, skv, ragged_indices=None, ragged_indptr=None) -> list[list[int]]:
    """Each row's valid slots, in order, by the rules of docs/kernels.md."""
    rows = []
    n = int(ragged_indptr.numel() - 1) if ragged_indptr is not None else int(indices.shape[0])
    for i in range(n):
        if ragged_indptr is not None:
            seg = ragged_indices[int(ragged_indptr[i]) : int(ragged_indptr[i + 1])].tolist()
        else:
            seg = indices[i].tolist()
        if topk_length is not None:
            length = int(topk_length[i])
        elif ragged_indptr is not None:
            length = len(seg)
        else:
            length = sum(1 for s in seg if s >= 0)
        rows.append([s for j, s in enumerate(seg) if j < length and 0 <= s < skv])
    return rows


@dataclass
class Case:
    """One call's operands plus what the loop needs to check it."""

    args: KernelArgs
    slots: list[list[int]]

    @property
    def lanes(self) -> int:
        return int(self.args.output.shape[2])

    def expected(self) -> torch.Tensor:
        a = self.args
        return loop_attention(a.q.cpu(), a.kv.cpu(), self.slots, a.scale,
                              None if a.attn_sink is None else a.attn_sink.cpu(), self.lanes)

    def fresh_output(self) -> KernelArgs:
        """The same call with the output poisoned with NaN, so an unwritten element shows."""
        return self.args._replace(output=torch.full_like(self.args.output, float("nan")))


def make_case(seed: int, *, layout: str = "v32", sq: int = 6, heads: int = 4, skv: int = 70, topk: int = 40,
              dtype: torch.dtype = torch.float16, sink: bool = False, out_full: bool = False,
              topk_length: str | None = None, ragged: bool = False, interleaved: bool = False,
              index_dtype: torch.dtype = torch.int32, device: str = "cpu", scale: float = 0.15,
              kv_dtype: torch.dtype | None = None) -> Case:
    """Random operands with the edge cases switched on by keyword.

    Always present: an empty row (all -1), -1 padding after each row's valid prefix, and
    out-of-range slots (skv, skv + 5, -7). ``topk_length``: None, "short" (inside the prefix),
    or "wild" (past the row's end, zero and negative too). ``interleaved`` puts -1 inside rows.
    ``kv_dtype``: the pool's dtype when it is not q's (an fp8 pool: values rounded to it).
    """
    g = torch.Generator().manual_seed(seed)
    nope, rope = LAYOUTS[layout]
    d = nope + rope
    q = torch.randn(sq, heads, d, generator=g).to(dtype)
    kv = torch.randn(skv, 1, d, generator=g).to(kv_dtype or dtype)
    idx = torch.stack([torch.randperm(skv, generator=g)[:topk] for _ in range(sq)]).to(index_dtype)
    lens = torch.randint(0, topk + 1, (sq,), generator=g)
    lens[-1] = topk  # one full row
    for i in range(sq):
        idx[i, int(lens[i]):] = -1
    idx[0] = -1  # empty row
    if sq > 2 and topk >= 3:
        idx[1, 0], idx[1, 1], idx[1, 2] = skv, skv + 5, -7  # out of range, and a negative that is not -1
        lens[1] = max(int(lens[1]), 3)
    if interleaved and sq > 3:
        for i in range(2, sq):
            idx[i, 1::3] = -1
    length = None
    if topk_length == "short":
        length = torch.clamp(lens - 3, min=0)
    elif topk_length == "wild":
        length = torch.randint(-2, topk + 8, (sq,), generator=g)
        length[0] = 0
    if length is not None:
        length = length.to(index_dtype)
    r_idx = r_ptr = None
    if ragged:  # CSR rows of varying width, some empty, some longer than others
        widths = torch.randint(0, topk + 1, (sq,), generator=g)
        widths[0] = 0
        widths[-1] = topk
        segs = [idx[i, : int(widths[i])] for i in range(sq)]
        r_idx = torch.cat(segs) if segs else torch.zeros(0, dtype=index_dtype)
        r_ptr = torch.zeros(sq + 1, dtype=index_dtype)
        r_ptr[1:] = torch.cumsum(widths, 0).to(index_dtype)
        idx = None
    s = torch.randn(heads, generator=g, dtype=torch.float32) * 2 if sink else None
    lanes = d if out_full else nope
    out = torch.full((sq, heads, lanes), float("nan"), dtype=dtype)
    slots = valid_slots(idx, length, skv, r_idx, r_ptr)

    def dev(t):
        return None if t is None else t.to(device)

    args = KernelArgs(dev(q), dev(kv), SparseIndex(dev(idx), dev(length), dev(r_idx), dev(r_ptr)), scale, dev(s),
                      dev(out))
    return Case(args, slots)
