"""GET /metrics: one exposition of telemetry's series and the service's own HTTP metrics.

The Accept header picks the format (telemetry.exposition.negotiate): Prometheus' protobuf exposition, with the
latency histogram's native buckets, for a scraper that asks for it first (Prometheus with
``--enable-feature=native-histograms``); OpenMetrics 2.0 text, native buckets too, where that is negotiated;
OpenMetrics 1.0 or text 0.0.4, classic buckets only, otherwise. In multiprocess mode every process's files are read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from telemetry.exposition import negotiate

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
    encoder, content_type = negotiate(accept)
    return encoder(collector), content_type
