"""Launch plans: what a launch works out on the host for a call, kept for the next call of the same signature.

A launch's grid, split count, strides, flags, constexprs and compiled handles follow from the
call's signature (every tensor's shape, strides, dtype and device), its pointers' alignment
and the launch options; only the tensors themselves, the scale and the stream change from call
to call. The dispatcher hands each call the memo of its signature (``KernelArgs.memo``, from
``signature.ValidatedCalls``); a caller without one (the sweep, the tests) gets a memo by a
signature computed here. A plan is stored in the memo under (its name, the alignment, the options).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

from .common import KernelArgs
from .launcher import alignment
from .stamps import no_stamp
from .triton_stamps import COUNTER, GLOBALTIMER

MAX_MEMOS = 1024
_MEMOS: dict[tuple, dict] = {}
P = TypeVar("P")


def _tensor(t: Any) -> Any:
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def memo_of(args: KernelArgs) -> dict:
    """The call's signature memo: the dispatcher's, or one found here by the tensors' layouts."""
    memo = args.memo
    if memo is not None:
        return memo
    index = args.index
    key = tuple(_tensor(t) for t in (args.q, args.kv, index.indices, index.topk_length, index.ragged_indices,
                                     index.ragged_indptr, args.attn_sink, args.output))
    memo = _MEMOS.get(key)
    if memo is None:
        memo = {}
        if len(_MEMOS) < MAX_MEMOS:
            _MEMOS[key] = memo
    return memo


def forget() -> None:
    """Drop the plans of calls that came without a memo (tests that pretend another GPU)."""
    _MEMOS.clear()


def planned(args: KernelArgs, name: str, options: tuple, build: Callable[[], P]) -> P:
    """The plan ``name`` of this call's signature, alignment and ``options``, built once by ``build``."""
    index = args.index
    key = (name, alignment(args.q, args.kv, index.indices, index.topk_length, index.ragged_indices,
                           index.ragged_indptr, args.attn_sink, args.output), options)
    memo = memo_of(args)
    plan = memo.get(key)
    if plan is None:
        plan = memo[key] = build()
    return plan


def launch_key(device: int, tensors: tuple, ints: tuple, consts: dict) -> tuple:
    """What Triton's JIT specialises a launch on, as a key (``launcher.Launcher``): the device, each pointer's dtype
    and 16-byte alignment, the integers (is it 1, a multiple of 16: they are kept whole here) and the constexprs."""
    return (device, tuple((t.dtype, t.data_ptr() & 15) for t in tensors), ints, tuple(sorted(consts.items())))


def clock_for(device: torch.device) -> int:
    """The stamps' clock on a device: %globaltimer on NVIDIA GPUs, constants under the CPU interpreter, and
    None where the kernels cannot stamp (ROCm: no %globaltimer in these kernels)."""
    if device.type != "cuda":
        return COUNTER
    return GLOBALTIMER if torch.version.hip is None else -1


def stamp_operands(args: KernelArgs, device: torch.device, clock: int) -> tuple[Any, Any, int]:
    """(stamp table, counters, entry) for a call's kernels; entry -1 (and placeholders) when it is not stamped."""
    stamp = args.stamp
    if stamp is None or clock < 0:
        times, counts = no_stamp(device)
        return times, counts, -1
    stamp.armed = True
    return stamp.times, stamp.counts, stamp.index


def index_operands(args: KernelArgs) -> tuple[Any, Any, Any, Any]:
    """(index, topk_length, indptr, sink) as the kernels take them: absent ones replaced by q (never read)."""
    index, q = args.index, args.q
    if index.ragged_indptr is not None:
        idx, indptr = index.ragged_indices, index.ragged_indptr
    else:
        idx, indptr = index.indices, q
    length = index.topk_length if index.topk_length is not None else q
    sink = args.attn_sink if args.attn_sink is not None else q
    return idx, length, indptr, sink
