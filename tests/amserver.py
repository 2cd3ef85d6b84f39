"""A real Alertmanager for tests, and a webhook receiver that keeps what it is sent.

    with WebhookReceiver() as hook, start_alertmanager(tmp_path, config=text) as am:
        am.post_alerts([{"labels": {"alertname": "X", "severity": "critical"}}])
        hook.wait_for(lambda got: got, timeout=20)

Runs Debian's `prometheus-alertmanager` (0.25) on a free loopback port with a temporary
storage path and clustering off (`--cluster.listen-address=`), and stops it (SIGTERM, then
SIGKILL) when the block exits. Without the binary the tests skip, except under CI (``CI``
set), where they fail: CI installs it, so a skip there would hide that nothing was tested.
Every wait is bounded. Stdlib only.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tests.promserver import PromServer, _ready, free_port
from tests.promserver import wait_until as _wait_until

T = TypeVar("T")
PACKAGE = "prometheus-alertmanager"  # Debian's package; it ships amtool too
_CI_OFF = frozenset({"", "0", "false", "no", "off"})


class AlertmanagerError(RuntimeError):
    """Alertmanager did not start, or an API call failed."""


def require(binary: str, env: Mapping[str, str] = os.environ) -> str:
    """The path of ``binary``; skip the test without it, or fail under CI, where it must be installed."""
    path = shutil.which(binary)
    if path is not None:
        return path
    import pytest

    message = f"{binary} is not installed (apt-get install -y {PACKAGE})"
    if env.get("CI", "").strip().lower() in _CI_OFF:
        pytest.skip(message)
    pytest.fail(f"{message}; CI must install it (scripts/test.sh)", pytrace=False)


def wait_until(probe: Callable[[], T], *, timeout: float, interval: float = 0.25, what: str = "condition",
               alive: Callable[[], None] = lambda: None) -> T:
    """``tests.promserver.wait_until`` with Alertmanager's API errors counted as not ready yet."""
    return _wait_until(probe, timeout=timeout, interval=interval, what=what, alive=alive,
                       transient=(AlertmanagerError, OSError))


class WebhookReceiver:
    """An HTTP server on a loopback port that records every JSON body POSTed to it, with its path."""

    def __init__(self) -> None:
        received: list[tuple[str, dict[str, Any]]] = []
        lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server hook's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with lock:
                    received.append((self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:  # keep pytest's output clean
                pass

        self._received, self._lock = received, lock
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook", daemon=True)

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def received(self) -> list[tuple[str, dict[str, Any]]]:
        """(path, payload) of every notification so far, oldest first."""
        with self._lock:
            return list(self._received)

    def wait_for(self, probe: Callable[[list[tuple[str, dict[str, Any]]]], T], *, timeout: float,
                 what: str = "notification") -> T:
        """Wait until ``probe(received())`` is truthy; return it."""
        try:
            return wait_until(lambda: probe(self.received()), timeout=timeout, what=what)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\nreceived: {json.dumps(self.received(), indent=1)[-6000:]}") from None


class AMServer:
    """Handle on a running Alertmanager: its v2 API and its log."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.proc, self.port, self.log = proc, port, log
        self.url = f"http://127.0.0.1:{port}"

    def _call(self, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method="GET" if data is None else "POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                raw = r.read()
        except urllib.error.HTTPError as exc:
            raise AlertmanagerError(f"{req.method} {path}: HTTP {exc.code}: {exc.read()[:500]!r}") from exc
        return json.loads(raw) if raw.strip() else None

    def alerts(self, **filters: str) -> list[dict[str, Any]]:
        """GET /api/v2/alerts (``inhibited="true"`` and the like as filters)."""
        query = "&".join(f"{k}={v}" for k, v in filters.items())
        return self._call("/api/v2/alerts" + (f"?{query}" if query else ""))

    def post_alerts(self, alerts: Sequence[Mapping[str, Any]]) -> None:
        self._call("/api/v2/alerts", list(alerts))

    logs = PromServer.logs  # the end of its log
    stop = PromServer.stop  # SIGTERM, then SIGKILL past the timeout

    def alive(self) -> None:
        if self.proc.poll() is not None:
            raise AlertmanagerError(f"alertmanager exited ({self.proc.returncode}):\n{self.logs()}")

    def wait_for(self, probe: Callable[[], T], *, timeout: float, what: str = "condition") -> T:
        return wait_until(probe, timeout=timeout, what=what, alive=self.alive)


@contextlib.contextmanager
def start_alertmanager(workdir: str | os.PathLike[str], *, config: str, ready_timeout: float = 30.0,
                       attempts: int = 3) -> Iterator[AMServer]:
    """Start Alertmanager in workdir (config, storage, log), wait for /-/ready, stop it after.

    A port taken between choosing and binding is retried.
    """
    binary = require(PACKAGE)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "alertmanager.yml"
    cfg.write_text(config)
    server: AMServer | None = None
    for attempt in range(attempts):
        port = free_port()
        log = workdir / f"alertmanager-{attempt}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [binary, f"--config.file={cfg}", f"--storage.path={workdir / f'data-{attempt}'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=", "--log.level=debug"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        candidate = AMServer(proc, port, log)
        try:
            server = candidate.wait_for(lambda: _ready(candidate.url) and candidate, timeout=ready_timeout,
                                        what="alertmanager's /-/ready")
            break
        except (TimeoutError, AlertmanagerError):
            candidate.stop()
            if "address already in use" not in candidate.logs():
                raise AlertmanagerError(f"alertmanager not ready in {ready_timeout}s:\n{candidate.logs()}") from None
    if server is None:
        raise AlertmanagerError("alertmanager: no free port after retries")
    try:
        yield server
    finally:
        server.stop()
