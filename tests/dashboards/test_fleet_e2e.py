"""A fleet end to end, on Prometheus's own distributed path: rank processes, agents, remote write, a central store.

Two nodes, each a `routescope serve --multiproc-dir DIR` over a directory that two rank processes write
(``fleet_worker.py``: real torch kernels, every call timed and kept; node ``gpu-b``'s ranks also send GLM pure
decodes through the prefill entry, the seed's bug). One Prometheus agent per node runs the shipped
dashboards/prometheus-agent.yml (rendered by dashboards.fleet, 1 s scrape) and remote-writes to one central
Prometheus that runs the shipped dashboards/prometheus-central.yml with the shipped rules (1 s evaluation) and
sends to a real Alertmanager (dashboards/alertmanager.yml, group timers 1 s) whose webhook posts to this test.
Everything listens on loopback on free ports and is stopped here.

The ranks make two waves of calls. Between them node ``gpu-a``'s agent is stopped and one of its ranks exits (its
files go into the directory's archive) for a new process; the second wave runs while the agent is down, and it
restarts on the same WAL. On the central store:

- calls per model x kernel x rows bucket equal the sum of the nodes' /routing counts, after each wave (the
  counts do not move between waves, so "the same instant" is any instant of that wait), across the restart;
- native ``histogram_quantile`` over the fleet is within 5% of the exact quantiles of every rank's samples;
- ``routescope advise --prometheus CENTRAL --selector 'cluster="..."'`` over the second wave is the sum of advise
  per node (the same queries per node) and matches the nodes' own counts of that wave, within what increase()
  extrapolates at the range's edges;
- every dashboard panel query answers with the ``cluster`` and ``node`` variables set;
- DecodeInPrefill fires from the central rules, reaches the webhook, and names gpu-b (never gpu-a);
- federation, the small-fleet path: a global Prometheus federating two node Prometheus servers (protobuf
  Accept, what --enable-feature=native-histograms asks for) holds the latency histogram native, with the same
  counts as the central store.

The remote-write cost per histogram mode is measured beside the fleet: three `serve --demo` processes, one per
``--histogram-mode``, each scraped by a shipped agent, and the ``both`` and ``native`` ones also by a text-scraping
agent (no native-histograms flag: what a Prometheus 3 without scrape_native_histograms reads). The test prints
each agent's bytes, samples and histograms sent per rank per second (docs/prometheus-grafana.md quotes them).
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from advise.report import AdviceOut
from dashboards.fleet import CENTRAL, render_central
from dashboards.queries import panel_queries
from dashboards.rules import write_rules
from routescope.cli import build_app
from telemetry.bench.quantiles import exact_quantile
from tests.amserver import WebhookReceiver, start_alertmanager
from tests.dashboards.alerting import RUNBOOK, am_config
from tests.dashboards.e2e import wait_panels_have_data
from tests.dashboards.fleet import SENT, Agent, Rank, agents, merge, stop_ranks
from tests.promserver import config_text, start_prometheus
from tests.service.live import Served

pytestmark = pytest.mark.slow

CLUSTER = "mi325x-test"
NODES = ("gpu-a", "gpu-b")
GLM_NODE = "gpu-b"
GLM = "GLM-5.3-Flash"
RANKS = 2  # per node
CALLS = 15  # per model and rows bucket, per rank and wave: 4 ranks x 2 waves = 120 samples a series
MAX_ROWS = 64
GLM_DECODES = 20  # per rank and wave on the GLM node
MIN_SAMPLES = 100
BOUND = 0.05
QUANTILES = (0.5, 0.9, 0.99)
KEY = ("kernel", "rows_bucket", "model", "clock")
HIST = "routescope_call_duration_seconds"
MODES = ("both", "native", "classic")
COST_WINDOW_S = 30.0
READY_TIMEOUT = 120.0
SYNC_TIMEOUT = 60.0
FIRING_TIMEOUT = 120.0  # for: 30s after the first decode counter lands, plus group_wait


def _serve(workdir: Path, name: str, *args: str) -> Served:
    return Served(*args, log=workdir / f"{name}.log", env={"ROUTESCOPE_ADVISE_TABLES": "h200"})


def _stop_all(served: list[Served]) -> None:
    """SIGTERM every service at once, then wait for each (each shuts its demo and telemetry down in parallel)."""
    for s in served:
        if s.proc.poll() is None:
            s.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30.0
    for s in served:
        with contextlib.suppress(subprocess.TimeoutExpired):
            s.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        s.stop()  # SIGKILL if it ignored the first signal


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("fleet")
    with contextlib.ExitStack() as stack:
        served: list[Served] = []
        stack.callback(_stop_all, served)
        # the cost measurement's demo services start first: they import torch while the rest starts
        demos = {mode: _serve(workdir, f"demo-{mode}", "--demo", "--histogram-mode", mode) for mode in MODES}
        served += demos.values()
        hook = stack.enter_context(WebhookReceiver())
        am = stack.enter_context(start_alertmanager(workdir / "am", config=am_config(hook)))
        rules = workdir / "rules"
        write_rules(rules, RUNBOOK.as_uri())
        central_cfg = render_central(CENTRAL.read_text(), alertmanager=f"127.0.0.1:{am.port}", rules_dir=rules,
                                     evaluation_interval="1s")
        central = stack.enter_context(start_prometheus(
            workdir / "central", config=central_cfg, features=("native-histograms",),
            extra_flags=("--web.enable-remote-write-receiver",)))
        write_url = f"{central.url}/api/v1/write"
        nodes = {}
        for i, node in enumerate(NODES):
            directory = workdir / node / "mp"
            directory.mkdir(parents=True)
            serve = _serve(workdir, f"serve-{node}", "--multiproc-dir", str(directory))
            served.append(serve)
            ranks = [Rank(directory, workdir, node=node, rank=r, calls=CALLS, max_rows=MAX_ROWS,
                          glm_decodes=GLM_DECODES if node == GLM_NODE else 0, seed=10 * i + r) for r in range(RANKS)]
            stack.callback(stop_ranks, ranks)
            nodes[node] = SimpleNamespace(serve=serve, ranks=ranks, samples={}, directory=directory, index=i)
        for n in nodes.values():
            n.serve.wait_ready(READY_TIMEOUT)
            for r in n.ranks:
                merge(n.samples, r.wait_wave())
        for s in demos.values():
            s.wait_ready(READY_TIMEOUT)
        node_agents = {node: Agent(workdir / f"agent-{node}", write_url, CLUSTER, node,
                                   [f"127.0.0.1:{n.serve.port}"]) for node, n in nodes.items()}
        cost_agents = {(mode, True): Agent(workdir / f"agent-cost-{mode}", write_url, "cost", f"{mode}-protobuf",
                                           [f"127.0.0.1:{demos[mode].port}"]) for mode in MODES}
        cost_agents.update({(mode, False): Agent(workdir / f"agent-cost-{mode}-text", write_url, "cost",
                                                 f"{mode}-text", [f"127.0.0.1:{demos[mode].port}"], native=False)
                            for mode in ("both", "native")})
        stack.enter_context(agents(*node_agents.values(), *cost_agents.values()))
        yield SimpleNamespace(central=central, am=am, hook=hook, nodes=nodes, agents=node_agents,
                              cost_agents=cost_agents, demos=demos, workdir=workdir, marks={})


def _routing_counts(fleet) -> dict[tuple[str, str, str], float]:
    """Calls per (model, kernel, rows bucket), summed over the nodes' /routing."""
    out: dict[tuple[str, str, str], float] = {}
    for n in fleet.nodes.values():
        for row in n.serve.get("/routing").json()["counts"]:
            key = (row["model"], row["kernel"], row["rows_bucket"])
            out[key] = out.get(key, 0.0) + row["calls"]
    return out


