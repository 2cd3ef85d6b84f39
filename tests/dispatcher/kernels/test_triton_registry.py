"""The registry prefers Gluon then Triton on GPUs only, never imports them on CPU, and survives their absence."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from dispatcher.kernels.registry import default_registry
import pytest

from dispatcher.kernels.triton_impls import gluon_enabled, runs_gluon, runs_on_gpu, triton_usable
from dispatcher.types import Kernel


def test_cpu_resolves_to_torch_for_both_intree_kernels():
    reg = default_registry()
    assert reg.resolve(Kernel.INTREE_RAGGED_PREFILL, "cpu").impl == "torch"
    assert reg.resolve(Kernel.INTREE_SPARSE_DECODE, "cpu").impl == "torch"


def test_gluon_then_triton_are_first_in_line_for_cuda_when_they_import():
    reg = default_registry(gluon=True)
    for kernel in (Kernel.INTREE_RAGGED_PREFILL, Kernel.INTREE_SPARSE_DECODE):
        impls = reg.impls(kernel)
        assert [i.impl for i in impls] == ["gluon", "triton", "torch"]
        expected = "gluon" if runs_gluon("cuda") else "triton" if triton_usable() else "torch"
        assert reg.resolve(kernel, "cuda").impl == expected
        assert reg.resolve(kernel, "cpu").impl == "torch"
    assert not runs_on_gpu("cpu")
    assert not runs_on_gpu("mps")
    assert not runs_gluon("cpu")


@pytest.mark.parametrize(("value", "on"), [(None, True), ("1", True), ("0", False), ("off", False), (" False ", False),
                                           ("yes", True)])
def test_routescope_gluon_switches_the_hopper_kernels(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv("ROUTESCOPE_GLUON", raising=False)
    else:
        monkeypatch.setenv("ROUTESCOPE_GLUON", value)
    assert gluon_enabled() is on
    names = [i.impl for i in default_registry().impls(Kernel.INTREE_SPARSE_DECODE)]
    assert names == (["gluon", "triton", "torch"] if on else ["triton", "torch"])


def test_missing_module_counts_as_unusable():
    assert triton_usable("no_such_triton_module_here") is False


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_building_and_using_the_dispatcher_on_cpu_never_imports_triton():
    res = _python("""
        import sys, torch
        from dispatcher import Dispatcher
        from dispatcher.kernels.common import KernelArgs, SparseIndex
        d = Dispatcher()
        q = torch.randn(3, 2, 32); kv = torch.randn(10, 1, 32); out = torch.empty(3, 2, 32)
        idx = torch.randint(0, 10, (3, 4), dtype=torch.int32)
        d(q, kv, idx, None, 0.1, 32, 32, 0, None, out)
        assert "triton" not in sys.modules, "triton was imported on a CPU-only path"
        print("ok")
    """)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


def test_without_triton_cuda_falls_back_to_torch():
    res = _python("""
        import sys
        sys.modules["triton"] = None  # a real ImportError on `import triton`
        from dispatcher.kernels.registry import default_registry
        from dispatcher.types import Kernel
        reg = default_registry()
        print(reg.resolve(Kernel.INTREE_RAGGED_PREFILL, "cuda").impl, reg.resolve(Kernel.INTREE_SPARSE_DECODE, "cuda").impl)
    """)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["torch", "torch"]
