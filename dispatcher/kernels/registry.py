"""Which implementation runs each kernel name on which device: Triton, torch, or AITER."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..types import Kernel
from .aiter import OPUS, PA_PREFILL_SPARSE, AiterSymbol, make_adapter
from .common import KernelArgs
from .torch_ref import ragged_prefill
from .torch_splitk import sparse_decode


def _anywhere(device_type: str) -> bool:
    return True


@dataclass(frozen=True)
class KernelImpl:
    """One implementation of one kernel name; ``impl`` is reported beside the name (torch, triton, gluon, aiter).

    ``launch`` may return the name of what actually ran when that depends on the call (the Hopper
    kernels hand calls they do not take to Triton); None means ``impl``.
    """

    kernel: Kernel
    impl: str
    launch: Callable[[KernelArgs], str | None]
    runs_on: Callable[[str], bool] = field(default=_anywhere)


class NoImplementation(LookupError):
    pass


class KernelRegistry:
    """Implementations in order of preference; the first that runs on the device wins."""

    def __init__(self) -> None:
        self._impls: dict[Kernel, list[KernelImpl]] = {}
        self._resolved: dict[tuple[Kernel, str], KernelImpl] = {}

    def register(self, impl: KernelImpl, *, prefer: bool = False) -> None:
        entries = self._impls.setdefault(impl.kernel, [])
        entries.insert(0, impl) if prefer else entries.append(impl)
        self._resolved.clear()

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
        from .triton_impls import gluon_enabled, register_gluon, register_triton

        register_triton(reg)
        if gluon_enabled() if gluon is None else gluon:
            register_gluon(reg)
    reg.register(KernelImpl(Kernel.INTREE_RAGGED_PREFILL, "torch", ragged_prefill))
    reg.register(KernelImpl(Kernel.INTREE_SPARSE_DECODE, "torch", sparse_decode))
    for kernel, symbol in ((Kernel.AITER_PA_PREFILL_SPARSE, PA_PREFILL_SPARSE), (Kernel.AITER_OPUS, OPUS)):
        reg.register(KernelImpl(kernel, "aiter", make_adapter(AiterSymbol(symbol, aiter_module))))
    return reg
