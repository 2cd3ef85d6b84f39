"""Launching through cached compiled handles changes nothing (marker gpu): for every layout, dtype (bf16, fp16, an
fp8 pool) and edge case of the correctness set, the registry's kernels give bit-identical outputs through the JIT
and through the handles (the second launch of each case hits the cache), scratch that grows and shrinks back
included, and the cached path is captured and replayed by a CUDA graph."""

from __future__ import annotations

import pytest
import torch

from dispatcher.kernels import launcher
from dispatcher.kernels.registry import default_registry
from dispatcher.sweep.correctness import build, cases
from dispatcher.sweep.grid import Layout
from dispatcher.types import Kernel

pytestmark = pytest.mark.gpu

KERNELS = {"prefill": Kernel.INTREE_RAGGED_PREFILL, "decode": Kernel.INTREE_SPARSE_DECODE}


def _run(impl, args, *, direct: bool) -> torch.Tensor:
    out = args._replace(output=torch.full_like(args.output, float("nan")))
    launcher.DIRECT = direct
    try:
        impl.launch(out)
        impl.launch(out)  # the second launch of a case: the cached handle where direct
    finally:
        launcher.DIRECT = True
    torch.cuda.synchronize()
    return out.output


@pytest.mark.parametrize("kv_dtype", [None, "float8_e4m3fn"], ids=["pool-in-q-dtype", "fp8-pool"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_cached_handles_give_the_jit_launchs_bits(dtype, kv_dtype):
    reg = default_registry()
    kv = getattr(torch, kv_dtype) if kv_dtype else None
    bad = []
    for name, args in cases(dtype, torch.device("cuda"), big=False, kv_dtype=kv):
        for kname, kernel in KERNELS.items():
            impl = reg.resolve(kernel, "cuda")
            jit, cached = _run(impl, args, direct=False), _run(impl, args, direct=True)
            if not torch.equal(jit.nan_to_num(7.0), cached.nan_to_num(7.0)) or jit.isnan().any():
                bad.append(f"{kname} {name}")
    assert not bad, bad


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_scratch_that_grows_keeps_answers_exact(kernel):
    """Small, large, small again: the scratch grows once and the small call reads only its part."""
    impl = default_registry().resolve(KERNELS[kernel], "cuda")
    make = lambda rows, seed: build(rows, layout=Layout(512, 64), dtype=torch.bfloat16,  # noqa: E731
                                    device=torch.device("cuda"), seed=seed)
    for rows, seed in ((2, 1), (300, 2), (2, 3), (16, 4)):
        args = make(rows, seed)
        assert torch.equal(_run(impl, args, direct=False), _run(impl, args, direct=True)), (kernel, rows)


def _hopper_pair(args):
    """The Hopper decode's two-launch recipe where its eager default is one launch, else None."""
    from dispatcher.kernels import gluon_sm90

    if not (gluon_sm90.HAVE_GLUON and gluon_sm90.supports_decode(args)):
        return None
    return gluon_sm90.two_launch_recipe(args)


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_the_cached_path_is_captured_and_replayed(kernel):
    impl = default_registry().resolve(KERNELS[kernel], "cuda")
    args = build(16, layout=Layout(512, 64), dtype=torch.bfloat16, device=torch.device("cuda"), seed=5)
    want = _run(impl, args, direct=True)
    two = _hopper_pair(args) if kernel == "decode" else None
    if two is not None:  # a capture takes the decode's two launches, an eager call its one (gluon_sm90)
        want = args._replace(output=torch.full_like(args.output, float("nan")))
        two(want)
        torch.cuda.synchronize()
        want = want.output
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        impl.launch(args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        impl.launch(args)
    for _ in range(3):
        args.output.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(args.output, want)
