"""Fixtures for the Triton kernel tests: interpreted kernels on CPU, compiled ones on a GPU.

Triton reads TRITON_INTERPRET when a ``@triton.jit`` decorator runs, its own library's too,
so on a machine without a GPU the variable is set here, before anything imports Triton, and
left set: on a CPU the interpreter is the only way Triton runs at all. On a GPU nothing is
set, the compiled kernels are tested (marker ``gpu``) and the interpreter tests skip.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

import pytest
import torch

KERNEL_MODULES = ("dispatcher.kernels.fp8_ptx", "dispatcher.kernels.triton_stamps", "dispatcher.kernels.triton_prefill",
                  "dispatcher.kernels.triton_decode")
HAVE_TRITON = importlib.util.find_spec("triton") is not None
HAVE_CUDA = torch.cuda.is_available()

if HAVE_TRITON and not HAVE_CUDA and "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"


def _interpreted(obj: object) -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(obj, InterpretedFunction)


def _kernel(mod: ModuleType) -> object:
    for name in ("_prefill_kernel", "_partial_kernel", "stamp_start", "kv_load"):
        if hasattr(mod, name):
            return getattr(mod, name)
    raise AttributeError(f"{mod.__name__} holds no kernel")


def _load(interpret: bool) -> tuple[ModuleType, ModuleType]:
    """Both kernel modules, reimported where their mode differs from the one asked for."""
    mods, stale = [], False
    for name in KERNEL_MODULES:  # in import order: a module follows a reload of one it imports
        mod = sys.modules.get(name) or importlib.import_module(name)
        if stale or _interpreted(_kernel(mod)) != interpret:
            mod, stale = importlib.reload(mod), True
        mods.append(mod)
    return mods[2], mods[3]


@pytest.fixture()
def interp() -> tuple[ModuleType, ModuleType]:
    """(triton_prefill, triton_decode) running under Triton's CPU interpreter."""
    if not HAVE_TRITON:
        pytest.skip("triton is not installed")
    if HAVE_CUDA:
        pytest.skip("a GPU is here: the compiled kernels are tested instead (marker gpu)")
    import triton.language as tl

    if os.environ.get("TRITON_INTERPRET") != "1" or not _interpreted(tl.zeros):
        pytest.fail("triton was imported before tests/dispatcher/kernels/conftest.py could turn its interpreter on; "
                    "run: TRITON_INTERPRET=1 pytest tests/dispatcher/kernels")
    return _load(interpret=True)


@pytest.fixture()
def compiled() -> tuple[ModuleType, ModuleType]:
    """(triton_prefill, triton_decode) compiled for the GPU; skips without CUDA."""
    if not HAVE_CUDA:
        pytest.skip("needs a CUDA/ROCm device")
    if not HAVE_TRITON:
        pytest.skip("triton is not installed")
    return _load(interpret=False)


@pytest.fixture(autouse=True)
def fresh_plans():
    """Plans are kept per call signature and scratch per stream; a test that pretends another GPU (its
    multiprocessor count) or counts buffers must not see what an earlier test made."""
    from dispatcher.kernels import plan
    from dispatcher.kernels.scratch import scratch

    plan.forget()
    scratch().clear()
    yield
    plan.forget()
    scratch().clear()