def _central_counts(fleet, extra: str = "") -> dict[tuple[str, str, str], float]:
    got = fleet.central.query(f'sum by (model, kernel, rows_bucket) (routescope_calls_total{{cluster="{CLUSTER}"{extra}}})')
    return {(r["metric"]["model"], r["metric"]["kernel"], r["metric"]["rows_bucket"]): float(r["value"][1])
            for r in got["result"]}


def _wait_synced(fleet, what: str) -> dict[tuple[str, str, str], float]:
    """Until the central store's counts equal the nodes' (nothing lost, nothing doubled); those counts. Both sides
    are read again at each probe: a node's /routing may be up to two flush intervals old (service/routing_cache.py),
    so a wave's last calls can reach it after they reach the central store."""
    last: dict = {}

    def synced() -> bool:
        last["want"], last["got"] = _routing_counts(fleet), _central_counts(fleet)
        return sum(last["want"].values()) > 0 and last["got"] == last["want"]

    try:
        fleet.central.wait_for(synced, timeout=SYNC_TIMEOUT, interval=0.5, what=what)
    except TimeoutError:
        want, got = last["want"], last["got"]
        diff = {k: (want.get(k), got.get(k)) for k in set(want) | set(got) if want.get(k) != got.get(k)}
        raise AssertionError(f"{what}: central differs from the nodes' /routing (node, central): {diff}") from None
    return last["want"]


