"""Registers the Triton kernels, preferred over torch wherever Triton imports and the device is a GPU.

Nothing here imports Triton at module import: ``runs_on`` tries the import the first time a
CUDA device asks (ROCm torch also reports "cuda"), and a CPU process never pays for it. A
missing or broken Triton leaves the torch implementations in charge; it never raises.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..types import Kernel
from .common import KernelArgs

if TYPE_CHECKING:
    from .registry import KernelRegistry

_TRITON_OK: dict[str, bool] = {}


def triton_usable(module: str = "triton") -> bool:
    """Import Triton once and remember the answer; any failure (absent, broken install) means no."""
    ok = _TRITON_OK.get(module)
    if ok is None:
        try:
            importlib.import_module(module)
            ok = True
        except Exception:  # noqa: BLE001 - a broken Triton must not break the dispatcher
            ok = False
        _TRITON_OK[module] = ok
    return ok


def runs_on_gpu(device_type: str) -> bool:
    """True on CUDA (and ROCm, which torch also calls "cuda") when Triton imports."""
    return device_type == "cuda" and triton_usable()


def _lazy(module: str) -> Callable[[KernelArgs], None]:
    """A launch that imports its kernel module (and so Triton) on first use only."""
    box: list[Callable[[KernelArgs], None]] = []

    def launch(args: KernelArgs) -> None:
        if not box:
            box.append(importlib.import_module(module, __package__).launch)
        box[0](args)

    launch.__name__ = f"triton_launch{module}"
    return launch


def register_triton(registry: KernelRegistry) -> None:
    """Put the Triton ragged prefill and split-K decode first in line; they run on GPUs only."""
    from .registry import KernelImpl

    registry.register(
        KernelImpl(Kernel.INTREE_RAGGED_PREFILL, "triton", _lazy(".triton_prefill"), runs_on=runs_on_gpu), prefer=True
    )
    registry.register(
        KernelImpl(Kernel.INTREE_SPARSE_DECODE, "triton", _lazy(".triton_decode"), runs_on=runs_on_gpu), prefer=True
    )
