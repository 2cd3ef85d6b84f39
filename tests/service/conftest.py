"""Fixtures: hermetic settings (no ROUTESCOPE_*/OTEL_* leaking in), apps from the factory, live servers."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import ServiceSettings

_LEAKY = ("ROUTESCOPE_", "OTEL_", "PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(_LEAKY):
            monkeypatch.delenv(name, raising=False)


@pytest.fixture
def client_for() -> Iterator[Callable[..., TestClient]]:
    """``client_for(**settings)``: a started app (lifespan run); every one is closed at teardown."""
    opened: list[TestClient] = []

    def make(**kw: object) -> TestClient:
        kw.setdefault("flush_interval_s", 0.2)
        c = TestClient(create_app(ServiceSettings(**kw)), base_url="http://127.0.0.1")  # a loopback Host
        c.__enter__()
        opened.append(c)
        return c

    yield make
    for c in reversed(opened):
        c.__exit__(None, None, None)


@pytest.fixture
def client(client_for: Callable[..., TestClient]) -> TestClient:
    return client_for()


def wait_demo(c: TestClient, timeout: float = 60.0) -> dict:
    """Poll /routing until the demo has finished its call limit; returns that /routing."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = c.get("/routing").json()
        if r["demo"] and r["demo"]["state"] != "running":
            return c.get("/routing").json()
        time.sleep(0.1)
    raise AssertionError("demo did not finish in time")


@pytest.fixture
def demo_client(client_for: Callable[..., TestClient]) -> TestClient:
    """A demo with the GLM bug, 150 calls unpaced, run to completion."""
    c = client_for(demo=True, demo_glm_bug=True, demo_limit=150, demo_duty=1.0)
    wait_demo(c)
    return c
