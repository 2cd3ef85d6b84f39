"""Small real calls on CPU for the experiment tests: real torch kernels on real tensors, a what-if CPU platform."""

from __future__ import annotations

import torch

from dispatcher import Dispatcher, what_if
from dispatcher.kernels import default_registry

H, NOPE, ROPE = 2, 48, 16
D = NOPE + ROPE


def call_args(rows: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> list:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, H, D, generator=g).to(dtype)
    kv = torch.randn(40, 1, D, generator=g).to(dtype)
    idx = torch.randint(-1, 40, (rows, 16), generator=g, dtype=torch.int32)
    out = torch.full((rows, H, NOPE), float("nan"), dtype=dtype)
    return [q, kv, idx, None, 0.2, D, NOPE, ROPE, None, out]


def cpu_dispatcher(registry=None) -> Dispatcher:
    return Dispatcher(platform=what_if("cpu"), registry=registry or default_registry(triton=False))
