"""A NaN in q reaches that row and head of the output as NaN in the Triton kernels too (the float64 loop's answer).

Under the interpreter here; with a GPU the same test runs on the compiled kernels (marker gpu),
where the hardware max may drop a NaN: the accumulator carries it to the output anyway.
"""

from __future__ import annotations

import pytest
import torch

from .cases import make_case


def _check(kernels, which: str, sink: bool, device: str = "cpu") -> None:
    prefill, decode = kernels
    case = make_case(11, sq=3, heads=2, dtype=torch.float32, sink=sink, device=device)
    args = case.fresh_output()
    args.q[1, 0, 3] = float("nan")
    (prefill.launch if which == "prefill" else decode.launch)(args)
    exp = case.expected()
    got = args.output.cpu().double()
    assert torch.equal(torch.isnan(got), torch.isnan(exp)) and torch.isnan(got[1, 0]).all()
    ok = ~torch.isnan(exp)
    torch.testing.assert_close(got[ok], exp[ok], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("which", ["prefill", "decode"])
@pytest.mark.parametrize("sink", [False, True])
def test_nan_in_q_interpreted(interp, which, sink):
    _check(interp, which, sink)


@pytest.mark.gpu
@pytest.mark.parametrize("which", ["prefill", "decode"])
@pytest.mark.parametrize("sink", [False, True])
def test_nan_in_q_compiled(compiled, which, sink):
    _check(compiled, which, sink, device="cuda")
