"""Launching a compiled kernel straight through its handle, once the JIT has compiled it for a call like this one.

``kernel[grid](*args, **consts)`` asks Triton's JIT to specialise every argument (dtypes, which
integers are 1 or multiples of 16, which pointers are 16-byte aligned) and look the compiled
kernel up on every launch: about 10 µs of host time for a trivial kernel on an H200's host and
tens of µs for ours, against a few µs for the compiled kernel's own launcher. ``launch`` keeps
the ``CompiledKernel`` the JIT returned for the first call under a key the caller computes, and
later calls with that key go to ``CompiledKernel.run`` directly.

The key is the caller's promise: two calls with the same key would get the same specialisation
from the JIT. The launches here derive every integer they pass from the call's shapes, strides,
dtypes and the launch configuration, so a key made of those, the pointers' dtypes and alignment
and the constexprs keeps it (``plan.launch_key``). Anything else (the Triton interpreter, a
Triton whose JIT returns no compiled kernel, a kernel whose runtime parameters do not all come
first, a test double standing in for a kernel) launches through the JIT every time: slower, never
wrong.
"""

from __future__ import annotations

from typing import Any

import torch

DIRECT = True  # False: every launch through the JIT (the GPU tests compare the two paths bit for bit)
# A recipe step hands the compiled launcher each tensor's address as an int. Handed a tensor, Triton's launcher
# calls its data_ptr() and then the driver's cuPointerGetAttribute to check the address, once per pointer on
# every launch (12 pointers for the Hopper prefill); handed an int, neither. The check is redundant here: the
# dispatcher has checked every tensor's device before any launch (docs/benchmarks.md, "Host cost of a call").
# False: tensors, as the JIT passes them (``routescope bench host`` times both).
RAW_POINTERS = True
_HANDLES: dict[tuple[Any, Any], tuple[Any, tuple]] = {}
_RUNTIME_FIRST: dict[Any, bool] = {}


def current_stream(device_index: int) -> int:
    """The raw handle of the current CUDA stream of a device (what Triton's JIT launches on); 0 off CUDA (-1)."""
    return torch._C._cuda_getCurrentRawStream(device_index) if device_index >= 0 else 0


def launch(fn: Any, key: Any, grid: tuple, args: tuple, consts: dict[str, Any], stream: int) -> None:
    """Launch ``fn`` over ``grid`` with ``args`` (every runtime parameter, in order) and ``consts`` (the constexpr
    parameters and compile options) on ``stream``, the raw handle of the current stream (the JIT, the first time,
    looks that up itself)."""
    entry = _HANDLES.get((fn, key)) if DIRECT else None
    if entry is not None:
        handle, tail = entry
        handle.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
                   handle.function, handle.packed_metadata, None, None, None, *args, *tail)
        return
    handle = fn[grid](*args, **consts)
    if handle is not None and hasattr(handle, "packed_metadata") and _runtime_first(fn):
        _HANDLES[(fn, key)] = (handle, _constexpr_tail(fn.params, len(args), consts))


def handles() -> int:
    """How many compiled handles are kept."""
    return len(_HANDLES)


def _runtime_first(fn: Any) -> bool:
    """Whether every runtime parameter of ``fn`` comes before every constexpr one (the order the launcher reads)."""
    ok = _RUNTIME_FIRST.get(fn)
    if ok is None:
        ok, seen_constexpr = True, False
        for p in getattr(fn, "params", None) or ():
            if p.is_constexpr:
                seen_constexpr = True
            elif seen_constexpr:
                ok = False
        ok = ok and getattr(fn, "params", None) is not None
        _RUNTIME_FIRST[fn] = ok
    return ok


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


# What Triton 3.6's CudaLauncher.__call__ does for a kernel with no global or profile scratch: hand its arguments
# to the compiled C launcher with four of its own in front. Where the installed Triton's launcher reads exactly
# so, a recipe step calls the C launcher itself (about 1.5 µs a launch on an H200's host); anywhere else, the
# handle's run().
_LAUNCHER_CALL = ("self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, "
                  "self.launch_pdl, global_scratch, profile_scratch, *args)")
_CALL_CHECKED: dict[type, bool] = {}


def _c_launcher(run: Any) -> tuple[Any, tuple] | None:
    """(the compiled C launch, the arguments it takes before the metadata) where that is safe, else None."""
    launch = getattr(run, "launch", None)
    if launch is None or getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return None
    if getattr(run, "gsan_enabled", False):
        return None
    kind = type(run)
    ok = _CALL_CHECKED.get(kind)
    if ok is None:
        try:
            import inspect

            ok = _LAUNCHER_CALL in " ".join(inspect.getsource(kind.__call__).split())
        except (OSError, TypeError):
            ok = False
        _CALL_CHECKED[kind] = ok
    return (launch, (run.launch_cooperative_grid, run.launch_pdl, None, None)) if ok else None


class Step:
    """One kernel launch of a launch recipe: the kernel, its handle key, grid and constexprs fixed; ``step(args,
    stream)`` launches it. After the first launch compiled it, the handle's launcher is kept here, so a call pays
    neither the JIT nor a lookup of the handle."""

    __slots__ = ("fn", "key", "grid", "consts", "_run", "_head", "_tail", "_c", "_ptrs")

    def __init__(self, fn: Any, key: Any, grid: tuple, consts: dict[str, Any]) -> None:
        self.fn, self.key, self.grid, self.consts = fn, key, grid, consts
        self._run: Any = None
        self._head: tuple = ()
        self._tail: tuple = ()
        self._c: Any = None
        self._ptrs: tuple[int, ...] = ()  # the positions of the pointer arguments (``RAW_POINTERS``)

    def __call__(self, args: tuple, stream: int) -> None:
        run = self._run
        if run is not None and DIRECT:
            if RAW_POINTERS:
                args = list(args)
                for i in self._ptrs:
                    args[i] = args[i].data_ptr()
            g = self._head
            c = self._c
            if c is not None:  # the C launcher itself: coop, pdl, no scratch, then the metadata and hooks
                c[0](g[0], g[1], g[2], stream, g[3], *c[1], g[4], None, None, None, *args, *self._tail)
            else:
                run(g[0], g[1], g[2], stream, g[3], g[4], None, None, None, *args, *self._tail)
            return
        launch(self.fn, self.key, self.grid, args, self.consts, stream)
        entry = _HANDLES.get((self.fn, self.key))
        if entry is not None:
            handle, self._tail = entry
            grid = self.grid
            self._head = (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
                          handle.function, handle.packed_metadata)
            self._c = _c_launcher(handle.run)
            self._ptrs = tuple(i for i, a in enumerate(args) if hasattr(a, "data_ptr"))
            self._run = handle.run
