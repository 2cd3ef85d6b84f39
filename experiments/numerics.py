"""The numerics sample: A's output against B's scratch at the sweep's tolerance, compared without a sync.

On a CPU tensor the comparison is made at once. On a GPU it is queued on the stream (two reductions copied into
pinned host memory, then an event) and read at flush once the event has completed, with no CUDA call; until a cell's first sample has passed, every
B call of that cell is a sample, so the caller never receives an output of B that was not checked.
"""

from __future__ import annotations

from typing import Any

from dispatcher.sweep.correctness import BOUND


def _within(dist: float, norm: float, bound: float) -> bool:
    """Relative distance within the bound (an all-zero output must be matched exactly); False for NaN."""
    return dist <= bound * max(norm, 1e-30)


class Numerics:
    """Queued comparisons and their results."""

    def __init__(self, tolerance: float | None = None, torch_mod: Any = None) -> None:
        self.tolerance = tolerance
        self._torch = torch_mod  # torch, or a stand-in for its cuda module in tests
        self._done: list[tuple[Any, bool]] = []
        self._pending: list[tuple[Any, Any, Any, float]] = []

    @property
    def pending_on_device(self) -> bool:
        return bool(self._pending)

    def bound(self, dtype: Any) -> float:
        return self.tolerance if self.tolerance is not None else BOUND.get(dtype, 1e-2)

    def compare(self, cell: Any, expected: Any, got: Any) -> None:
        """Queue (or make, on CPU) one comparison of B's output ``got`` against A's ``expected``."""
        import torch

        bound = self.bound(expected.dtype)
        # two reductions in the tensors' own dtype (accumulated in fp32 by torch): a NaN or inf in B's output makes
        # the distance NaN or inf, and the comparison below false
        dist = torch.dist(got, expected)
        norm = torch.linalg.vector_norm(expected)
        if not expected.is_cuda:
            self._done.append((cell, _within(float(dist), float(norm), bound)))
            return
        cuda = (self._torch or torch).cuda
        host = torch.empty(2, dtype=torch.float32, pin_memory=True)  # read at flush with plain loads, no CUDA call
        host.copy_(torch.stack([dist.float(), norm.float()]), non_blocking=True)
        event = cuda.Event(enable_timing=True)
        event.record(cuda.current_stream(expected.device))
        self._pending.append((cell, host, event, bound))

    def resolve(self) -> list[tuple[Any, bool]]:
        """Comparisons finished since the last call: (cell, passed)."""
        done, self._done = self._done, []
        keep = []
        for cell, rel, event, bound in self._pending:
            if event.query():
                done.append((cell, _within(float(rel[0]), float(rel[1]), bound)))  # a host tensor, copied
            else:
                keep.append((cell, rel, event, bound))
        self._pending = keep
        return done
