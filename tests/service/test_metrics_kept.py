"""/metrics keeps telemetry's encoding per format, built by one worker: the same bytes as a render from scratch, never
from a read older than two flush intervals (slow builds and concurrent flushes included), no scrape encoding it after
a flush, one build per format and flush, a failing source still left out and counted."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client import CollectorRegistry, Counter

from service.metrics import ChainedCollector, render
from telemetry.exposition import negotiate
from telemetry.exposition.protobuf import decode_delimited
from telemetry.prom import TelemetryCollector, make_registry

from .conftest import wait_demo

ACCEPTS = {
    "text 0.0.4": "text/plain;version=0.0.4",
    "OpenMetrics 1.0": "application/openmetrics-text;version=1.0.0",
    "OpenMetrics 2.0": "application/openmetrics-text;version=2.0.0",
    "protobuf": "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited",
}


@pytest.mark.parametrize("fmt", list(ACCEPTS))
def test_a_kept_render_is_byte_identical_to_one_from_scratch(client_for, fmt):
    c = client_for(demo=True, demo_glm_bug=True, demo_limit=150, demo_duty=1.0, flush_interval_s=60)
    wait_demo(c)
    c.get("/metrics")  # the service's HTTP series exist
    st = c.app.state.routescope
    tel, errors, flushed = st.telemetry, [], []

    def flush():  # telemetry's own flush, the totals it made noted
        flushed.append(tel.flush())
        return flushed[-1]

    telemetry = make_registry(TelemetryCollector(flush, tel.config.rank, errors.append))
    http = _Frozen(st.http_registry)  # the service's series as they are now (its advice refreshes in the background)
    chain = ChainedCollector((lambda: telemetry, lambda: http), on_error=errors.append,
                             generation=lambda: flushed[-1] if flushed else None)
    accept = ACCEPTS[fmt]
    first, content_type = render(chain, accept)
    kept, again = render(chain, accept)
    assert len(flushed) == 1, "the second render flushed: it did not reuse the encoding"
    # the same state (that flush's totals, the same HTTP registry) as one chain encoded at once, nothing kept
    same = make_registry(TelemetryCollector(lambda: flushed[0], tel.config.rank, errors.append))
    encoder, expected_type = negotiate(accept)
    scratch = encoder(ChainedCollector((lambda: same, lambda: http)))
    assert content_type == again == expected_type
    assert kept == first == scratch
    assert b"routescope_calls" in kept and b"http_request" in kept and errors == []


class _Frozen:
    """A registry's families as one collect gave them."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._families = list(registry.collect())

    def collect(self):
        return iter(self._families)


class _Source:
    """A leading source: one counter, a generation token the test moves as a flush would, collects counted."""

    def __init__(self, fail: bool = False, flushes: bool = False) -> None:
        self.registry = CollectorRegistry()
        self.calls = Counter("demo_calls", "Calls.", registry=self.registry)
        self.generation = object()
        self.collects = 0
        self.fail, self.flushes = fail, flushes
        self.inside, self.go = threading.Event(), threading.Event()
        self.go.set()
        self.lock = threading.Lock()

    def __call__(self) -> CollectorRegistry:
        with self.lock:
            self.collects += 1
        self.inside.set()
        assert self.go.wait(10)
        if self.fail:
            raise RuntimeError("source down")
        if self.flushes:  # as telemetry's collect_registry: reading flushes
            self.flush()
        return self.registry

    def flush(self) -> None:
        self.generation = object()


def _chain(source: _Source, errors: list[str], now: list[float], tail: CollectorRegistry | None = None):
    tail = tail if tail is not None else CollectorRegistry()
    return ChainedCollector((source, lambda: tail), on_error=errors.append, generation=lambda: source.generation,
                            max_age_s=2.0, clock=lambda: now[0])


def _calls(body: bytes) -> float:
    line = next(x for x in body.decode().splitlines() if x.startswith("demo_calls_total "))
    return float(line.split()[1])


