"""The hook through which an observer sees each call; the dispatcher never imports telemetry.

A probe is any object with these three methods. ``start`` runs after the decision and
before the launch and returns a token that ``stop`` or ``error`` gets back. The dispatcher
calls them inside ``try``: a probe that raises is counted in ``Dispatcher.probe_failures``
and the call goes on.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from .types import Batch, CallShape, Decision


class Probe(Protocol):
    def start(
        self,
        decision: Decision,
        shape: CallShape,
        batch: Batch,
        model: str | None,
        q: torch.Tensor,
        stream: Any | None,
    ) -> Any: ...

    def stop(self, token: Any, impl: str) -> None: ...

    def error(self, token: Any, exc: BaseException) -> None: ...
