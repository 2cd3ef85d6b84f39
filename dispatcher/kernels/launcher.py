"""Launching a compiled kernel straight through its handle, once the JIT has compiled it for a call like this one.

``kernel[grid](*args, **consts)`` asks Triton's JIT to specialise every argument (dtypes, which
integers are 1 or multiples of 16, which pointers are 16-byte aligned) and look the compiled
kernel up on every launch: about 10 µs of host time for a trivial kernel on an H200's host and
tens of µs for ours, against a few µs for the compiled kernel's own launcher. ``Launcher`` keeps
the ``CompiledKernel`` the JIT returned for the first call under a key the caller computes, and
later calls with that key go to ``CompiledKernel.run`` directly.

The key is the caller's promise: two calls with the same key would get the same specialisation
from the JIT. The launches here derive every integer they pass from the call's shapes, strides,
dtypes and the launch configuration, so a key made of the call's signature (``signature.py``),
its pointers' alignment and the configuration keeps it. Anything else (the Triton interpreter,
a Triton whose JIT returns no compiled kernel, a kernel whose runtime parameters do not all come
first) launches through the JIT every time: slower, never wrong.
"""

from __future__ import annotations

from typing import Any

import torch

DIRECT = True  # False: every launch through the JIT (the GPU tests compare the two paths bit for bit)


def current_stream(device_index: int) -> int:
    """The raw handle of the current CUDA stream of a device (what Triton's JIT launches on)."""
    return torch._C._cuda_getCurrentRawStream(device_index)


class Launcher:
    """One JIT kernel, launched through compiled handles kept per key."""

    __slots__ = ("fn", "_handles", "_direct")

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self._handles: dict[Any, tuple[Any, tuple]] = {}
        params = getattr(fn, "params", None)
        # the direct path needs every runtime parameter before every constexpr one (the order the launcher reads)
        self._direct = params is not None and _runtime_first(params)

    def __call__(self, key: Any, grid: tuple, args: tuple, consts: dict[str, Any], device_index: int) -> None:
        """Launch over ``grid`` with the runtime arguments ``args`` (every runtime parameter, in order) and ``consts``
        (the constexpr parameters and compile options), on the device's current stream."""
        entry = self._handles.get(key) if DIRECT else None
        if entry is not None:
            handle, tail = entry
            handle.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
                       current_stream(device_index), handle.function, handle.packed_metadata, None, None, None,
                       *args, *tail)
            return
        handle = self.fn[grid](*args, **consts)
        if self._direct and handle is not None and hasattr(handle, "run") and hasattr(handle, "packed_metadata"):
            self._handles[key] = (handle, _constexpr_tail(self.fn.params, len(args), consts))

    def __len__(self) -> int:
        return len(self._handles)


def _runtime_first(params: Any) -> bool:
    seen_constexpr = False
    for p in params:
        if p.is_constexpr:
            seen_constexpr = True
        elif seen_constexpr:
            return False
    return True


def _constexpr_tail(params: Any, n_args: int, consts: dict[str, Any]) -> tuple:
    """The values the launcher takes after the runtime arguments: each constexpr parameter's, given or default."""
    tail = []
    for p in list(params)[n_args:]:
        if p.name in consts:
            tail.append(consts[p.name])
        elif p.has_default:
            tail.append(p.default)
        else:
            raise TypeError(f"{p.name} has no value")
    return tuple(tail)


def alignment(*tensors: Any) -> int:
    """0 when every tensor's data is 16-byte aligned (the usual case: one test), else each one's residue, packed."""
    bits = 0
    for t in tensors:
        if t is not None:
            bits |= t.data_ptr()
    if not bits & 15:
        return 0
    out = 1
    for t in tensors:
        out = out * 16 + (0 if t is None else t.data_ptr() & 15)
    return out
