"""One implementation of one kernel name: what the registry ranks and the dispatcher launches."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..types import Kernel
from .common import KernelArgs


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
