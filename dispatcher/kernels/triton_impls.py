"""The GPU implementations of the in-tree kernels: the Hopper Gluon ones, then Triton's, ahead of torch.

The ``gluon`` implementation takes a call only where ``gluon_sm90.supports_prefill`` / ``supports_decode`` say so
(an sm_90 GPU, fp16/bf16 q, the production layouts, a pool in q's dtype or fp8) and hands the rest to Triton,
returning the name of what ran so the dispatcher and the sweep report it. Nothing here imports Triton at module
import: ``runs_on`` tries the import the first time a CUDA device asks (ROCm torch also reports "cuda"), and a CPU
process never pays for it. A missing or broken Triton leaves the torch implementations in charge; it never raises.
ROUTESCOPE_GLUON=0 leaves the Gluon ones out (``gluon_enabled``).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable

from ..types import Kernel
from .common import KernelArgs
from .impl import KernelImpl

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


def gluon_enabled() -> bool:
    """ROUTESCOPE_GLUON: the Hopper Gluon kernels are registered unless it is 0, false, no or off."""
    return os.environ.get("ROUTESCOPE_GLUON", "1").strip().lower() not in ("0", "false", "no", "off")


def runs_gluon(device_type: str) -> bool:
    """True on CUDA when Triton imports with Gluon; the call itself decides Hopper or not (``supports``)."""
    if not runs_on_gpu(device_type):
        return False
    ok = _TRITON_OK.get("gluon")
    if ok is None:
        try:
            ok = importlib.import_module(".gluon_sm90", __package__).HAVE_GLUON
        except Exception:  # noqa: BLE001 - a broken Gluon must not break the dispatcher
            ok = False
        _TRITON_OK["gluon"] = ok
    return ok


def _lazy(module: str) -> Callable[[KernelArgs], None]:
    """A launch that imports its kernel module (and so Triton) on first use only."""
    box: list[Callable[[KernelArgs], None]] = []

    def launch(args: KernelArgs) -> str | None:
        if not box:
            box.append(importlib.import_module(module, __package__).launch)
        return box[0](args)  # "torch" where Triton handed the call to torch (its default launch: a kept recipe)

    launch.__name__ = f"triton_launch{module}"
    return launch


def _gluon_or_triton(kernel: str) -> Callable[[KernelArgs], str]:
    """A launch that runs the Hopper kernel when it supports the call, Triton's otherwise; returns which ran."""
    box: list = []

    def launch(args: KernelArgs) -> str:
        if not box:
            g = importlib.import_module(".gluon_sm90", __package__)
            t = importlib.import_module(".triton_prefill" if kernel == "prefill" else ".triton_decode", __package__)
            planned = importlib.import_module(".plan", __package__).planned
            box.extend((g.supports_prefill if kernel == "prefill" else g.supports_decode,
                        g.prefill_recipe if kernel == "prefill" else g.decode_recipe, t.recipe, planned))
        supports, gluon_recipe, triton_recipe, planned = box

        def choose() -> Callable[[KernelArgs], str]:
            # what supports() reads is the call's signature, alignment and device: asked once per such call
            if supports(args):
                return gluon_recipe(args)
            fallback = triton_recipe(args)
            return lambda a: fallback(a) or "triton"

        return planned(args, kernel + " recipe", (), choose)(args)

    launch.__name__ = f"gluon_or_triton_{kernel}"
    return launch


def gpu_impls(*, gluon: bool) -> list[KernelImpl]:
    """The GPU implementations of both in-tree kernels, most preferred first: the Hopper Gluon ones (with
    ``gluon``), which hand what they do not take to Triton, then Triton's."""
    impls = []
    if gluon:
        impls += [KernelImpl(Kernel.INTREE_RAGGED_PREFILL, "gluon", _gluon_or_triton("prefill"), runs_on=runs_gluon),
                  KernelImpl(Kernel.INTREE_SPARSE_DECODE, "gluon", _gluon_or_triton("decode"), runs_on=runs_gluon)]
    impls += [KernelImpl(Kernel.INTREE_RAGGED_PREFILL, "triton", _lazy(".triton_prefill"), runs_on=runs_on_gpu),
              KernelImpl(Kernel.INTREE_SPARSE_DECODE, "triton", _lazy(".triton_decode"), runs_on=runs_on_gpu)]
    return impls
