"""Parts of the fleet end-to-end test: rank processes on cue, agents from the shipped config, remote-write counters."""

from __future__ import annotations

import contextlib
import json
import select
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dashboards.fleet import AGENT, render_agent
from tests.promserver import PromServer, start_prometheus

ROOT = Path(__file__).resolve().parents[2]
# what an agent has sent, from its own /metrics (Prometheus 2.42's remote-write queue counters)
SENT = {"bytes": "prometheus_remote_storage_bytes_total", "samples": "prometheus_remote_storage_samples_total",
        "histograms": "prometheus_remote_storage_histograms_total"}
FAILED = ("prometheus_remote_storage_samples_failed_total", "prometheus_remote_storage_histograms_failed_total")


class Rank:
    """One fleet_worker process: waves of calls into a node's multiprocess directory, each on cue."""

    def __init__(self, directory: Path, workdir: Path, *, node: str, rank: int, calls: int, max_rows: int,
                 glm_decodes: int, seed: int, tag: str = "") -> None:
        self.out = workdir / f"{node}-rank{rank}{tag}"
        self.log = (workdir / f"{node}-rank{rank}{tag}.log").open("wb")
        cmd = [sys.executable, "-m", "tests.dashboards.fleet_worker", "--dir", str(directory), "--rank", str(rank),
               "--calls", str(calls), "--max-rows", str(max_rows), "--glm-decodes", str(glm_decodes),
               "--seed", str(seed), "--out", str(self.out)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True)
        self.wave = 1

    def wait_wave(self, timeout: float = 180.0) -> dict[tuple[str, ...], list[float]]:
        """Block until the wave is flushed; its raw samples."""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)  # the worker prints one line per wave
        line = self.proc.stdout.readline() if ready else f"(nothing within {timeout} s)"
        if line.strip() != f"ready {self.wave}":
            raise AssertionError(f"rank {self.out.name}: {line!r}; log:\n{Path(self.log.name).read_text()[-3000:]}")
        raw = json.loads(Path(f"{self.out}-wave{self.wave}.json").read_text())
        return {tuple(k.split("|")): v for k, v in raw.items()}

    def next_wave(self) -> None:
        self.wave += 1
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            if not self.proc.stdin.closed:
                with contextlib.suppress(BrokenPipeError, OSError):
                    self.proc.stdin.write("stop\n")
                    self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()


@dataclass
class Agent:
    """A node's Prometheus agent: the shipped config rendered for it, restartable on the same WAL."""

    workdir: Path
    central_url: str
    cluster: str
    node: str
    targets: list[str]
    native: bool = True  # --enable-feature=native-histograms (the shipped way); off: a text-scraping agent
    server: PromServer | None = None
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    _starts: int = 0

    def config(self) -> str:
        return render_agent(AGENT.read_text(), central_url=self.central_url, cluster=self.cluster, node=self.node,
                            targets=self.targets, scrape_interval="1s")

    def start(self) -> PromServer:
        self._starts += 1
        self.server = self._stack.enter_context(start_prometheus(
            self.workdir / f"run{self._starts}", config=self.config(), agent=True,
            features=("native-histograms",) if self.native else (), storage=self.workdir / "wal"))
        return self.server

    def stop(self) -> None:
        self._stack.close()
        self.server = None

    def counters(self) -> dict[str, float]:
        """The agent's remote-write counters, summed over its queues."""
        assert self.server is not None
        with urllib.request.urlopen(self.server.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out = dict.fromkeys([*SENT.values(), *FAILED], 0.0)
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in out:
                out[name] += float(line.rsplit(" ", 1)[1])
        return out


def stop_ranks(ranks: list[Rank]) -> None:
    """End every rank's input at once (each closes its telemetry), then wait for each."""
    for r in ranks:
        if r.proc.poll() is None and not r.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError, OSError):
                r.proc.stdin.write("stop\n")
                r.proc.stdin.close()
    for r in ranks:
        r.stop()


@contextlib.contextmanager
def agents(*fleet: Agent) -> Iterator[tuple[Agent, ...]]:
    try:
        for a in fleet:
            a.start()
        yield fleet
    finally:
        for a in fleet:
            a.stop()


def merge(into: dict[tuple[str, ...], list[float]], samples: dict[tuple[str, ...], list[float]]) -> None:
    for key, values in samples.items():
        into.setdefault(key, []).extend(values)