def test_fleet_counts_equal_the_nodes_across_an_agent_restart(fleet):
    first = _wait_synced(fleet, "wave 1 on the central store")
    fleet.marks["cost_from"] = (time.monotonic(), {k: a.counters() for k, a in fleet.cost_agents.items()})
    per_node = {node: _central_counts(fleet, f', node="{node}"') for node in NODES}
    assert all(per_node.values()) and set(fleet.central.label_values("node", "routescope_calls_total")) >= set(NODES)
    time.sleep(3.0)  # a few flat scrapes before the second wave: the advise range starts here
    fleet.marks["before_wave2"] = time.time()
    fleet.agents["gpu-a"].stop()
    # gpu-a's rank 1 exits (its files go into the directory's archive) and a new process takes its place
    node_a = fleet.nodes["gpu-a"]
    node_a.ranks[1].stop()
    assert list(node_a.directory.glob("*archive*")), sorted(p.name for p in node_a.directory.iterdir())
    node_a.ranks[1] = Rank(node_a.directory, fleet.workdir, node="gpu-a", rank=1, calls=CALLS, max_rows=MAX_ROWS,
                           glm_decodes=0, seed=99, tag="-new")
    for n in fleet.nodes.values():
        for r in n.ranks:
            if not r.out.name.endswith("-new"):  # the new process makes its first wave by itself
                r.next_wave()
        for r in n.ranks:
            merge(n.samples, r.wait_wave())
    assert _central_counts(fleet, ', node="gpu-a"') == per_node["gpu-a"], "gpu-a's agent is down: nothing moved"
    fleet.agents["gpu-a"].start()
    second = _wait_synced(fleet, "wave 2 on the central store, gpu-a's agent restarted")
    assert sum(second.values()) > sum(first.values())
    fleet.marks.update(wave2=time.time(), counts1=first, counts2=second)


def test_native_quantiles_over_the_fleet_are_within_5_percent(fleet):
    merged: dict[tuple[str, ...], list[float]] = {}
    for n in fleet.nodes.values():
        merge(merged, n.samples)
    full = {k: v for k, v in merged.items() if len(v) >= MIN_SAMPLES}
    assert len(full) >= 10, {k: len(v) for k, v in merged.items()}
    assert fleet.central.query(f'count({HIST}_bucket{{cluster="{CLUSTER}"}})')["result"] == [], "native form only"
    bad, checked = [], 0
    for key, samples in sorted(full.items()):
        sel = ", ".join(f'{k}="{v}"' for k, v in zip(KEY, key))
        count = fleet.central.query(f'sum(histogram_count({HIST}{{cluster="{CLUSTER}", {sel}}}))')["result"]
        assert count and float(count[0]["value"][1]) == len(samples), (key, count, len(samples))
        for q in QUANTILES:
            got = fleet.central.query(f'histogram_quantile({q}, sum({HIST}{{cluster="{CLUSTER}", {sel}}}))')["result"]
            exported, exact = float(got[0]["value"][1]), exact_quantile(samples, q)
            checked += 1
            if abs(exported / exact - 1) > BOUND:
                bad.append((key, q, exported, exact))
    assert checked >= 30 and not bad, bad


def test_routing_quantiles_of_each_node_are_within_5_percent(fleet):
    """Each node's /routing (the page's source) merges its ranks' native buckets, archive included."""
    bad, checked = [], 0
    for node, n in fleet.nodes.items():
        rows = {tuple(row[k] for k in KEY): row for row in n.serve.get("/routing").json()["latency"]}
        for key, samples in n.samples.items():
            row = rows[key]
            assert row["samples"] == len(samples) and row["buckets"] == "native", (node, key, row)
            if len(samples) < MIN_SAMPLES // 2:
                continue
            for q in QUANTILES:
                got, exact = row[f"p{round(q * 100)}_s"], exact_quantile(samples, q)
                checked += 1
                if abs(got / exact - 1) > BOUND:
                    bad.append((node, key, q, got, exact))
    assert checked >= 30 and not bad, bad


def _advise(fleet, at: float, range_s: int, selector: str) -> AdviceOut:
    res = CliRunner().invoke(build_app(), ["advise", "--prometheus", fleet.central.url, "--range", f"{range_s}s",
                                           "--at", f"{at:.3f}", "--table", "h200", "--selector", selector, "--json"])
    assert res.exit_code == 0, res.output
    return AdviceOut.model_validate(json.loads(res.output))