def test_a_scrape_gets_the_kept_bytes_while_the_worker_builds_and_nothing_older_than_max_age():
    source, errors, now = _Source(), [], [100.0]
    chain = _chain(source, errors, now)
    assert _calls(chain.render(None)[0]) == 0 and source.collects == 1  # nothing kept: this scrape waited
    source.calls.inc()
    now[0] = 100.5  # no flush since the kept read: served as it is, nothing asked of the worker
    assert _calls(chain.render(None)[0]) == 0
    assert chain.idle() and source.collects == 1
    source.flush()  # the background flush
    now[0] = 101.0
    assert _calls(chain.render(None)[0]) == 0  # the previous bytes at once: the worker builds the new ones
    assert chain.idle() and source.collects == 2
    assert _calls(chain.render(None)[0]) == 1 and chain.head(None).made_at == 101.0
    source.calls.inc()
    now[0] = 102.9  # made at 101.0 and no flush since: 1.9 s old, still served, and its successor asked for
    assert _calls(chain.render(None)[0]) == 1
    assert chain.idle() and source.collects == 3 and _calls(chain.render(None)[0]) == 2
    source.calls.inc()
    now[0] = 105.0  # made at 102.9: 2.1 s old, older than max_age: this scrape waits for a build of its own
    assert _calls(chain.render(None)[0]) == 3 and source.collects == 4
    assert errors == []


def test_a_build_slower_than_the_flush_interval_never_serves_older_bytes():
    """While a build is stuck, scrapes get the kept bytes until those pass max_age; then a scrape waits for the build
    in flight if its read began within max_age before the scrape arrived, else for the next one."""
    source, errors, now = _Source(), [], [0.0]
    chain = _chain(source, errors, now)
    chain.render(None)
    source.go.clear()
    source.inside.clear()
    source.flush()
    now[0] = 1.0
    assert chain.head(None).made_at == 0.0  # kept, and a build asked for: its read begins at 1.0 and is stuck
    assert source.inside.wait(10)
    now[0] = 1.9
    assert chain.head(None).made_at == 0.0  # still within max_age
    with ThreadPoolExecutor(2) as pool:
        now[0] = 2.5  # kept bytes 2.5 s old: too old; the read in flight began 1.5 s before: young enough
        waiting = pool.submit(chain.head, None, 2.5)
        late = pool.submit(chain.head, None, 3.5)  # arrived 2.5 s after that read began: needs the next build
        time.sleep(0.2)
        assert not waiting.done() and not late.done()  # neither is served the old bytes
        now[0] = 3.6  # when the next read begins
        source.go.set()
        assert waiting.result(10).made_at in (1.0, 3.6)  # the one in flight (or, if it woke late, the next)
        assert late.result(10).made_at == 3.6 and source.collects == 3
    assert errors == []


def test_no_scrape_is_served_a_read_older_than_two_flush_intervals_under_concurrent_flushes_and_slow_builds():
    """Real clock: a flush every 50 ms, reads that take 0-120 ms (some longer than the interval), six scrapers in
    three formats. Every body's generation (the counter's value when its read ran) is at least the one current two
    intervals before the scrape arrived, and the scrapers mostly did not wait."""
    interval = 0.05
    registry = CollectorRegistry()
    gen = Counter("demo_generation", "Flushes so far.", registry=registry)
    flushed_at: list[float] = [time.monotonic()]
    token = [object()]
    stop = threading.Event()
    rng = random.Random(7)

    def source() -> CollectorRegistry:
        time.sleep(rng.random() * 0.12)
        return registry

    def flusher() -> None:
        while not stop.wait(interval):
            gen.inc()
            flushed_at.append(time.monotonic())
            token[0] = object()

    chain = ChainedCollector((source, CollectorRegistry), generation=lambda: token[0], max_age_s=2 * interval)
    seen: list[tuple[float, float, float]] = []  # arrived, generation served, seconds waited
    lock = threading.Lock()

    def scraper(accept: str | None) -> None:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            arrived = time.monotonic()
            body = chain.render(accept)[0]
            took = time.monotonic() - arrived
            with lock:
                seen.append((arrived, _generation_of(body), took))

    flushing = threading.Thread(target=flusher)
    flushing.start()
    try:
        with ThreadPoolExecutor(6) as pool:
            list(pool.map(scraper, [None, ACCEPTS["protobuf"], ACCEPTS["OpenMetrics 1.0"]] * 2))
    finally:
        stop.set()
        flushing.join()
    assert chain.idle()
    for arrived, served, _took in seen:
        promised = sum(1 for t in flushed_at[1:] if t <= arrived - 2 * interval)  # flushes before the limit
        assert served >= promised, (arrived, served, promised)
    quick = sum(1 for *_x, took in seen if took < 0.01)
    assert len(seen) > 100 and quick > 0.8 * len(seen), (len(seen), quick)


