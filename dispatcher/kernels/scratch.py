"""Scratch a launch reuses from call to call: per device and stream, grown when too small, never shrunk.

The split-K decode's partials and the prefill's redo flags live here, so a call's launch path
makes no allocator call and launches no memset beside a kernel that may take 7 µs. Each buffer
is made once per (device, stream, name) and handed out again; the flags are zeroed when made
and the redo kernel that reads them resets them, so they are zero whenever a call starts.

One buffer per stream: calls on a stream run in order, so they never use it at once. A buffer
first needed while a CUDA graph is being captured is made for that capture only (from the
capture's pool; its zeroing, a memset, is captured with it), and not kept: a kept buffer must
have been zeroed by work that actually ran.
"""

from __future__ import annotations

from typing import Any

import torch


def capturing() -> bool:
    """Is the current stream capturing a CUDA graph? Asked only when a buffer must be made."""
    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


class Scratch:
    """Buffers by (device index, stream handle, name)."""

    __slots__ = ("_buffers",)

    def __init__(self) -> None:
        self._buffers: dict[tuple[int, int, str], torch.Tensor] = {}

    def get(self, name: str, numel: int, dtype: torch.dtype, device: torch.device, stream: int, *,
            zeroed: bool) -> torch.Tensor:
        """A flat buffer of at least ``numel`` elements (``zeroed``: all zero, for a kernel that resets what it reads)."""
        key = (device.index or 0, stream, name)
        buf = self._buffers.get(key)
        if buf is not None and buf.numel() >= numel and buf.dtype == dtype:
            return buf
        make = torch.zeros if zeroed else torch.empty
        if capturing():
            return make(numel, dtype=dtype, device=device)
        grown = max(numel, 2 * buf.numel() if buf is not None else 0)
        buf = self._buffers[key] = make(grown, dtype=dtype, device=device)
        return buf

    def __len__(self) -> int:
        return len(self._buffers)

    def holds(self, buf: torch.Tensor) -> bool:
        """Whether ``buf`` is one this scratch keeps (not a capture's own): a launch recipe may keep it too."""
        return any(b is buf for b in self._buffers.values())

    def clear(self) -> None:
        """Drop every buffer (tests; a process that wants the memory back)."""
        self._buffers.clear()


_SCRATCH = Scratch()


def scratch() -> Scratch:
    """The process's scratch (the kernels are process-wide too)."""
    return _SCRATCH


def view(buf: torch.Tensor, shape: tuple[int, ...]) -> Any:
    """The first ``prod(shape)`` elements of a flat buffer, as ``shape``."""
    n = 1
    for s in shape:
        n *= s
    return buf[:n].view(shape)
