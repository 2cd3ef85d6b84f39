"""Which implementation runs each kernel name on which device: Gluon, Triton, torch, or AITER (docs/kernels.md).

The in-tree names (``intree.ragged_prefill``, ``intree.sparse_decode``) have Gluon (Hopper) and Triton
implementations where Triton imports (``triton_impls``), and torch everywhere; the AITER names have AITER's own
kernels behind lazy adapters (``aiter``), each imported from the module AITER defines it in (``aiter.MODULES``,
under the package ``aiter_module``). The first in line that runs on the call's device takes it, resolved once per
(name, device type).
"""

from __future__ import annotations

from ..types import Kernel
from .aiter import OPUS, PA_PREFILL_SPARSE, aiter_symbol, make_adapter
from .impl import KernelImpl
from .torch_ref import ragged_prefill
from .torch_splitk import sparse_decode

__all__ = ["KernelImpl", "KernelRegistry", "NoImplementation", "default_registry"]


class NoImplementation(LookupError):
    pass


class KernelRegistry:
    """Implementations in order of preference; the first that runs on the device wins."""

    def __init__(self) -> None:
        self._impls: dict[Kernel, list[KernelImpl]] = {}
        self._resolved: dict[tuple[Kernel, str], KernelImpl] = {}
        self.generation = 0  # bumped by every register(): what a caller kept from resolve() may be stale

    def register(self, impl: KernelImpl, *, prefer: bool = False) -> None:
        entries = self._impls.setdefault(impl.kernel, [])
        entries.insert(0, impl) if prefer else entries.append(impl)
        self._resolved.clear()
        self.generation += 1

    def impls(self, kernel: Kernel) -> list[KernelImpl]:
        return list(self._impls.get(kernel, ()))

    def resolve(self, kernel: Kernel, device_type: str) -> KernelImpl:
        key = (kernel, device_type)
        hit = self._resolved.get(key)
        if hit is not None:
            return hit
        for impl in self._impls.get(kernel, ()):
            if impl.runs_on(device_type):
                self._resolved[key] = impl
                return impl
        raise NoImplementation(f"no implementation of {kernel} runs on device type {device_type!r}")


def default_registry(*, aiter_module: str = "aiter", triton: bool = True, gluon: bool | None = None) -> KernelRegistry:
    """Gluon then Triton where they run (GPU), torch everywhere, AITER adapters behind their gates.

    ``gluon=None`` reads ROUTESCOPE_GLUON (on unless it is 0/false/no/off): the Hopper kernels,
    which take the calls they support and hand the rest to Triton.
    """
    reg = KernelRegistry()
    if triton:
        from .triton_impls import gluon_enabled, gpu_impls

        for impl in gpu_impls(gluon=gluon_enabled() if gluon is None else gluon):
            reg.register(impl)
    reg.register(KernelImpl(Kernel.INTREE_RAGGED_PREFILL, "torch", ragged_prefill))
    reg.register(KernelImpl(Kernel.INTREE_SPARSE_DECODE, "torch", sparse_decode))
    for kernel, symbol in ((Kernel.AITER_PA_PREFILL_SPARSE, PA_PREFILL_SPARSE), (Kernel.AITER_OPUS, OPUS)):
        reg.register(KernelImpl(kernel, "aiter", make_adapter(aiter_symbol(symbol, aiter_module))))
    return reg
