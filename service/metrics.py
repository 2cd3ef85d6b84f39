"""GET /metrics: one exposition of telemetry's series and the service's own HTTP metrics.

The Accept header picks the format (Prometheus text or OpenMetrics) through
``prometheus_client``'s own negotiation; in multiprocess mode every process's files are read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from prometheus_client.metrics_core import Metric


class ChainedCollector:
    """Yields the families of several collectors in turn, so one encoder call covers them all."""

    def __init__(self, sources: Iterable[Callable[[], Collector | None]]) -> None:
        self._sources = tuple(sources)

    def collect(self) -> Iterator[Metric]:
        seen: set[str] = set()
        for source in self._sources:
            registry = source()
            if registry is None:
                continue
            for fam in registry.collect():
                if fam.name in seen:  # the same family from two sources would break the exposition
                    continue
                seen.add(fam.name)
                yield fam


def render(collector: Collector, accept: str | None) -> tuple[bytes, str]:
    """Encode for the client's Accept header: (body, content type)."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(collector), content_type
