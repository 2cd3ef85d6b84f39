"""Helpers for the scripts that run inside .venv-vllm, next to the real vLLM 0.33.0 (never under pytest).

Each script is started by tests/vllm_real/conftest.py as ``python -O -m tests.vllm_real.inside.NAME``
with ``CUDA_VISIBLE_DEVICES=""`` and ``TRITON_INTERPRET=1`` and writes what it observed as JSON to
``$ROUTESCOPE_REAL_OUT``; the tests assert on that. The scripts themselves assert nothing (``-O``
strips asserts), so a wrong observation can only fail the test that reads it.
"""

from __future__ import annotations

import json
import os
import sys
import types
from importlib.machinery import ModuleSpec
from typing import Any

OPS = "vllm.v1.attention.ops.rocm_aiter_mla_sparse"
BACKEND = "vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse"
MODELS = ("vllm.models.deepseek_v4.amd.rocm", "vllm.models.deepseek_v41.amd.rocm")
ENTRY = "rocm_sparse_attn"  # prefix of every entry point the plugin wraps
GETTER = "_get_aiter"


def install_amdsmi_stand_in() -> None:
    """A STAND-IN for AMD's SMI library (it needs an AMD GPU and driver), for vLLM's model modules.

    ``vllm.models.deepseek_v4/_v41.amd.rocm`` import ``vllm.platforms.rocm``, which reads the GPU
    arch from amdsmi at import (else from torch.cuda, which a CPU torch refuses). This stand-in
    reports one GPU of an arch that is none of vLLM's, so every ``_ON_GFX*`` flag there is False,
    as on this CPU. It is put in place after vLLM has chosen its platform (the CPU one), so vLLM
    does not take this process for a ROCm one.
    """
    from vllm.platforms import current_platform

    current_platform.device_type  # noqa: B018 - resolve the platform before amdsmi can be seen
    m = types.ModuleType("amdsmi", "STAND-IN for AMD SMI (tests/vllm_real/inside/common.py): not AMD's library.")
    m.__spec__ = ModuleSpec("amdsmi", None)

    class AmdSmiException(Exception):
        pass

    def unavailable(*_a: Any) -> Any:
        raise AmdSmiException("amdsmi stand-in: no such query here")

    m.AmdSmiException = AmdSmiException
    m.AmdSmiMemoryType = types.SimpleNamespace(VRAM=0)
    m.amdsmi_init = m.amdsmi_shut_down = lambda *_a: None
    m.amdsmi_get_processor_handles = lambda: ["stand-in-gpu"]
    m.amdsmi_get_gpu_asic_info = lambda _h: {"target_graphics_version": "none-of-vllms"}
    for name in ("amdsmi_get_gpu_device_uuid", "amdsmi_get_gpu_memory_total", "amdsmi_topo_get_link_type",
                 "amdsmi_topo_get_numa_node_number"):
        setattr(m, name, unavailable)
    sys.modules["amdsmi"] = m


def import_binding_sites() -> dict[str, types.ModuleType]:
    """The ops module and the three modules that bind its entry points in vLLM 0.33.0."""
    import importlib

    install_amdsmi_stand_in()
    return {name: importlib.import_module(name) for name in (OPS, BACKEND, *MODELS)}


def wrapped_sites(modules: dict[str, types.ModuleType]) -> dict[str, dict[str, bool]]:
    """For every module, every entry point and AITER getter it binds: is it routescope's wrapper?

    The names are taken by prefix, unfiltered: in 0.33.0 the one other function of the ops module that
    the backend imports, the split-count helper ``rocm_sparse_decode_bf16_num_splits``, shares neither
    prefix (``rocm_sparse_decode``, not ``rocm_sparse_attn``), so it is not listed (and must not be wrapped:
    :func:`helper_wrapped`)."""
    return {name: {attr: bool(getattr(getattr(mod, attr), "__routescope__", False))
                   for attr in sorted(vars(mod)) if attr.startswith((ENTRY, GETTER)) and callable(getattr(mod, attr))}
            for name, mod in modules.items()}


SPLIT_HELPER = "rocm_sparse_decode_bf16_num_splits"  # not an entry point: it returns a split count


def helper_wrapped(modules: dict[str, types.ModuleType]) -> dict[str, bool]:
    """Where the split-count helper is bound (the ops module and the backend in 0.33.0): is it wrapped?"""
    return {name: bool(getattr(getattr(mod, SPLIT_HELPER), "__routescope__", False))
            for name, mod in modules.items() if hasattr(mod, SPLIT_HELPER)}


def observer() -> Any:
    from routescope.vllm import plugin

    p = plugin.current()
    return None if p is None else p.observer


def metric_samples(registry: Any) -> list[list]:
    """Every nonzero routescope_* sample of a registry: [name, labels, value]."""
    return [[s.name, s.labels, s.value] for fam in registry.collect() for s in fam.samples
            if s.name.startswith("routescope_") and s.value]


def flushed_samples() -> list[list]:
    """Flush this process's telemetry and read what it exports."""
    tel = observer().telemetry
    tel.flush()
    return metric_samples(tel.registry)


def configure_vllm_logging() -> None:
    """What every vLLM worker does first (vllm/v1/executor/multiproc_executor.py: worker_main)."""
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging

    configure_logging(LoggingConfig())


def emit(**data: Any) -> None:
    """Write what the script observed, with the ``vllm.__version__`` it ran against (conftest checks it)."""
    vllm = sys.modules.get("vllm")
    data["vllm_version"] = getattr(vllm, "__version__", None)
    with open(os.environ["ROUTESCOPE_REAL_OUT"], "w") as f:
        json.dump(data, f, indent=1, default=str)
