"""GET /metrics: one exposition of telemetry's series and the service's own HTTP metrics.

The Accept header picks the format (telemetry.exposition.negotiate): Prometheus' protobuf exposition, with the
latency histogram's native buckets, for a scraper that asks for it first (Prometheus with
``--enable-feature=native-histograms``); OpenMetrics 2.0 text, native buckets too, where that is negotiated;
OpenMetrics 1.0 or text 0.0.4, classic buckets only, otherwise. In multiprocess mode every process's files are read.

Telemetry's series change only at a flush, so with a ``generation`` (a token that changes at every flush) the encoded
bytes of every source but the last are kept per format: a scrape reuses them until a flush other than a render's own
(the background one, every flush interval) or until they are ``max_age_s`` (the flush interval) old, so what it
serves was flushed at most one flush interval before it arrived. The last source (the HTTP metrics, which move with
every request) is encoded at every scrape and appended. Concurrent scrapes of one generation share one encoding.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from telemetry.exposition import join, negotiate
from telemetry.exposition.text import TextEncoder

log = logging.getLogger("routescope.service")


@dataclass(frozen=True)
class _Kept:
    """One format's encoding of the leading sources: when it was made, the families it holds."""

    body: bytes
    made_at: float
    names: frozenset[str]


class _Part:
    """Some of a chain's sources as one collector; notes the family names it yielded and whether a source failed."""

    def __init__(self, chain: ChainedCollector, sources: tuple[Callable[[], Collector | None], ...],
                 skip: frozenset[str] = frozenset()) -> None:
        self._chain, self._sources, self._skip = chain, sources, skip
        self.names: set[str] = set()
        self.failed = False

    def collect(self) -> Iterator[Metric]:
        seen = set(self._skip)
        for source in self._sources:
            families = self._chain._families(source)
            if families is None:
                self.failed = True
                continue
            for fam in families:
                if fam.name in seen:  # the same family from two sources would break the exposition
                    continue
                seen.add(fam.name)
                self.names.add(fam.name)
                yield fam


class ChainedCollector:
    """Yields the families of several collectors in turn, so one encoder call covers them all.

    ``generation`` (e.g. telemetry's last totals object) changes at every flush of what the leading sources
    read; with it, ``render`` keeps their encoding per format (see the module docstring)."""

    def __init__(self, sources: Iterable[Callable[[], Collector | None]],
                 on_error: Callable[[str], None] | None = None, *,
                 generation: Callable[[], object] | None = None, max_age_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._sources = tuple(sources)
        self._on_error = on_error
        self._generation = generation
        self._max_age_s = max_age_s
        self._clock = clock
        self._kept: dict[str, _Kept] = {}  # content type -> the leading sources' encoding
        self._own: object = None  # the generation the last render's own flush made
        self._lock = threading.Lock()  # concurrent scrapes of one generation share one encoding
        self._tail_lines = TextEncoder()  # the last source's text lines, kept apart from the leading sources'

    def _families(self, source: Callable[[], Collector | None]) -> list[Metric] | None:
        """A source's families; None where it failed (left out, logged and counted: /metrics still answers)."""
        try:
            registry = source()
            return list(registry.collect()) if registry is not None else []
        except Exception:  # noqa: BLE001
            log.exception("a /metrics source failed; serving the others")
            if self._on_error is not None:
                self._on_error("export")
            return None

    def collect(self) -> Iterator[Metric]:
        return _Part(self, self._sources).collect()

    def render(self, accept: str | None) -> tuple[bytes, str]:
        """The exposition for an Accept header, the leading sources' encoding reused where it is still current."""
        if self._generation is None or len(self._sources) < 2:
            encoder, content_type = negotiate(accept)
            return encoder(self), content_type
        encoder, content_type = negotiate(accept)
        arrived = self._clock()
        with self._lock:
            if self._generation() is not self._own:  # a flush other than a render's own: every format is stale
                self._kept.clear()
            kept = self._kept.get(content_type)
            if kept is None or arrived - kept.made_at > self._max_age_s:
                kept = self._encode_head(encoder, content_type)
        tail_encoder, _ = negotiate(accept, lines=self._tail_lines)
        tail = _Part(self, self._sources[-1:], skip=kept.names)
        return join(content_type, kept.body, tail_encoder(tail)), content_type

    def _encode_head(self, encoder: Callable[[Collector], bytes], content_type: str) -> _Kept:
        """Encode the leading sources now (they flush as they are read); kept unless a source failed."""
        made_at = self._clock()
        head = _Part(self, self._sources[:-1])
        body = encoder(head)
        self._own = self._generation()  # this render's own flush: the other formats' encodings stay current
        kept = _Kept(body, made_at, frozenset(head.names))
        if head.failed:
            self._kept.pop(content_type, None)  # the next scrape tries the failed source again
        else:
            self._kept[content_type] = kept
        return kept


def render(collector: Collector, accept: str | None) -> tuple[bytes, str]:
    """Encode for the client's Accept header: (body, content type)."""
    if isinstance(collector, ChainedCollector):
        return collector.render(accept)
    encoder, content_type = negotiate(accept)
    return encoder(collector), content_type
