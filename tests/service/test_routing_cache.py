"""/routing built once per telemetry flush: kept while its key holds, rebuilt when it moves, the same JSON as before."""

from __future__ import annotations

import json
import threading
import time

import pytest

from service.routing import RoutingOut, routing_of
from service.routing_cache import Key, RoutingCache, generation
from tests.service.conftest import wait_demo


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def real_doc(client) -> dict:
    """A real /routing document (no traffic) from a real app, which RoutingOut accepts."""
    return routing_of(client.app.state.routescope)


def _cache(real_doc: dict, key: list, clock: _Clock, max_age_s: float = 1.0) -> tuple[RoutingCache, list[int]]:
    built: list[int] = []

    def build() -> dict:
        built.append(len(built))
        return {**real_doc, "service": {**real_doc["service"], "ts": float(len(built))}}

    return RoutingCache(build, lambda: key[0], max_age_s=max_age_s, clock=clock), built


def test_a_build_is_kept_while_its_key_holds_and_it_is_young(real_doc):
    key, clock = [Key(1.0, "running")], _Clock()
    cache, built = _cache(real_doc, key, clock)
    assert cache.current() is None  # nothing built yet
    first = cache.get()
    assert cache.get() is first and cache.current() is first and len(built) == 1
    clock.now += 0.99
    assert cache.get() is first
    key[0] = Key(2.0, "running")  # the next background flush
    second = cache.get()
    assert second is not first and len(built) == 2 and json.loads(second.body)["service"]["ts"] == 2.0
    key[0] = Key(2.0, "finished")  # the demo's state moved: shown at once
    assert cache.get() is not second and len(built) == 3
    clock.now += 1.0  # no flush for a whole interval (a stuck flush thread): built anew anyway
    assert cache.get().body != second.body and len(built) == 4


def test_after_a_flush_the_kept_build_is_served_while_a_thread_makes_the_next(real_doc):
    key, clock = [Key(1.0, "running")], _Clock()
    cache, built = _cache(real_doc, key, clock)
    assert cache.kept() is None  # nothing built: the caller builds
    first = cache.get()
    assert cache.kept() is first and len(built) == 1  # still current: no background build
    key[0] = Key(2.0, "running")
    assert cache.kept() is first  # served at once ...
    deadline = time.monotonic() + 10
    while cache.current() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    second = cache.current()  # ... while a thread made the next one
    assert second is not None and second is not first and len(built) == 2 and cache.kept() is second
    key[0] = Key(2.0, "finished")
    assert cache.kept() is None  # new facts: the caller waits for a build that has them
    cache.get()
    clock.now += 2.0  # twice the age limit without a successor (a failing build): the caller builds
    key[0] = Key(3.0, "finished")
    assert cache.kept() is None


def test_no_key_means_a_build_per_request(real_doc):
    cache, built = _cache(real_doc, [None], _Clock())
    cache.get()
    cache.get()
    assert cache.current() is None and cache.kept() is None and len(built) == 2


def test_callers_waiting_on_a_build_share_it(real_doc):
    key, clock = [Key(1.0, None)], _Clock()
    release = threading.Event()
    calls: list[int] = []

    def slow_build() -> dict:
        calls.append(1)
        release.wait(10)
        return real_doc

    cache = RoutingCache(slow_build, lambda: key[0], max_age_s=1.0, clock=clock)
    got: list = []
    threads = [threading.Thread(target=lambda: got.append(cache.get())) for _ in range(6)]
    for t in threads:
        t.start()
    time.sleep(0.2)  # all six are in: one builds, five wait on it
    release.set()
    for t in threads:
        t.join(10)
    assert len(calls) == 1 and len(got) == 6 and all(b is got[0] for b in got)


def test_the_body_is_what_fastapi_answered_for_the_same_document(real_doc):
    """Validated against RoutingOut and dumped as FastAPI's response_model did (by alias, nothing excluded)."""
    cache, _ = _cache(real_doc, [Key(1.0, None)], _Clock())
    body = json.loads(cache.get().body)
    expected = RoutingOut.model_validate({**real_doc, "service": {**real_doc["service"], "ts": 1.0}})
    assert body == expected.model_dump(mode="json", by_alias=True)


def test_a_document_that_breaks_the_contract_is_not_served(real_doc):
    cache, _ = _cache({**real_doc, "counts": [{"kernel": "k"}]}, [Key(1.0, None)], _Clock())
    with pytest.raises(ValueError):
        cache.get()
    assert cache.current() is None


def test_generation_follows_the_background_flush_and_the_demo_state(client_for):
    c = client_for(demo=True, demo_limit=40, demo_duty=1.0)
    state = c.app.state.routescope
    deadline = time.monotonic() + 30
    while state.telemetry.last_background_flush is None and time.monotonic() < deadline:
        time.sleep(0.05)
    key = generation(state)
    assert key == Key(state.telemetry.last_background_flush, state.demo.state)
    wait_demo(c)
    assert generation(state) != key

    class NoFlushYet:
        last_background_flush = None

    class Unreadable:
        @property
        def last_background_flush(self) -> float:
            raise RuntimeError("gone")

    for telemetry in (NoFlushYet(), Unreadable()):
        assert generation(type("State", (), {"telemetry": telemetry, "demo": None})()) is None


def test_pollers_within_one_flush_share_one_build_and_see_the_next_flush(client_for):
    c = client_for(flush_interval_s=0.5)
    cache = c.app.state.routescope.routing
    deadline = time.monotonic() + 30
    while c.app.state.routescope.telemetry.last_background_flush is None and time.monotonic() < deadline:
        time.sleep(0.05)
    flushed = c.app.state.routescope.telemetry.last_background_flush
    bodies = [c.get("/routing").content for _ in range(5)]
    if c.app.state.routescope.telemetry.last_background_flush == flushed:  # no flush fell among the five
        assert len(set(bodies)) == 1
    builds = cache.builds
    while c.app.state.routescope.telemetry.last_background_flush == flushed and time.monotonic() < deadline:
        time.sleep(0.05)
    first_ts = json.loads(bodies[0])["service"]["ts"]
    while json.loads(c.get("/routing").content)["service"]["ts"] <= first_ts and time.monotonic() < deadline:
        time.sleep(0.05)  # the first request after a flush may get the kept build while the next one is made
    assert cache.builds > builds and c.get("/routing").json()["service"]["ts"] > first_ts
    assert c.head("/routing").status_code == 200 and c.head("/routing").content == b""
