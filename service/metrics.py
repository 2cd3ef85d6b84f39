"""GET /metrics: one exposition of telemetry's series and the service's own HTTP metrics.

The Accept header picks the format (Prometheus text or OpenMetrics) through
``prometheus_client``'s own negotiation; in multiprocess mode every process's files are read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from prometheus_client.metrics_core import Metric

log = logging.getLogger("routescope.service")


class ChainedCollector:
    """Yields the families of several collectors in turn, so one encoder call covers them all."""

    def __init__(self, sources: Iterable[Callable[[], Collector | None]],
                 on_error: Callable[[str], None] | None = None) -> None:
        self._sources = tuple(sources)
        self._on_error = on_error

    def collect(self) -> Iterator[Metric]:
        seen: set[str] = set()
        for source in self._sources:
            try:  # a source that fails is left out (and counted): /metrics still answers 200 with the others
                registry = source()
                families = list(registry.collect()) if registry is not None else []
            except Exception:  # noqa: BLE001
                log.exception("a /metrics source failed; serving the others")
                if self._on_error is not None:
                    self._on_error("export")
                continue
            for fam in families:
                if fam.name in seen:  # the same family from two sources would break the exposition
                    continue
                seen.add(fam.name)
                yield fam


def render(collector: Collector, accept: str | None) -> tuple[bytes, str]:
    """Encode for the client's Accept header: (body, content type)."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(collector), content_type
