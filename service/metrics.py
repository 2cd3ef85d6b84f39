"""GET /metrics: one exposition of telemetry's series and the service's own HTTP metrics.

The Accept header picks the format (telemetry.exposition.negotiate): Prometheus' protobuf exposition, with the
latency histogram's native buckets, for a scraper that asks for it first (Prometheus with
``--enable-feature=native-histograms``); OpenMetrics 2.0 text, native buckets too, where that is negotiated;
OpenMetrics 1.0 or text 0.0.4, classic buckets only, otherwise. In multiprocess mode every process's files are read.
The histogram mode (``both``, ``native``, ``classic``; telemetry.exposition.modes) shapes each of those formats.

Telemetry's series change only at a flush, so with a ``generation`` (a token that changes at every background flush)
the encoded bytes of every source but the last (the *head*) are kept per format, and built by one worker thread, one
build at a time, never by a scrape:

- a scrape is answered with the last complete encoding of its format if that encoding's read began at most
  ``max_age_s`` (two flush intervals) before the scrape arrived;
- if the generation moved since that read (or the encoding is half ``max_age_s`` old), the scrape asks the worker for
  the next one and is still answered with the kept bytes at once: one build per format and generation, whoever asks;
- only a scrape with nothing that young kept (the first one, or one after a pause of two intervals) waits, and then
  for its own format only: the worker encodes the formats scrapers wait for first, and each format from the same
  read while no flush came after it.

So a build slower than the flush interval never serves older bytes: builds run back to back, each reads afresh once
a flush came, and a scrape whose kept bytes passed ``max_age_s`` waits for a build whose read began after that limit.
A build in which a source failed is given to the scrapes that waited for it (the source left out, counted) and
never kept, so the next scrape asks for another. The last source (the HTTP metrics, which move with every request)
is encoded at every scrape and appended.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from telemetry.exposition import Encoder, HistogramMode, join, negotiate
from telemetry.exposition.text import TextEncoder

log = logging.getLogger("routescope.service")
WAIT_S = 5.0  # a waiting scrape asks the worker again this often (a build it asked for always answers sooner)


@dataclass(frozen=True)
class Head:
    """One format's encoding of the leading sources, from one read: what /metrics serves before the tail."""

    body: bytes
    content_type: str
    made_at: float  # the clock when its read began
    names: frozenset[str]  # the families it holds (the tail skips them)
    generation: object  # the generation after its read (its own flush)
    build: int  # the worker's count of encodings when this one was made (1, 2, ...)
    failed: bool = False  # a source failed: given to the scrapes that waited for it, never kept
    error: BaseException | None = None  # the encoder raised: re-raised to the scrapes that waited


