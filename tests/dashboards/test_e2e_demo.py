"""End to end: two `routescope serve --demo` processes, a real Prometheus, the rules, the dashboard.

Instance A runs the demo as it should, with an A/A experiment (`--experiment aa`); instance B runs it
with the seed's GLM bug (decode rows sent through the prefill entry) and as another rank. Prometheus scrapes both every
second and evaluates the rules every second. Every dashboard query must return data, and
DecodeInPrefill must fire for B and never for A. `routescope advise --prometheus` over a time
range reads both through Prometheus's HTTP API (and one of them by a selector): GLM's decode
rows in B's prefill kernel cost time, decodes to split-K save it. A's experiment follows the GET /experiments
contract, its series are scraped, the CLI reads and stops it over HTTP, and no page elsewhere can.

What this test assumes about the service CLI (match these, or change them here):
  routescope serve --demo --host 127.0.0.1 --port N --rank R [--demo-glm-bug] [--experiment aa --experiment-fraction F]
  (--rank sets the `rank` label; the two instances differ by port and rank)
  GET /readyz answers 200 once the demo runs; GET /metrics serves the metric contract
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from advise.report import AdviceOut
from advise.sources import MIXED_ESTIMATE
from routescope.cli import build_app
from service.experiment_models import ExperimentsOut
from tests.dashboards.e2e import (
    ADVICE_PANELS,
    RULE_FILES,
    decode_in_prefill,
    wait_decode_in_prefill,
    wait_panels_have_data,
)
from tests.promserver import free_port, start_prometheus

if importlib.util.find_spec("service") is None or importlib.util.find_spec("service.cli") is None:
    pytest.skip("service.cli does not exist yet: `routescope serve --demo` is needed for this test",
                allow_module_level=True)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
GLM_BUG_FLAG = "--demo-glm-bug"
READY_TIMEOUT = 90.0  # torch import and demo start on a busy 2-core machine
DATA_TIMEOUT = 60.0
FIRING_TIMEOUT = 90.0  # for: 30s, plus the first scrapes and rate windows
GLM, DSV = "GLM-5.3-Flash", "DeepSeek-V4.1-Flash"
ADVISE_RANGE_S = 30  # the range advise looks back over; scraped every second
ADVISE_SCRAPES = 15  # samples of a traffic series in the range before it is asked
AA_FRACTION = 0.1  # the A/A experiment on A: the most allowed, so its B arm has calls within seconds
SETTLED_S = 3.0  # how far back the advise queries look from: past any scrape still being ingested (1 s interval)


def _routescope() -> list[str]:
    script = Path(sys.executable).with_name("routescope")
    if script.exists():
        return [str(script)]
    found = shutil.which("routescope")
    return [found] if found else [sys.executable, "-c", "from routescope.cli import main; main()"]


class Service:
    """One `routescope serve --demo` subprocess in its own process group."""

    def __init__(self, workdir: Path, name: str, *, glm_bug: bool, rank: int, extra: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.instance = f"127.0.0.1:{self.port}"
        self.log = workdir / f"{name}.log"
        cmd = _routescope() + ["serve", "--demo", "--host", "127.0.0.1", "--port", str(self.port),
                               "--rank", str(rank)]
        if glm_bug:
            cmd.append(GLM_BUG_FLAG)
        cmd += extra
        env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
        self.cmd = cmd
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def routing(self) -> dict:
        with urllib.request.urlopen(f"http://{self.instance}/routing", timeout=10) as r:
            return json.loads(r.read())

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"{' '.join(self.cmd)} exited {self.proc.returncode}:\n{self.logs()}")
            try:
                with urllib.request.urlopen(f"http://{self.instance}/readyz", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise AssertionError(f"{self.instance} not ready within {timeout}s:\n{self.logs()}")

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)  # the group this test created
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def demo_stack(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("e2e")
    services: list[Service] = []
    try:
        good = Service(workdir, "good", glm_bug=False, rank=0, extra=("--experiment", "aa", "--experiment-fraction",
                                                                      str(AA_FRACTION)))
        services.append(good)
        bad = Service(workdir, "glm-bug", glm_bug=True, rank=1)
        services.append(bad)
        for s in services:
            s.wait_ready(READY_TIMEOUT)
        targets = {"routescope": [good.instance, bad.instance]}
        with start_prometheus(workdir / "prom", targets=targets, rule_files=RULE_FILES,
                              scrape_interval="1s", evaluation_interval="1s") as prom:
            prom.wait_for(lambda: all(t["health"] == "up" for t in prom.targets()) and len(prom.targets()) == 2,
                          timeout=30, what="both services scraped")
            yield prom, good, bad
    finally:
        for s in services:
            s.stop()


def test_every_panel_query_returns_data(demo_stack):
    prom, good, bad = demo_stack
    # Telemetry aggregates calls per shape (`traffic` in /routing), and the demo on this CPU is priced with the
    # H200 table (a what-if, said so): the advice row has data like every other panel.
    docs = [s.routing() for s in (good, bad)]
    assert all("traffic" in d for d in docs), [sorted(d) for d in docs]
    assert ADVICE_PANELS, "the dashboard has an Advice row"
    wait_panels_have_data(prom, timeout=DATA_TIMEOUT)
    assert set(prom.label_values("instance", "routescope_calls_total")) == {good.instance, bad.instance}
    assert set(prom.label_values("rank", "routescope_calls_total")) >= {"0", "1"}
    # On this CPU the demo's counterfactuals are decided on a what-if gfx942, so the counterfactual
    # panel shows where the gate would have sent the calls, not in-tree for every policy.
    would = prom.query("sum by (policy, kernel) (routescope_would_route_calls_total)")["result"]
    got = {(s["metric"]["policy"], s["metric"]["kernel"]) for s in would if float(s["value"][1]) > 0}
    assert {("gfx942_512", "aiter.pa_prefill_sparse"), ("no_row_gate", "aiter.pa_prefill_sparse")} <= got, got


def test_decode_in_prefill_fires_for_the_misrouted_instance_only(demo_stack):
    prom, good, bad = demo_stack
    alert = wait_decode_in_prefill(prom, bad.instance, states=("firing",), timeout=FIRING_TIMEOUT)
    assert alert["labels"]["severity"] == "critical"
    assert decode_in_prefill(prom, good.instance) == [], "the correctly routed instance must not alert"
    # Its pure-decode calls in prefill kernels are zero or absent, not merely slow to show.
    series = prom.query(
        f'sum(increase(routescope_decode_in_prefill_calls_total{{call_class="pure_decode", instance="{good.instance}"}}[5m]))'
    )["result"]
    assert not series or float(series[0]["value"][1]) == 0.0


def _scrapes(prom, selector: str) -> float:
    """The most samples any matching traffic series has in the advise range (0: none yet)."""
    got = prom.query(f"max(count_over_time(routescope_traffic_calls_total{{{selector}}}[{ADVISE_RANGE_S}s]))")["result"]
    return float(got[0]["value"][1]) if got else 0.0


def _advise(prom, at: float, *extra: str) -> AdviceOut:
    """`routescope advise --prometheus` in this process, at ``at``. The CPU demo's traffic carries its scaled-down
    shapes (top-k 32), which no table times, and Prometheus cannot tell it is the demo's: --demo-shapes says so,
    and --table h200 prices it as if on an H200 (the service's own advice does the same)."""
    res = CliRunner().invoke(build_app(), ["advise", "--prometheus", prom.url, "--range", f"{ADVISE_RANGE_S}s",
                                           "--at", f"{at:.3f}", "--table", "h200", "--demo-shapes", "--json", *extra])
    assert res.exit_code == 0, res.output
    return AdviceOut.model_validate(json.loads(res.output))


def test_advise_over_a_time_range_through_prometheus(demo_stack):
    prom, good, bad = demo_stack
    glm_pure = f'model="{GLM}", call_class="pure_decode", instance="{bad.instance}"'
    a_traffic = f'instance="{good.instance}"'
    prom.wait_for(lambda: min(_scrapes(prom, a_traffic), _scrapes(prom, glm_pure)) >= ADVISE_SCRAPES,
                  timeout=DATA_TIMEOUT, interval=1.0,
                  what=f"{ADVISE_SCRAPES} scrapes of A's traffic and B's GLM pure decodes in {ADVISE_RANGE_S}s")
    assert prom.query("routescope_traffic_decode_rows_total")["result"], "the exact decode-rows series is scraped"
    # Every query below asks about the same instant, one set of data: a scrape that started before an instant can
    # land in the TSDB after a query of it, so the instant is a few scrape intervals back, where nothing lands any more.
    at = time.time() - SETTLED_S
    both = _advise(prom, at)
    assert both.status == "ok" and both.source.kind == "prometheus" and both.source.span_s == ADVISE_RANGE_S
    assert both.tables[0].name == "h200-sweep-cupti" and both.target.what_if and both.target.platform_arch == "cpu"
    assert both.target.note.startswith("demo on cpu: priced as if on an NVIDIA H200")
    assert any("increase()" in n for n in both.notes)
    assert MIXED_ESTIMATE not in both.notes  # mixed batches' decode rows per entry, from the traffic counter
    models = {m.model: m for m in both.models}
    glm = {c.name: c for c in models[GLM].candidates}
    assert glm["fix_mixed"].moved_calls > 0  # there were mixed batches to price from their own decode rows
    dip = models[GLM].decode_in_prefill
    assert dip.calls > 0 and dip.cost.mid > 0 and dip.cost_per_hour.mid > 0
    assert glm["decodes_split_k"].moved_calls > 0 and glm["decodes_split_k"].saving.mid > 0
    assert models[DSV].decode_in_prefill.calls == 0

    # One instance by a selector: B's traffic has GLM's pure decodes in the prefill kernel; A's has none.
    only = {s: _advise(prom, at, "--selector", f'instance="{s.instance}"') for s in (good, bad)}
    for s, out in only.items():
        assert out.status == "ok" and f'instance="{s.instance}"' in out.source.where
    pure = {s: next(c for m in out.models if m.model == GLM for c in m.candidates if c.name == "decodes_split_k")
            for s, out in only.items()}
    assert pure[bad].moved_calls > 0 and pure[good].moved_calls == 0
    assert pure[bad].moved_calls == glm["decodes_split_k"].moved_calls  # every pure decode counted was B's
    for model, m in models.items():  # the two halves make the whole (each entry's count is rounded)
        halves = sum(x.calls for out in only.values() for x in out.models if x.model == model)
        assert abs(halves - m.calls) <= 0.02 * m.calls + 5, (model, halves, m.calls)


def test_the_demo_experiment_is_read_scraped_and_stopped_over_http(demo_stack):
    """GET /experiments's contract, the series in Prometheus and through promtool, the CLI over --url, a stop that
    only a loopback page may ask for, and no kill-switch alert for a person's stop."""
    prom, good, bad = demo_stack
    base = f"http://{good.instance}"
    e = prom.wait_for(lambda: next((x for x in httpx.get(f"{base}/experiments", timeout=10).json()["experiments"]
                                    if sum(c["calls_b"] for c in x["cells"]) > 0), None),
                      timeout=DATA_TIMEOUT, interval=1.0, what="calls on the A/A experiment's arm B")
    ExperimentsOut.model_validate({"experiments": [e]})
    assert (e["id"], e["candidate"], e["fraction"], e["state"], e["stop_reason"]) == ("aa", "aa", AA_FRACTION,
                                                                                      "running", None)
    assert all(c["kernel_a"] == c["kernel_b"] for c in e["cells"]) and set(e["saving"]) >= {"seconds", "low", "high"}
    assert httpx.get(f"http://{bad.instance}/experiments", timeout=10).json() == {"experiments": []}
    banner = f"experiment aa: candidate aa on 10% of the calls it routes differently; {base}/experiments"
    assert banner in good.log.read_text()
    routing = good.routing()
    assert [x["id"] for x in routing["experiments"]] == ["aa"]
    # the series: scraped by Prometheus from A only, and /metrics as a whole passes promtool
    prom.wait_for(lambda: prom.query('sum(routescope_experiment_calls_total{arm="b"})')["result"], timeout=30,
                  interval=1.0, what="routescope_experiment_calls_total scraped")
    assert set(prom.label_values("instance", "routescope_experiment_state")) == {good.instance}
    text = httpx.get(f"{base}/metrics", timeout=10).content
    out = subprocess.run([shutil.which("promtool") or "promtool", "check", "metrics"], input=text, capture_output=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    # the CLI reads it over HTTP
    cli = CliRunner()
    res = cli.invoke(build_app(), ["experiment", "status", "--url", base, "--json"])
    assert res.exit_code == 0 and [x["id"] for x in json.loads(res.output)["experiments"]] == ["aa"], res.output
    res = cli.invoke(build_app(), ["experiment", "report", "aa", "--url", base], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "B time / A time" in res.output, res.output
    # a page elsewhere cannot stop it: a foreign Host (DNS rebinding) and a foreign Origin are refused
    r = httpx.post(f"{base}/experiments/aa/stop", headers={"host": "rebound.example"}, timeout=10)
    assert r.status_code == 400
    r = httpx.post(f"{base}/experiments/aa/stop", headers={"origin": "http://evil.example"}, timeout=10)
    assert r.status_code == 403 and "evil.example" in r.json()["message"]
    assert httpx.get(f"{base}/experiments", timeout=10).json()["experiments"][0]["state"] == "running"
    res = cli.invoke(build_app(), ["experiment", "stop", "aa", "--url", base])
    assert res.exit_code == 0 and "experiment aa stopped (user)" in res.output, res.output
    (after,) = httpx.get(f"{base}/experiments", timeout=10).json()["experiments"]
    assert after["state"] == "stopped" and after["stop_reason"] == "user"
    # Prometheus sees the stop; a person's stop is not the kill switch, so the alert stays quiet
    prom.wait_for(lambda: prom.query('routescope_experiment_state{state="stopped", stop_reason="user"}')["result"],
                  timeout=30, interval=1.0, what="the stopped state scraped")
    time.sleep(2.5)  # two evaluations of the rules after it
    assert not [a for a in prom.alerts() if a["labels"].get("alertname") == "RoutescopeExperimentStopped"]
