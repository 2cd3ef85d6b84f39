"""GET /metrics: one exposition of telemetry's series and the service's own HTTP metrics.

The Accept header picks the format (telemetry.exposition.negotiate): Prometheus' protobuf exposition, with the
latency histogram's native buckets, for a scraper that asks for it first (Prometheus with
``--enable-feature=native-histograms``); OpenMetrics 2.0 text, native buckets too, where that is negotiated;
OpenMetrics 1.0 or text 0.0.4, classic buckets only, otherwise. In multiprocess mode every process's files are read.
The histogram mode (``both``, ``native``, ``classic``; telemetry.exposition.modes) shapes each of those formats.

Telemetry's series change only at a flush, so with a ``generation`` (a token that changes at every flush) the encoded
bytes of every source but the last are kept per format and served again until a flush other than a render's own (the
background one, every flush interval; /routing's): a scrape serves the series of the last flush before it arrived.
The first scrape of a format after a flush reads the sources (or takes the read another format's scrape made since
that flush) and encodes its own format only, so no scrape waits for another format's encoding. One exception keeps
concurrent scrapes from queueing:
while an encoding is being made, the scrapes that arrive meanwhile get the previous bytes (one flush behind). Kept bytes older than ``max_age_s`` (two flush
intervals) are never served. The last source (the HTTP metrics, which move with every request) is encoded at every
scrape and appended.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from telemetry.exposition import HistogramMode, join, negotiate
from telemetry.exposition.text import TextEncoder

log = logging.getLogger("routescope.service")


@dataclass(frozen=True)
class _Kept:
    """One format's encoding of the leading sources: when it was made, the families it holds, its encoder."""

    body: bytes
    made_at: float
    names: frozenset[str]
    encoder: Callable[[Collector], bytes]


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

    With a ``generation`` (e.g. telemetry's last totals object, new at every flush), ``render`` keeps the leading
    sources' encoding per format (see the module docstring)."""

    def __init__(self, sources: Iterable[Callable[[], Collector | None]],
                 on_error: Callable[[str], None] | None = None, *,
                 generation: Callable[[], object] | None = None, max_age_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic,
                 histogram_mode: HistogramMode | str = HistogramMode.BOTH) -> None:
        self._sources = tuple(sources)
        self._mode = HistogramMode(histogram_mode)
        self._on_error = on_error
        self._generation = generation
        self._max_age_s = max_age_s
        self._clock = clock
        self._kept: dict[str, _Kept] = {}  # content type -> the leading sources' encoding
        self._stale: set[str] = set()  # formats whose encoding predates a flush other than a render's own
        self._making: set[str] = set()  # formats being encoded now
        self._own: object = None  # the generation the last render's own flush made
        self._read: tuple[_Families, frozenset[str], float, object] | None = None  # last read: families, names,
        # when, and the generation after it (another format's scrape encodes from it while that is still current)
        self._lock = threading.Lock()  # the fields above
        self._encoding = threading.Lock()  # one encoding of the leading sources at a time: concurrent scrapes share it
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
        encoder, content_type = negotiate(accept, mode=self._mode)
        if self._generation is None or len(self._sources) < 2:
            return encoder(self), content_type
        arrived = self._clock()
        kept = self._usable(content_type, arrived)
        if kept is None:
            kept = self._encode_head(encoder, content_type, arrived)
        tail_encoder, _ = negotiate(accept, lines=self._tail_lines, mode=self._mode)
        tail = _Part(self, self._sources[-1:], skip=kept.names)
        return join(content_type, kept.body, tail_encoder(tail)), content_type

    def _usable(self, content_type: str, arrived: float) -> _Kept | None:
        """The kept encoding if current; one that predates a flush only while the next one is being made."""
        with self._lock:
            if self._generation() is not self._own:  # a flush other than a render's own
                self._own = self._generation()
                self._stale.update(self._kept)
            kept = self._kept.get(content_type)
            if kept is None or arrived - kept.made_at > self._max_age_s:
                return None
            if content_type not in self._stale or self._making:  # stale: only while an encoding is being made
                return kept
            return None

    def _encode_head(self, encoder: Callable[[Collector], bytes], content_type: str, arrived: float) -> _Kept:
        """Encode the leading sources in this scrape's format, unless a current encoding was made while it waited.
        The sources are read (they flush as they are read) unless the last read is of the current generation and
        young enough: another format's scrape made it since the last flush. Kept unless a source failed."""
        with self._encoding:
            with self._lock:
                kept = self._kept.get(content_type)
                if kept is not None and arrived - kept.made_at <= self._max_age_s and content_type not in self._stale:
                    return kept  # made while this scrape waited: shared
                read = self._read
                if read is not None and (read[3] is not self._generation() or arrived - read[2] > self._max_age_s):
                    read = None
                self._making.add(content_type)
            failed = False
            try:
                if read is None:
                    made_at = self._clock()
                    head = _Part(self, self._sources[:-1])
                    families = _Families(list(head.collect()))
                    names, failed = frozenset(head.names), head.failed
                else:
                    families, names, made_at, _gen = read
                made = _Kept(encoder(families), made_at, names, encoder)
            finally:
                with self._lock:
                    self._making.discard(content_type)
            with self._lock:
                if read is None:
                    self._own = self._generation()  # this render's own flush leaves the other formats current
                    self._read = None if failed else (families, names, made_at, self._own)
                self._stale.discard(content_type)
                if failed:
                    self._kept.pop(content_type, None)  # the next scrape tries the failed source again
                else:
                    self._kept[content_type] = made
            return made


class _Families:
    """Families read once, as a collector: each format's encoder gets the same ones."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def render(collector: Collector, accept: str | None,
           mode: HistogramMode | str = HistogramMode.BOTH) -> tuple[bytes, str]:
    """Encode for the client's Accept header: (body, content type); a chain renders in its own mode."""
    if isinstance(collector, ChainedCollector):
        return collector.render(accept)
    encoder, content_type = negotiate(accept, mode=mode)
    return encoder(collector), content_type
