"""The device stamps as kernel code (``stamps.DeviceStamp``): Triton helpers, which the Gluon kernels call too.

Every stamping kernel takes ``stamp_ptr`` (int64, the ``(start, end)`` table), ``count_ptr`` (int32, a counter
per entry) and two entry indices, ``stamp_first`` and ``stamp_last`` (-1: not this kernel's to write). The call's
first kernel writes ``start`` from its program (0, 0, 0) as it begins; each program of the call's last kernel adds
one to the entry's counter when its work is done, and the one that brings the counter to the grid size writes
``end`` and resets the counter for the entry's next use. The atomic orders every program's work before the end is
read. Cost: one scalar store in one program, one atomic per program of the last kernel.

``CLOCK`` is ``GLOBALTIMER`` on NVIDIA GPUs (``%globaltimer``, nanoseconds, 32 ns steps on an H200) and
``COUNTER`` elsewhere: the Triton interpreter runs no inline assembly, so there the stamps are the constants 1 and
2, enough to test that the right programs write them (ROCm launches pass -1: no stamps).
"""

from __future__ import annotations

import triton
import triton.language as tl

COUNTER, GLOBALTIMER = 0, 1
STAMP_ARGS = ["stamp_first", "stamp_last"]  # entry indices, -1 or not: never specialised on


@triton.jit
def _clock(CLOCK: tl.constexpr, VALUE: tl.constexpr, scalar):
    """%globaltimer, or ``VALUE`` as a scalar made from ``scalar`` (a constant tensor needs a layout in Gluon)."""
    if CLOCK == 1:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    else:
        t = (scalar * 0 + VALUE).to(tl.int64)
    return t


@triton.jit
def stamp_start(stamp_ptr, stamp_first, CLOCK: tl.constexpr):
    """The call's start, written by program (0, 0, 0) of its first kernel as it begins."""
    if stamp_first >= 0:
        if tl.program_id(0) + tl.program_id(1) + tl.program_id(2) == 0:
            tl.store(stamp_ptr + 2 * stamp_first, _clock(CLOCK, 1, stamp_first))


@triton.jit
def stamp_end(stamp_ptr, count_ptr, stamp_last, CLOCK: tl.constexpr):
    """The call's end, written by the last program of its last kernel to finish; the counter goes back to zero."""
    if stamp_last >= 0:
        total = tl.num_programs(0) * tl.num_programs(1) * tl.num_programs(2)
        done = tl.atomic_add(count_ptr + stamp_last, 1)
        if done == total - 1:
            tl.store(stamp_ptr + 2 * stamp_last + 1, _clock(CLOCK, 2, stamp_last))
            tl.store(count_ptr + stamp_last, 0)
