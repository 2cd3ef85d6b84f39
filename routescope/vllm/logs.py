"""routescope's own log records (telemetry's "decode rows in prefill" warning) through vLLM's logging.

vLLM gives its ``vllm`` logger the one formatted handler of a process (``propagate`` off), so a
record of any logger outside that tree (telemetry logs to ``routescope.telemetry``) would come
out as a bare stderr line in a worker. While the plugin is on, the ``routescope`` tree is handed
to ``vllm.routescope`` instead, and vLLM's handlers, format and level apply to it.
"""

from __future__ import annotations

import logging

VLLM_LOGGER = "vllm.routescope"
ROUTESCOPE_LOGGER = "routescope"


class ToVllm(logging.Handler):
    """Passes each record on to ``vllm.routescope``, whose handlers are vLLM's (read at every record)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            logging.getLogger(VLLM_LOGGER).handle(record)
        except Exception:  # noqa: BLE001 - logging must never break the caller
            self.handleError(record)


def route_to_vllm() -> bool:
    """Hand the ``routescope`` tree to vLLM's logging; False when it already is."""
    logger = logging.getLogger(ROUTESCOPE_LOGGER)
    if any(isinstance(h, ToVllm) or type(h).__name__ == "ToVllm" for h in logger.handlers):
        return False
    logger.addHandler(ToVllm())
    logger.propagate = False  # as vLLM's own tree: not a second time through the root logger
    return True


def unroute() -> None:
    """Undo :func:`route_to_vllm` (the plugin's uninstall)."""
    logger = logging.getLogger(ROUTESCOPE_LOGGER)
    for h in [h for h in logger.handlers if type(h).__name__ == "ToVllm"]:
        logger.removeHandler(h)
    logger.propagate = True
