"""The hook through which an observer sees each call; the dispatcher never imports telemetry.

The dispatcher calls every hook inside ``try``: a hook that raises is counted in
``Dispatcher.probe_failures`` and the call goes on. Hooks run on the calling thread, once per
call, on the launch path: they must be cheap (telemetry's cost a few hundred ns) and must not
synchronise the device.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from .types import Batch, CallShape, Decision


@runtime_checkable
class Probe(Protocol):
    """An observer of routed calls (telemetry's ``TelemetryProbe`` is the one the project ships)."""

    def start(
        self,
        decision: Decision,
        shape: CallShape,
        batch: Batch,
        model: str | None,
        q: torch.Tensor,
        stream: Any | None,
        impl: str | None = None,
    ) -> Any:
        """After the decision, before the launch; returns a token that ``stop`` or ``error`` gets back.

        ``impl`` announces the implementation about to run, when the caller knows it. An ``int``
        token then means the call is fully recorded: ``stop`` is called only if another
        implementation ran. A token with a ``stamp`` attribute that is not None (a
        ``kernels.stamps.DeviceStamp``) asks the launch to have the call's kernels write their
        start and end time there; the launch arms it if they did. None records nothing.
        """
        ...

    def stop(self, token: Any, impl: str, announced: str | None = None) -> None:
        """After a launch that returned; ``impl`` is what ran (torch, triton, gluon, aiter), ``announced`` what
        ``start`` was told. Skipped by the dispatcher for an int token when ``impl`` is the announced one."""
        ...

    def error(self, token: Any, exc: BaseException, impl: str | None = None, announced: str | None = None) -> None:
        """After a launch (or a guard refusal) that raised; ``impl`` is what was attempted, ``announced`` what ``start``
        was told. The exception is re-raised."""
        ...

    def record_decode_path(self, rows: int, model: str | None = None) -> None:
        """One call of the decode entry (``rocm_sparse_attn_decode``): not routed here, counted for the share."""
        ...
