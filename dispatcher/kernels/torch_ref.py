"""The in-tree ragged prefill in plain torch: no split-K, fp32 accumulation, bounded memory.

Computes the contract of docs/kernels.md directly: each chunk's valid slots (``common.row_slots``), the scores
over them, a softmax with the sink's mass, V the first ``lanes`` lanes. Rows are processed in chunks sized so
that the gathered kv rows and the score matrix of one chunk stay under ``workspace_bytes``; a 16,384-row x top-k
2048 call never materialises the whole gather. It runs on any device and dtype torch runs on and is the reference
the fast kernels are checked against.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from .common import KernelArgs, index_width, row_slots

DEFAULT_WORKSPACE_BYTES = 256 << 20


def chunk_rows(width: int, head_dim: int, heads: int, workspace_bytes: int) -> int:
    """How many query rows one chunk may hold: fp32 gather (x2 for temporaries) plus scores."""
    per_row = max(1, width) * (head_dim * 4 * 2 + heads * 4 * 3)
    return max(1, workspace_bytes // per_row)


def attend_rows(
    q: torch.Tensor,
    kv_rows: torch.Tensor,
    valid: torch.Tensor,
    scale: float,
    sink: torch.Tensor | None,
    lanes: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unnormalised attention of q [C,H,D] over gathered kv [C,K,D]: (acc [C,H,L], m [C,H], l [C,H]).

    ``m`` is -inf for a row with no valid slot; the sink enters only through the caller.
    """
    c, h = q.shape[0], q.shape[1]
    if kv_rows.shape[1] == 0:  # every row of this chunk is empty
        m = torch.full((c, h), float("-inf"), device=q.device)
        if sink is not None:
            m = torch.maximum(m, sink.float()[None, :])
        zeros = torch.zeros(c, h, device=q.device)
        return torch.zeros(c, h, lanes, device=q.device), m, zeros
    scores = torch.bmm(q.float(), kv_rows.transpose(1, 2)) * scale  # [C, H, K]
    scores.masked_fill_(~valid[:, None, :], float("-inf"))
    m = scores.amax(dim=-1)
    if sink is not None:
        m = torch.maximum(m, sink.float()[None, :])
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(scores - m_safe[..., None])
    l = p.sum(dim=-1)
    acc = torch.bmm(p, kv_rows[:, :, :lanes])
    return acc, m, l


def finish(acc: torch.Tensor, m: torch.Tensor, l: torch.Tensor, sink: torch.Tensor | None) -> torch.Tensor:
    """Normalise, adding the sink's mass (it has no value); rows with no mass give 0."""
    if sink is not None:
        m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        l = l + torch.exp(sink.float()[None, :] - m_safe)
    out = acc / l.clamp_min(torch.finfo(torch.float32).tiny)[..., None]
    return torch.where((l == 0)[..., None], torch.zeros_like(out), out)  # NaN mass stays NaN


def chunks(args: KernelArgs, workspace_bytes: int) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor]]:
    """The call's query rows in chunks whose gather fits ``workspace_bytes`` (``chunk_rows``): (rows, slots, valid)
    each, as ``common.row_slots`` gives them."""
    rows, heads, head_dim = args.q.shape
    step = chunk_rows(index_width(args.index), head_dim, heads, workspace_bytes)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        yield slice(r0, r1), *row_slots(args.index, r0, r1, args.kv.shape[0])


def gather(args: KernelArgs, slots: torch.Tensor) -> torch.Tensor:
    """The kv rows at ``slots`` [C, K], as fp32 [C, K, D]."""
    kv = args.kv.reshape(args.kv.shape[0], -1)
    return kv[slots.reshape(-1)].reshape(*slots.shape, kv.shape[1]).float()


def ragged_prefill(args: KernelArgs, *, workspace_bytes: int = DEFAULT_WORKSPACE_BYTES) -> None:
    """Write attention for every query row into ``args.output`` (in place)."""
    out = args.output
    for rows, slots, valid in chunks(args, workspace_bytes):
        acc, m, l = attend_rows(args.q[rows], gather(args, slots), valid, args.scale, args.attn_sink, out.shape[2])
        out[rows] = finish(acc, m, l, args.attn_sink).to(out.dtype)