@dataclass(frozen=True)
class _Read:
    families: _Families
    names: frozenset[str]
    made_at: float
    generation: object


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

    With a ``generation`` (e.g. telemetry's last background flush), the leading sources' encoding is kept per
    format and built in the background (see the module docstring)."""

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
        self._cond = threading.Condition()  # guards the fields below
        self._kept: dict[str, Head] = {}  # content type -> its last complete, sound encoding
        self._results: dict[str, Head] = {}  # content type -> its last build, failed or not (for waiters)
        self._asked: dict[str, Encoder] = {}  # formats the worker is to encode, in order
        self._waited: set[str] = set()  # of those, the ones a scrape waits for (encoded first)
        self._building = False  # the worker is running
        self._read: _Read | None = None  # the last sound read: formats asked after it encode from it while current
        self._worker: ThreadPoolExecutor | None = None
        self._closed = False
        self._tail_lines = TextEncoder()  # the last source's text lines, kept apart from the leading sources'
        self.builds = 0  # encodings the worker made (every format)

    @property
    def clock(self) -> Callable[[], float]:
        """The clock ``head``'s ``arrived`` is read on."""
        return self._clock

    @property
    def keeps(self) -> bool:
        """Whether the head is kept between scrapes (a generation and at least two sources)."""
        return self._generation is not None and len(self._sources) >= 2

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

    # -- what a scrape calls ---------------------------------------------------------------------
    def head(self, accept: str | None, arrived: float | None = None, *, wait: bool = True) -> Head | None:
        """The head for an Accept header: the kept one if young enough (asking for its successor when due), else,
        with ``wait``, the build this scrape asks for; without ``wait``, None then (cheap: the event loop calls it).
        """
        if not self.keeps:
            return None
        encoder, content_type = negotiate(accept, mode=self._mode)
        arrived = self._clock() if arrived is None else arrived
        with self._cond:
            kept = self._kept.get(content_type)
            if kept is not None and arrived - kept.made_at <= self._max_age_s:
                if kept.generation is not self._generation() or arrived - kept.made_at >= self._max_age_s / 2:
                    self._ask(content_type, encoder, waited=False)
                return kept
            if not wait:
                return None
            return self._wait(content_type, encoder, arrived)

    def render(self, accept: str | None, head: Head | None = None) -> tuple[bytes, str]:
        """The exposition for an Accept header: the head (given, kept or waited for), then the tail encoded now."""
        if not self.keeps:
            encoder, content_type = negotiate(accept, mode=self._mode)
            return encoder(self), content_type
        head = head if head is not None else self.head(accept)
        assert head is not None
        if head.error is not None:
            raise head.error
        tail_encoder, _ = negotiate(accept, lines=self._tail_lines, mode=self._mode)
        tail = _Part(self, self._sources[-1:], skip=head.names)
        return join(head.content_type, head.body, tail_encoder(tail)), head.content_type

    def idle(self, timeout: float = 30.0) -> bool:
        """Wait until the worker has nothing left to build (tests, shutdown); whether it got there in time."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._building:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
            return True

    # -- the worker ------------------------------------------------------------------------------
    def _wait(self, content_type: str, encoder: Encoder, arrived: float) -> Head:
        """A build for this scrape (lock held) whose read began after ``arrived - max_age_s``: a sound one, or one
        made after this scrape asked (failed or not). Asks the worker for it, again every ``WAIT_S``."""
        oldest = arrived - self._max_age_s
        asked_after = self.builds
        while True:
            got = self._results.get(content_type)
            if got is not None and got.made_at >= oldest and (got.build > asked_after or not (got.failed or got.error)):
                return got
            self._ask(content_type, encoder, waited=True)
            self._cond.wait(WAIT_S)

    def _ask(self, content_type: str, encoder: Encoder, *, waited: bool) -> None:
        """Queue a format for the worker (lock held), starting the worker if it is not running."""
        self._asked.setdefault(content_type, encoder)
        if waited:
            self._waited.add(content_type)
        if self._building:
            return
        self._building = True
        try:
            if self._closed:
                raise RuntimeError("closed")
            if self._worker is None:  # one long-lived thread: starting one per build would stall the scrape under load
                self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="routescope-metrics-build")
            self._worker.submit(self._run)
        except RuntimeError:  # closed, or the interpreter is shutting down: a scrape that waits builds itself
            if not waited:
                self._building = False
                return
            self._cond.release()
            try:
                self._run()
            finally:
                self._cond.acquire()

    def close(self) -> None:
        """Let the worker thread end once it has built what was asked (the app's shutdown); a scrape after this that
        must wait builds in its own thread."""
        with self._cond:
            self._closed, worker, self._worker = True, self._worker, None
        if worker is not None:
            worker.shutdown(wait=False)

    def _next(self) -> tuple[str, Encoder, _Read | None] | None:
        """The next format to encode (waited-for first) and a read it may reuse; None when none is left (lock held)."""
        while self._asked:
            content_type = next((c for c in self._asked if c in self._waited), next(iter(self._asked)))
            encoder = self._asked.pop(content_type)
            waited = content_type in self._waited
            self._waited.discard(content_type)
            now, kept = self._clock(), self._kept.get(content_type)
            if not waited and kept is not None and kept.generation is self._generation() \
                    and now - kept.made_at < self._max_age_s / 2:
                continue  # already of this generation: asked twice
            read = self._read
            if read is not None and (read.generation is not self._generation() or now - read.made_at > self._max_age_s / 2):
                read = None
            return content_type, encoder, read
        return None

    def _run(self) -> None:
        """Encode what was asked, one format at a time, reading the sources again once a flush came."""
        while True:
            with self._cond:
                job = self._next()
                if job is None:
                    self._building = False
                    self._cond.notify_all()
                    return
            content_type, encoder, read = job
            failed = False
            if read is None:
                read, failed = self._read_sources()
            try:
                body, error = encoder(read.families), None
            except Exception as exc:  # noqa: BLE001 - the scrapes that waited for it answer 500; the worker goes on
                log.exception("encoding /metrics as %s failed", content_type)
                body, error = b"", exc
            with self._cond:
                self.builds += 1
                made = Head(body, content_type, read.made_at, read.names, read.generation, self.builds, failed, error)
                self._results[content_type] = made
                if failed or error is not None:
                    self._kept.pop(content_type, None)  # the next scrape asks again
                else:
                    self._kept[content_type] = made
                self._cond.notify_all()

    def _read_sources(self) -> tuple[_Read, bool]:
        """Read the leading sources (telemetry's flushes as it is read); kept for other formats unless one failed."""
        made_at = self._clock()
        head = _Part(self, self._sources[:-1])
        families = _Families(list(head.collect()))
        read = _Read(families, frozenset(head.names), made_at, self._generation())
        with self._cond:
            self._read = None if head.failed else read
        return read, head.failed


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