def _generation_of(body: bytes) -> float:
    if body.startswith(b"\n") or b"demo_generation_total" in body:
        text = body.decode(errors="replace")
        for line in text.splitlines():
            if line.startswith("demo_generation_total "):
                return float(line.split()[1])
    (fam,) = [f for f in decode_delimited(body) if f.name == "demo_generation_total"]
    return fam.metric[0].counter.value


def test_a_scrape_after_a_flush_never_encodes_and_one_build_serves_each_format_once():
    source, errors, now = _Source(), [], [0.0]
    chain = _chain(source, errors, now)
    chain.render(None)
    chain.render(ACCEPTS["protobuf"])
    assert source.collects == 1 and chain.builds == 2  # the second format encoded from the first one's read
    source.calls.inc()
    source.flush()
    with ThreadPoolExecutor(8) as pool:  # many scrapes of both formats after the flush: the old bytes at once
        bodies = list(pool.map(lambda i: chain.render(None if i % 2 else ACCEPTS["protobuf"])[0], range(32)))
    assert chain.idle()
    assert source.collects == 2 and chain.builds == 4  # one read and one encoding per format for that flush
    assert {_calls(b) if b.startswith(b"#") else _pb_calls(b) for b in bodies} <= {0, 1}
    assert _pb_calls(chain.render(ACCEPTS["protobuf"])[0]) == 1 and _calls(chain.render(None)[0]) == 1


def _pb_calls(body: bytes) -> float:
    return {f.name: f.metric[0].counter.value for f in decode_delimited(body)}["demo_calls_total"]


def test_a_scrape_that_must_wait_waits_for_its_own_format_first():
    source, errors, now = _Source(), [], [0.0]
    chain = _chain(source, errors, now)
    order: list[str] = []
    encoders = {}
    for name, accept in (("text", None), ("protobuf", ACCEPTS["protobuf"])):
        encoder, content_type = negotiate(accept)
        encoders[content_type] = (name, encoder)
    with chain._cond:
        for content_type, (name, encoder) in encoders.items():
            chain._asked[content_type] = (lambda c, name=name, enc=encoder: order.append(name) or enc(c))
        chain._waited.add(next(ct for ct, (name, _e) in encoders.items() if name == "protobuf"))
        chain._building = True
    chain._run()
    assert order == ["protobuf", "text"] and source.collects == 1


def test_an_encoder_that_raises_fails_the_scrapes_that_waited_and_the_worker_goes_on(monkeypatch):
    import service.metrics as metrics

    source, errors, now = _Source(), [], [0.0]
    chain = _chain(source, errors, now)
    broken = [True]
    real = metrics.negotiate

    def negotiate(accept, **kw):
        encoder, content_type = real(accept, **kw)
        if "lines" in kw:  # the tail's
            return encoder, content_type

        def failing(collector):
            if broken[0]:
                raise RuntimeError("encoder down")
            return encoder(collector)

        return failing, content_type

    monkeypatch.setattr(metrics, "negotiate", negotiate)
    with pytest.raises(RuntimeError, match="encoder down"):
        chain.render(None)
    assert chain.idle()
    broken[0] = False
    assert _calls(chain.render(None)[0]) == 0  # nothing was kept from the failed build: this scrape waited again
    assert source.collects == 1  # from the same read