def _figures(out: AdviceOut) -> dict[str, float]:
    """What advise says per model: calls, decode-in-prefill calls and cost, calls moved by decodes to split-K."""
    got: dict[str, float] = {}
    for m in out.models:
        got[f"{m.model} calls"] = m.calls
        got[f"{m.model} decode-in-prefill calls"] = m.decode_in_prefill.calls
        cost = m.decode_in_prefill.cost
        got[f"{m.model} decode-in-prefill cost"] = cost.mid if cost is not None else 0.0
        split = next(c for c in m.candidates if c.name == "decodes_split_k")
        got[f"{m.model} decodes to split-K moved calls"] = split.moved_calls
    return got


def test_advise_over_the_central_store_is_the_nodes_traffic_summed(fleet):
    assert "wave2" in fleet.marks, "runs after the restart test"
    time.sleep(3.0)  # flat scrapes after the second wave
    at = time.time() - 1.0
    range_s = math.ceil(at - fleet.marks["before_wave2"]) + 1
    whole = _advise(fleet, at, range_s, f'cluster="{CLUSTER}"')
    assert whole.status == "ok" and whole.tables[0].name == "h200-sweep-cupti"
    halves = [_figures(_advise(fleet, at, range_s, f'cluster="{CLUSTER}", node="{node}"')) for node in NODES]
    fleet_figures = _figures(whole)
    for name, value in fleet_figures.items():  # each traffic entry's increase() is rounded to calls apart per node
        summed = sum(h.get(name, 0.0) for h in halves)
        assert abs(summed - value) <= 0.02 * abs(value) + 2, (name, value, summed)
    assert fleet_figures[f"{GLM} decode-in-prefill calls"] > 0
    assert halves[NODES.index("gpu-a")].get(f"{GLM} decode-in-prefill calls", 0) == 0
    # against the nodes' own counts of the second wave: increase() extrapolates each series to the range's edges
    # by at most about one scrape interval on each side
    first, second = fleet.marks["counts1"], fleet.marks["counts2"]
    expected = {f"{m} calls": sum(v - first.get(k, 0.0) for k, v in second.items() if k[0] == m)
                for m in {k[0] for k in second}}
    expected[f"{GLM} decode-in-prefill calls"] = GLM_DECODES * RANKS  # the second wave's, all on gpu-b
    high = range_s / (range_s - 3)
    for name, want in expected.items():
        got = fleet_figures[name]
        assert want - 1 <= got <= want * high + 1, (name, got, want, range_s)


def test_every_panel_answers_with_cluster_and_node(fleet):
    for values in ({"cluster": CLUSTER}, {"cluster": CLUSTER, "node": GLM_NODE}):
        wait_panels_have_data(fleet.central, timeout=SYNC_TIMEOUT, fleet=True, values=values)


def test_latency_panels_answer_in_every_histogram_mode(fleet):
    """The demo rank of each mode, through the shipped agent: its latency panels answer on the central store."""
    latency = [q for q in panel_queries() if "call_duration" in q.expr]
    assert latency
    for mode in MODES:
        values = {"cluster": "cost", "node": f"{mode}-protobuf"}
        empty: list[str] = []

        def answered() -> bool:
            empty[:] = [q.expr for q in panel_queries(values) if "call_duration" in q.expr
                        and not [r for r in fleet.central.query(q.expr)["result"] if r["value"][1].lower() != "nan"]]
            return not empty

        try:
            fleet.central.wait_for(answered, timeout=SYNC_TIMEOUT, what=f"latency panels in mode {mode}")
        except TimeoutError:
            raise AssertionError(f"mode {mode}: latency panels without data:\n  " + "\n  ".join(empty)) from None


def test_decode_in_prefill_fires_from_the_central_rules_naming_the_node(fleet):
    def firing(received):
        return [(p, a) for _path, p in received for a in p["alerts"]
                if a["labels"].get("alertname") == "DecodeInPrefill" and a["status"] == "firing"]

    got = fleet.hook.wait_for(firing, timeout=FIRING_TIMEOUT, what="a firing DecodeInPrefill from the central rules")
    nodes = {a["labels"].get("node") for _p, a in firing(fleet.hook.received())}
    assert nodes == {GLM_NODE}, nodes
    labels = got[0][1]["labels"]
    assert labels["cluster"] == CLUSTER and labels["model"] == GLM and labels["severity"] == "critical", labels
    annotations = got[0][1]["annotations"]
    assert f"node {GLM_NODE}," in annotations["summary"], annotations
    assert annotations["runbook_url"] == f"{RUNBOOK.as_uri()}#decodeinprefill", annotations
    # the cost reads the advice gauges of the node's own service (ROUTESCOPE_ADVISE_TABLES=h200 there)
    assert annotations["cost"].startswith("Prediction from latency table h200-sweep-cupti"), annotations
    assert {a["labels"].get("node") for a in fleet.central.alerts()
            if a["labels"].get("alertname") == "DecodeInPrefill"} == {GLM_NODE}


