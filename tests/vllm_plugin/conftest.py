"""Fixtures: the vLLM test doubles on sys.path (removed afterwards), calls, and metric reads."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType, SimpleNamespace

import pytest
import torch

from dispatcher.kernels.common import KernelArgs, SparseIndex
from dispatcher.kernels.torch_ref import ragged_prefill
from routescope.vllm import export, logs, plugin

from . import doubles

OPS = "vllm.v1.attention.ops.rocm_aiter_mla_sparse"
# the modules that bind the ops module's entry points in vLLM 0.33.0 (doubles.SITES)
BACKEND = "vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse"
MODELS = ("vllm.models.deepseek_v4.amd.rocm", "vllm.models.deepseek_v41.amd.rocm")


def _drop_vllm_modules() -> None:
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]


def _stop_plugin() -> None:
    p = plugin.current()
    tel = p.observer.telemetry if p is not None and p.observer is not None else None
    plugin.uninstall()
    if hasattr(tel, "close"):
        tel.close()
    export.shutdown_servers()
    logs.unroute()  # also after a test that forgot a plugin without undoing it
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "PostImportHook"]


@pytest.fixture
def vllm_doubles(tmp_path):
    """``make(**variant)`` writes the doubles and puts them on sys.path; everything is undone after the test.

    It returns importers: ``ops()``, ``backend()`` (GLM's path), ``model()`` / ``models()`` (DeepSeek-V4's
    ROCm model modules), ``fc()`` (the forward context)."""
    roots: list[str] = []

    def make(**variant) -> SimpleNamespace:
        root = str(doubles.write(tmp_path / f"doubles{len(roots)}", **variant))
        sys.path.insert(0, root)
        roots.append(root)
        importlib.invalidate_caches()
        return SimpleNamespace(root=root, ops=lambda: importlib.import_module(OPS),
                               backend=lambda: importlib.import_module(BACKEND),
                               model=lambda: importlib.import_module(MODELS[0]),
                               models=lambda: [importlib.import_module(m) for m in MODELS],
                               fc=lambda: importlib.import_module("vllm.forward_context"))

    _stop_plugin()
    _drop_vllm_modules()
    yield make
    _stop_plugin()
    _drop_vllm_modules()
    for root in roots:
        while root in sys.path:
            sys.path.remove(root)


def prefill_args(rows: int, *, dtype=torch.bfloat16, heads: int = 2, nope: int = 8, rope: int = 4,
                 full_lanes: bool = False, sink: bool = False, skv: int = 16, topk: int = 4, seed: int = 0):
    """Positional arguments in vLLM's order, plus the output a correct call writes (computed apart)."""
    g = torch.Generator().manual_seed(seed)
    d = nope + rope
    q = torch.randn(rows, heads, d, generator=g).to(dtype)
    kv = torch.randn(skv, 1, d, generator=g).to(dtype)
    indices = torch.randint(0, skv, (rows, topk), generator=g, dtype=torch.int32)
    indices[:, -1] = -1
    attn_sink = torch.randn(heads, generator=g) if sink else None
    output = torch.zeros(rows, heads, d if full_lanes else nope, dtype=dtype)
    expected = torch.zeros_like(output)
    ragged_prefill(KernelArgs(q, kv, SparseIndex(indices, None), d ** -0.5, attn_sink, expected))
    args = (q, kv, indices, None, d ** -0.5, d, nope, rope, attn_sink, output)
    return args, expected


class Meta:
    """A TEST DOUBLE of one layer's attention metadata: host ints, and a device-tensor field that must not be read."""

    def __init__(self, num_decodes, num_decode_tokens, num_prefills=None, num_prefill_tokens=None,
                 num_actual_tokens=None, max_query_len=None):
        self.num_decodes = num_decodes
        self.num_decode_tokens = num_decode_tokens
        self.num_prefills = num_prefills
        self.num_prefill_tokens = num_prefill_tokens
        self.num_actual_tokens = num_actual_tokens
        self.max_query_len = max_query_len
        self.touched: list[str] = []

    @property
    def query_start_loc(self):  # a device tensor in vLLM: reading it would sync
        self.touched.append("query_start_loc")
        raise AssertionError("query_start_loc read: the plugin must use host-side ints only")


def samples(tel, name: str, **labels) -> float:
    """Sum of a metric's samples whose labels include ``labels`` (after a flush of ``tel``)."""
    total = 0.0
    for family in tel.registry.collect():
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def telemetry() -> object:
    p = plugin.current()
    assert p is not None and p.observer is not None and p.observer.telemetry is not None
    return p.observer.telemetry


def is_wrapper(fn) -> bool:
    return bool(getattr(fn, "__routescope__", False))


def module(name: str) -> ModuleType:
    return sys.modules[name]
