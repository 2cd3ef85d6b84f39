"""scripts/fp8_precision.py: its attention is the reference's, its roundings are e4m3's, its ranking holds."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from dispatcher.kernels.common import KernelArgs, SparseIndex
from dispatcher.kernels.torch_ref import ragged_prefill

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture(scope="module")
def fp8():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import fp8_precision

        yield fp8_precision
    finally:
        sys.path.remove(str(SCRIPTS))


def test_unrounded_variant_is_the_torch_reference(fp8):
    """The emulation's exact path gives the dispatcher's reference, -1 slots and an empty row included."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn((5, 16, 80), generator=gen)
    kv = torch.randn((200, 80), generator=gen)
    idx = torch.randint(0, 200, (5, 24), generator=gen, dtype=torch.int32)
    idx[1, 10:] = -1
    idx[4] = -1
    want = torch.empty((5, 16, 64))
    ragged_prefill(KernelArgs(q, kv[:, None, :], SparseIndex(idx, None), 0.3, None, want))
    got = fp8.attend(q, kv, idx, 0.3, 64, fp8.VARIANTS[0], chunk=2)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    assert got[4].abs().max() == 0


def test_e4m3_rounding_and_its_scales(fp8):
    exact = torch.tensor([1.0, -0.5, 448.0, 0.0])
    assert torch.equal(fp8.to_e4m3(exact), exact)
    assert fp8.to_e4m3(torch.tensor([1000.0])).item() == 448.0  # clamped, not inf or nan
    tiny = torch.tensor([1e-4])
    assert fp8.to_e4m3(tiny).item() == 0.0  # under half e4m3's smallest subnormal (2^-9)
    assert fp8.to_e4m3(tiny, 448.0).item() == pytest.approx(1e-4, rel=0.07)  # scaled: 3 mantissa bits
    assert fp8.call_scale(torch.tensor([-2.0, 1.0])) == 224.0 and fp8.call_scale(torch.zeros(3)) == 1.0


def test_two_e4m3_terms_carry_q_far_closer_than_one(fp8):
    x = torch.randn(4096, generator=torch.Generator().manual_seed(1))
    one = (fp8.to_e4m3(x, fp8.call_scale(x)) - x).norm() / x.norm()
    two = (fp8.split_e4m3(x) - x).norm() / x.norm()
    assert 0 < two < one / 10


def test_study_ranks_the_roundings(fp8):
    err = fp8.study(rows=4, topk=256, layout="64+16", sharpness=4.0)
    assert set(err) == {v.name for v in fp8.VARIANTS[1:]} | {"fp8 pool vs bf16 pool"}
    assert 0 < err["bf16 P"].rel_rms < err["bf16 q, e4m3 P x448"].rel_rms < err["e4m3 q, e4m3 P"].rel_rms
    assert err["e4m3 q hi+lo, bf16 P"].rel_rms < err["e4m3 q, bf16 P"].rel_rms / 5


def test_cli_prints_a_row_per_variant_and_refuses_bad_input(fp8, capsys):
    assert fp8.main(["--rows", "2", "--topk", "64", "--layout", "64+16", "--sharpness", "1"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("| 1 |")]
    assert len(lines) == len(fp8.VARIANTS)  # every variant but the yardstick, and the pool line
    for bad in (["--sharpness", "x"], ["--rows", "0"]):
        with pytest.raises(SystemExit) as e:
            fp8.main(bad)
        assert e.value.code == 2