def test_federation_keeps_native_histograms(fleet):
    """Two node Prometheus servers scrape the nodes; a global one federates both with the protobuf Accept header."""
    with contextlib.ExitStack() as stack:
        node_servers = []
        for node, n in fleet.nodes.items():
            cfg = json.loads(config_text(targets={"routescope": [f"127.0.0.1:{n.serve.port}"]}))
            cfg["global"]["external_labels"] = {"cluster": CLUSTER, "node": node}
            node_servers.append(stack.enter_context(start_prometheus(
                fleet.workdir / f"federated-{node}", config=json.dumps(cfg), features=("native-histograms",))))
        cfg = json.loads(config_text())
        cfg["scrape_configs"] = [{
            "job_name": "federate", "honor_labels": True, "metrics_path": "/federate",
            "params": {"match[]": ['{__name__=~"routescope_.+"}']},
            "static_configs": [{"targets": [f"127.0.0.1:{p.port}" for p in node_servers]}]}]
        world = stack.enter_context(start_prometheus(fleet.workdir / "global", config=json.dumps(cfg),
                                                     features=("native-histograms",)))
        want = fleet.central.query(f'sum by (node) (histogram_count({HIST}{{cluster="{CLUSTER}"}}))')["result"]
        want = {r["metric"]["node"]: r["value"][1] for r in want}
        assert set(want) == set(NODES)

        def same() -> bool:
            got = world.query(f"sum by (node) (histogram_count({HIST}))")["result"]
            return {r["metric"].get("node"): r["value"][1] for r in got} == want

        world.wait_for(same, timeout=SYNC_TIMEOUT, what="the global server holds both nodes' native histograms")
        assert world.query(f"count({HIST}_bucket)")["result"] == []
        p99 = world.query(f"histogram_quantile(0.99, sum by (node) ({HIST}))")["result"]
        assert {r["metric"]["node"] for r in p99 if r["value"][1] != "NaN"} == set(NODES)


def test_remote_write_cost_per_histogram_mode(fleet, capsys):
    """Bytes, samples and histograms each agent sent per rank (a demo process) per second, over the window from the
    first test to this one (at least COST_WINDOW_S)."""
    t0, before = fleet.marks.get("cost_from") or (time.monotonic(), {k: a.counters() for k, a in fleet.cost_agents.items()})
    time.sleep(max(0.0, COST_WINDOW_S - (time.monotonic() - t0)))
    after = {k: a.counters() for k, a in fleet.cost_agents.items()}
    span = time.monotonic() - t0
    rows = {}
    for (mode, native), a in fleet.cost_agents.items():
        d = {name: (after[(mode, native)][metric] - before[(mode, native)][metric]) / span
             for name, metric in SENT.items()}
        failed = sum(after[(mode, native)][m] for m in after[(mode, native)] if "failed" in m)
        assert failed == 0, (mode, native, after[(mode, native)])
        rows[(mode, native)] = d
    both, native, classic = rows[("both", True)], rows[("native", True)], rows[("classic", True)]
    assert native["histograms"] > 0 and both["histograms"] > 0 and classic["histograms"] == 0
    # classic sends each latency histogram as 28 float series (26 buckets, _count, _sum) where native sends one
    assert classic["samples"] > native["samples"] + 20 * native["histograms"] and classic["bytes"] > native["bytes"]
    assert rows[("native", False)]["histograms"] == 0 and rows[("native", False)]["bytes"] < rows[("both", False)]["bytes"]
    for (mode, nat), d in rows.items():  # series the central store holds for that rank (routescope's and `up`)
        node = f"{mode}-{'protobuf' if nat else 'text'}"
        got = fleet.central.query(f'count({{cluster="cost", node="{node}"}})')["result"]
        d["series"] = float(got[0]["value"][1]) if got else 0.0
    assert rows[("native", True)]["series"] < rows[("native", False)]["series"] < rows[("classic", True)]["series"]
    with capsys.disabled():
        print(f"\nremote write per rank per second (demo traffic, 1 s scrape, {span:.1f} s window):")
        print("  serve --histogram-mode | agent     | series | bytes/s | samples/s | histograms/s")
        for (mode, nat), d in rows.items():
            print(f"  {mode:22} | {'protobuf' if nat else 'text':9} | {d['series']:6.0f} | {d['bytes']:7.0f} | "
                  f"{d['samples']:9.1f} | {d['histograms']:12.1f}")
