"""What every kernel implementation takes (``KernelArgs``, ``SparseIndex``), and the helpers they share.

``row_slots`` reads an index the way the contract of docs/kernels.md defines a row's valid slots (the torch
implementations use it; the GPU kernels compute the same in their tile loops); ``index_width`` and ``empty_call``
are host-side facts of a call; ``device_capability`` and ``sm_count`` ask the driver once per device, since
launches ask on every call.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch


class SparseIndex(NamedTuple):
    """Which kv rows each query row attends to: dense padded indices, or a ragged CSR form."""

    indices: torch.Tensor | None  # [sq, topk] int32/int64, -1 padded
    topk_length: torch.Tensor | None  # [sq] or None (then the count of indices >= 0)
    ragged_indices: torch.Tensor | None = None  # [nnz]
    ragged_indptr: torch.Tensor | None = None  # [sq + 1]

    @property
    def ragged(self) -> bool:
        return self.ragged_indptr is not None


class KernelArgs(NamedTuple):
    """One call's operands, already validated by the dispatcher."""

    q: torch.Tensor  # [sq, H, D]
    kv: torch.Tensor  # [skv, 1, D]
    index: SparseIndex
    scale: float
    attn_sink: torch.Tensor | None  # [H]
    output: torch.Tensor  # [sq, H, nope] or [sq, H, D]
    stamp: Any = None  # a stamps.DeviceStamp: where the call's kernels write their start and end times
    memo: dict | None = None  # private to the call's signature (plan.memo_of): what launches computed for it


def empty_call(args: KernelArgs) -> bool:
    """No rows, heads or output lanes: nothing to write, and a launch returns before any work."""
    q = args.q
    return q.shape[0] == 0 or q.shape[1] == 0 or args.output.shape[2] == 0


def row_slots(index: SparseIndex, r0: int, r1: int, skv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Slots and validity for rows [r0, r1): (int64 [C, K] with invalid set to 0, bool [C, K]).

    Valid means: position j within the row's length, slot s with 0 <= s < skv. Offsets are
    int64 because page-table slots overflow int32 on large pools.
    """
    if index.ragged:
        indptr = index.ragged_indptr[r0 : r1 + 1].long()
        starts = indptr[:-1]
        lens = indptr[1:] - starts
        width = int(lens.max().item()) if lens.numel() else 0
        pos = torch.arange(width, device=starts.device)
        in_row = pos[None, :] < lens[:, None]
        flat = (starts[:, None] + pos[None, :]).clamp_max(max(index.ragged_indices.numel() - 1, 0))
        slots = index.ragged_indices.long()[flat] if index.ragged_indices.numel() else flat
    else:
        slots = index.indices[r0:r1].long()
        pos = torch.arange(slots.shape[1], device=slots.device)
        in_row = torch.ones_like(slots, dtype=torch.bool)
    if index.topk_length is not None:
        in_row = in_row & (pos[None, :] < index.topk_length[r0:r1].long()[:, None])
    elif not index.ragged:
        count = (index.indices[r0:r1] >= 0).sum(dim=1)
        in_row = pos[None, :] < count[:, None]
    valid = in_row & (slots >= 0) & (slots < skv)
    return torch.where(valid, slots, torch.zeros_like(slots)), valid


def index_width(index: SparseIndex) -> int:
    """The widest row a kernel may see (top-k for dense indices)."""
    if index.ragged:
        ptr = index.ragged_indptr
        return int((ptr[1:] - ptr[:-1]).max().item()) if ptr.numel() > 1 else 0
    return int(index.indices.shape[1])


_CAPABILITY: dict[int, tuple[int, int]] = {}
_SMS: dict[int, int] = {}


def device_key(device: torch.device) -> int:
    """A CUDA device's index (the current device for a bare "cuda"): the key of the per-device caches."""
    return device.index if device.index is not None else torch.cuda.current_device()


def device_capability(device: torch.device) -> tuple[int, int]:
    """A CUDA device's compute capability, asked of the driver once per device (launches ask on every call)."""
    key = device_key(device)
    if key not in _CAPABILITY:
        _CAPABILITY[key] = tuple(torch.cuda.get_device_capability(key))
    return _CAPABILITY[key]


def sm_count(device: torch.device) -> int:
    """Multiprocessors of a CUDA device (cached); 8 elsewhere, which keeps interpreter grids small."""
    if device.type != "cuda":
        return 8
    key = device_key(device)
    if key not in _SMS:
        _SMS[key] = torch.cuda.get_device_properties(key).multi_processor_count
    return _SMS[key]
