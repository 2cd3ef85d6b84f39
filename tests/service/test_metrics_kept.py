"""/metrics keeps telemetry's encoding per format between flushes: the same bytes as a render from scratch, never
older than one flush interval, a failing source still left out and counted, concurrent scrapes sharing one encoding."""

from __future__ import annotations

import threading
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
    chain = ChainedCollector((lambda: telemetry, lambda: st.http_registry), on_error=errors.append,
                             generation=lambda: flushed[-1] if flushed else None)
    accept = ACCEPTS[fmt]
    first, content_type = render(chain, accept)
    kept, again = render(chain, accept)
    assert len(flushed) == 1, "the second render flushed: it did not reuse the encoding"
    # the same state (that flush's totals, the same HTTP registry) as one chain encoded at once, nothing kept
    same = make_registry(TelemetryCollector(lambda: flushed[0], tel.config.rank, errors.append))
    encoder, expected_type = negotiate(accept)
    scratch = encoder(ChainedCollector((lambda: same, lambda: st.http_registry)))
    assert content_type == again == expected_type
    assert kept == first == scratch
    assert b"routescope_calls" in kept and b"http_request" in kept and errors == []


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


def test_a_scrape_serves_the_last_flush_before_it_and_nothing_older_than_max_age():
    source, errors, now = _Source(), [], [100.0]
    chain = _chain(source, errors, now)
    assert _calls(chain.render(None)[0]) == 0
    source.calls.inc()
    now[0] = 100.5  # no flush since the kept encoding: served as it is
    assert _calls(chain.render(None)[0]) == 0 and source.collects == 1
    source.flush()  # the background flush: the next scrape encodes again
    now[0] = 101.0
    assert _calls(chain.render(None)[0]) == 1 and source.collects == 2
    source.calls.inc()
    now[0] = 102.9  # made at 101.0, no flush since: 1.9 s old, served
    assert _calls(chain.render(None)[0]) == 1
    now[0] = 103.1  # 2.1 s old: older than max_age, encoded again
    assert _calls(chain.render(None)[0]) == 2 and source.collects == 3
    assert errors == []


def test_while_a_newer_flush_is_encoded_a_scrape_gets_the_previous_one_at_once():
    source, errors, now = _Source(), [], [0.0]
    chain = _chain(source, errors, now)
    chain.render(None)
    source.calls.inc()
    source.flush()
    source.go.clear()
    source.inside.clear()
    with ThreadPoolExecutor(1) as pool:
        making = pool.submit(lambda: chain.render(None)[0])
        assert source.inside.wait(10)  # the encoding of the new flush has begun, and waits
        assert _calls(chain.render(None)[0]) == 0  # one flush behind, not queued behind it
        source.go.set()
        assert _calls(making.result(10)) == 1
    assert _calls(chain.render(None)[0]) == 1


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


def test_a_renders_own_flush_keeps_the_other_formats_and_after_a_background_flush_one_read_serves_all():
    source, errors, now = _Source(flushes=True), [], [0.0]
    chain = _chain(source, errors, now)
    chain.render(None)  # its read flushed, as telemetry's does: that flush is this read's own
    chain.render(ACCEPTS["protobuf"])  # no flush since but that one: encoded from the same read
    chain.render(None)
    chain.render(ACCEPTS["protobuf"])
    assert source.collects == 1
    source.flush()  # the background flush
    source.calls.inc()
    assert _calls(chain.render(None)[0]) == 1 and source.collects == 2
    proto = chain.render(ACCEPTS["protobuf"])[0]  # encoded now, from the text scrape's read
    calls = {f.name: f.metric[0].counter.value for f in decode_delimited(proto)}["demo_calls_total"]
    assert source.collects == 2 and calls == 1
    om = chain.render(ACCEPTS["OpenMetrics 1.0"])[0]  # never asked for: made now, from the same read
    assert source.collects == 2 and _calls(om) == 1
    source.flush()  # another background flush: that read is no longer current
    source.calls.inc()
    assert _calls(chain.render(ACCEPTS["OpenMetrics 1.0"])[0]) == 2 and source.collects == 3


def test_after_a_flush_a_scrape_waits_for_its_own_format_only():
    """The text scrape after a flush encodes text alone: a protobuf scrape meanwhile gets its previous bytes, and
    the next one encodes protobuf from the text scrape's read."""
    source, errors, now = _Source(), [], [0.0]
    chain = _chain(source, errors, now)
    chain.render(None)
    chain.render(ACCEPTS["protobuf"])
    source.calls.inc()
    source.flush()
    encoded: list[str] = []
    for ct, k in list(chain._kept.items()):
        chain._kept[ct] = type(k)(k.body, k.made_at, k.names, lambda c, enc=k.encoder, ct=ct: encoded.append(ct)
                                  or enc(c))
    assert _calls(chain.render(None)[0]) == 1 and source.collects == 2
    assert encoded == []  # the kept protobuf encoder was not run by the text scrape
    proto = chain.render(ACCEPTS["protobuf"])[0]
    assert source.collects == 2
    assert {f.name: f.metric[0].counter.value for f in decode_delimited(proto)}["demo_calls_total"] == 1
