"""A real Prometheus server for tests: start on a free loopback port, query, stop.

    with start_prometheus(tmp_path, targets={"routescope": ["127.0.0.1:9400"]},
                          rule_files=[RULES], scrape_interval="1s",
                          evaluation_interval="1s") as prom:
        prom.wait_for(lambda: prom.query("up")["result"], timeout=20)

Runs the `prometheus` binary (Debian package `prometheus`; skips when absent) with a
temporary TSDB and stops it (SIGTERM, then SIGKILL) when the block exits. Every wait is
bounded. Stdlib only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class PrometheusError(RuntimeError):
    """Prometheus did not start, or an API call failed."""


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the caller retries if it is taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config_text(
    *,
    targets: Mapping[str, Sequence[str]] | None = None,
    rule_files: Sequence[str | os.PathLike[str]] = (),
    scrape_interval: str = "1s",
    evaluation_interval: str = "1s",
    scrape_timeout: str | None = None,
    alertmanagers: Sequence[str] = (),
) -> str:
    """A prometheus.yml: one static job per key of `targets`, alerts sent to `alertmanagers` (host:port).

    JSON is valid YAML.
    """
    timeout = scrape_timeout or scrape_interval
    cfg: dict[str, Any] = {
        "global": {
            "scrape_interval": scrape_interval,
            "scrape_timeout": timeout,
            "evaluation_interval": evaluation_interval,
        },
        "rule_files": [str(Path(f).resolve()) for f in rule_files],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": list(addrs)}]}
            for job, addrs in (targets or {}).items()
        ],
    }
    if alertmanagers:
        cfg["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": list(alertmanagers)}]}]}
    return json.dumps(cfg, indent=2) + "\n"


def wait_until(probe: Callable[[], T], *, timeout: float, interval: float = 0.25, what: str = "condition",
               alive: Callable[[], None] = lambda: None,
               transient: tuple[type[BaseException], ...] = (OSError,)) -> T:
    """Call probe until it returns something truthy; raise TimeoutError after ``timeout`` s.

    ``alive`` raises when the server under test has died, so a crash is reported at once; an exception in
    ``transient`` counts as not ready yet.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        alive()
        try:
            last = probe()
        except transient as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} not met within {timeout}s; last: {last!r}")
        time.sleep(interval)


class PromServer:
    """Handle on a running Prometheus: HTTP API helpers and bounded waits."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, workdir: Path, log: Path) -> None:
        self.proc = proc
        self.port = port
        self.workdir = workdir
        self.log = log
        self.url = f"http://127.0.0.1:{port}"

    # --- raw HTTP -------------------------------------------------------------------
    def get(self, path: str, params: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
            *, timeout: float = 10.0) -> Any:
        """GET an API path; return the decoded JSON body (for errors too: 400/422 carry it)."""
        query = "?" + urllib.parse.urlencode(params, doseq=True) if params else ""
        try:
            with urllib.request.urlopen(self.url + path + query, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            body = e.read()
            try:
                return json.loads(body)
            except ValueError:
                raise PrometheusError(f"GET {path}: HTTP {e.code}: {body[:500]!r}") from e

    def api(self, path: str, params: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None) -> Any:
        """GET /api/v1/<path>; return `data`, raising PrometheusError unless status is success."""
        body = self.get("/api/v1/" + path.lstrip("/"), params)
        if body.get("status") != "success":
            raise PrometheusError(f"/api/v1/{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    # --- conveniences ---------------------------------------------------------------
    def query(self, expr: str, at: float | None = None) -> dict[str, Any]:
        params = {"query": expr} if at is None else {"query": expr, "time": at}
        return self.api("query", params)

    def query_range(self, expr: str, start: float, end: float, step: str = "1s") -> dict[str, Any]:
        return self.api("query_range", {"query": expr, "start": start, "end": end, "step": step})

    def rule_groups(self) -> list[dict[str, Any]]:
        return self.api("rules")["groups"]

    def alerts(self) -> list[dict[str, Any]]:
        return self.api("alerts")["alerts"]

    def targets(self) -> list[dict[str, Any]]:
        return self.api("targets")["activeTargets"]

    def label_values(self, label: str, match: str | None = None) -> list[str]:
        return self.api(f"label/{label}/values", {"match[]": match} if match else None)

    def logs(self, tail: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def wait_for(self, probe: Callable[[], T], *, timeout: float, interval: float = 0.25,
                 what: str = "condition") -> T:
        """Call probe until it returns something truthy; raise TimeoutError after timeout s."""
        return wait_until(probe, timeout=timeout, interval=interval, what=what, alive=self._alive,
                          transient=(PrometheusError, OSError))

    def _alive(self) -> None:
        if self.proc.poll() is not None:
            raise PrometheusError(f"prometheus exited ({self.proc.returncode}):\n{self.logs()}")

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def start_prometheus(
    workdir: str | os.PathLike[str],
    *,
    config: str | None = None,
    targets: Mapping[str, Sequence[str]] | None = None,
    rule_files: Sequence[str | os.PathLike[str]] = (),
    scrape_interval: str = "1s",
    evaluation_interval: str = "1s",
    ready_timeout: float = 30.0,
    attempts: int = 3,
    features: Sequence[str] = (),
    extra_flags: Sequence[str] = (),
    agent: bool = False,
    storage: str | os.PathLike[str] | None = None,
) -> Iterator[PromServer]:
    """Start Prometheus in workdir (config, TSDB, log), wait for /-/ready, stop it after.

    `config` is a full prometheus.yml text; otherwise one is written from `targets`,
    `rule_files` and the intervals. A port taken between choosing and binding is retried.
    `features` go to `--enable-feature=` (e.g. `native-histograms`), `extra_flags` as they are.
    `agent`: agent mode (`--enable-feature=agent`, a WAL under `--storage.agent.path`; no query API).
    `storage`: the TSDB (or WAL) directory, kept across a restart; default a fresh one per attempt.
    """
    if agent and "agent" not in features:
        features = ("agent", *features)
    binary = prometheus_binary()
    if binary is None:
        import pytest

        pytest.skip("prometheus is not installed (apt-get install -y prometheus)")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "prometheus.yml"
    cfg.write_text(config if config is not None else config_text(
        targets=targets, rule_files=rule_files,
        scrape_interval=scrape_interval, evaluation_interval=evaluation_interval))
    server: PromServer | None = None
    for attempt in range(attempts):
        port = free_port()
        log = workdir / f"prometheus-{attempt}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [binary, f"--config.file={cfg}",
                 f"--storage.{'agent' if agent else 'tsdb'}.path={storage or workdir / f'tsdb-{attempt}'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=info"]
                + ([f"--enable-feature={','.join(features)}"] if features else []) + list(extra_flags),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        candidate = PromServer(proc, port, workdir, log)
        deadline = time.monotonic() + ready_timeout
        while proc.poll() is None and time.monotonic() < deadline and not _ready(candidate.url):
            time.sleep(0.1)
        if proc.poll() is None and _ready(candidate.url):
            server = candidate
            break
        candidate.stop()
        text = candidate.logs()
        if "address already in use" not in text:
            raise PrometheusError(f"prometheus did not become ready in {ready_timeout}s:\n{text}")
    if server is None:
        raise PrometheusError("prometheus: no free port after retries")
    try:
        yield server
    finally:
        server.stop()