def test_formats_are_kept_apart_and_the_tail_is_encoded_every_scrape():
    source, errors, now = _Source(), [], [0.0]
    tail = CollectorRegistry()
    hits = Counter("http_hits", "Requests.", registry=tail)
    chain = _chain(source, errors, now, tail)
    text = chain.render(None)[0]
    om = chain.render(ACCEPTS["OpenMetrics 1.0"])[0]  # no flush since the text scrape's read: encoded from it
    assert source.collects == 1 and text != om and om.endswith(b"# EOF\n") and om.count(b"# EOF") == 1
    hits.inc(3)
    again = chain.render(None)[0]
    assert source.collects == 1 and b"http_hits_total 3.0" in again


def test_a_failing_leading_source_is_left_out_counted_and_tried_again():
    source, errors, now = _Source(fail=True), [], [0.0]
    tail = CollectorRegistry()
    Counter("http_hits", "Requests.", registry=tail).inc()
    chain = _chain(source, errors, now, tail)
    for n in (1, 2):
        body = chain.render(None)[0]
        assert b"demo_calls" not in body and b"http_hits_total 1.0" in body
        assert errors == ["export"] * n and source.collects == n  # not kept: each scrape tries it again


def test_a_failing_tail_is_left_out_and_counted_at_every_scrape():
    source, errors, now = _Source(), [], [0.0]

    def down() -> CollectorRegistry:
        raise RuntimeError("http registry down")

    chain = ChainedCollector((source, down), on_error=errors.append, generation=lambda: source.generation,
                             clock=lambda: now[0])
    for n in (1, 2):
        assert _calls(chain.render(None)[0]) == 0
        assert errors == ["export"] * n
    assert source.collects == 1


def test_concurrent_scrapes_of_one_generation_share_one_encoding():
    source, errors, now = _Source(), [], [0.0]
    chain = _chain(source, errors, now)
    with ThreadPoolExecutor(8) as pool:
        bodies = list(pool.map(lambda _: chain.render(ACCEPTS["protobuf"])[0], range(32)))
    assert source.collects == 1 and len(set(bodies)) == 1


def test_a_read_is_shared_by_the_formats_asked_for_after_it_until_the_next_flush():
    source, errors, now = _Source(flushes=True), [], [0.0]
    chain = _chain(source, errors, now)
    chain.render(None)  # its read flushed, as telemetry's does: the generation after it is the read's own
    chain.render(ACCEPTS["protobuf"])  # no flush since but that one: encoded from the same read
    chain.render(None)
    chain.render(ACCEPTS["protobuf"])
    assert source.collects == 1
    source.flush()  # the background flush
    source.calls.inc()
    chain.render(None)
    chain.render(ACCEPTS["protobuf"])  # both served the old bytes and asked for new ones: one read for both
    assert chain.idle() and source.collects == 2
    proto = chain.render(ACCEPTS["protobuf"])[0]
    assert {f.name: f.metric[0].counter.value for f in decode_delimited(proto)}["demo_calls_total"] == 1
    om = chain.render(ACCEPTS["OpenMetrics 1.0"])[0]  # never asked for: waited for, from the same read
    assert source.collects == 2 and _calls(om) == 1


def test_after_close_the_worker_ends_and_a_scrape_that_must_wait_builds_itself():
    source, errors, now = _Source(), [], [0.0]
    chain = _chain(source, errors, now)
    chain.render(None)
    worker = chain._worker
    chain.close()
    assert worker is not None and chain._worker is None
    source.calls.inc()
    source.flush()
    now[0] = 1.0
    assert _calls(chain.render(None)[0]) == 0  # young enough: kept, nothing asked of a worker that is gone
    assert chain.idle(1) and source.collects == 1
    now[0] = 3.0  # too old: this scrape builds in its own thread
    assert _calls(chain.render(None)[0]) == 1 and source.collects == 2 and errors == []
