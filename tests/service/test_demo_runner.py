"""The demo runner drives the real dispatcher and kernels; telemetry sees every call it makes."""

from __future__ import annotations

import itertools
import time

import pytest

from dispatcher import Dispatcher, GuardMode, Policy
from service.demo.runner import DemoRunner
from workloads.traffic import DEFAULT_SCENARIOS, GLM_FLASH, traffic, warm_up_calls
from telemetry import Telemetry, TelemetryConfig
from tests.service.held_demo import HeldWarmUp

MODELS = ("DeepSeek-V4.1-Flash", "GLM-5.3-Flash")


def run(n: int, *, glm_bug: bool = False, guard: GuardMode = GuardMode.OBSERVE, warm_up: bool | None = None,
        **config: object) -> tuple[DemoRunner, dict]:
    d = Dispatcher(policy=Policy(guard=guard))
    tel = Telemetry(TelemetryConfig(models=MODELS, **config), platform=d.platform, policy=d.policy)
    tel.instrument(d)
    r = DemoRunner(d, glm_bug=glm_bug, limit=n, duty=1.0, min_gap_s=0.0, warm_up=warm_up,
                   on_decode_path=lambda model, rows: tel.record_decode_path(rows, model))
    r.start()
    assert r.wait_done(120)
    snap = tel.snapshot()
    tel.close()
    return r, snap


def test_every_call_reaches_telemetry_once():
    r, snap = run(150)
    c = r.counts
    assert c.errors == 0, c.last_error
    assert c.prefill_calls + c.decode_path_calls == 150
    assert sum(x["calls"] for x in snap["counts"]) == c.prefill_calls
    assert sum(x["rows"] for x in snap["counts"]) == c.prefill_rows
    assert sum(x["calls"] for x in snap["decode_path"]) == c.decode_path_calls
    assert sum(x["rows"] for x in snap["decode_path"]) == c.decode_path_rows
    assert snap["decode_in_prefill"]["counts"] == []  # no bug, no decode rows in prefill
    assert {x["kernel"] for x in snap["counts"]} == {"intree.ragged_prefill"}  # a CPU takes no AITER branch


def test_counterfactuals_on_a_what_if_gfx942_follow_its_gate():
    """This CPU ran every call in-tree; telemetry says where the gfx942 gate would have sent each one."""
    gates = {"gfx942_512": 512, "gfx942_1024": 1024, "no_row_gate": 0}
    r, snap = run(150, counterfactual_arch="gfx942", counterfactuals=tuple(gates))
    assert {x["kernel"] for x in snap["counts"]} == {"intree.ragged_prefill"}
    for row in snap["would_route"]:  # exported buckets have the active gates (512, 1024) as edges
        low = int(row["rows_bucket"].split("-")[0].rstrip("+"))
        expect = "aiter.pa_prefill_sparse" if low >= gates[row["policy"]] else "intree.ragged_prefill"
        assert row["kernel"] == expect, row
    for policy in gates:
        assert sum(x["calls"] for x in snap["would_route"] if x["policy"] == policy) == r.counts.prefill_calls
    assert any(x["kernel"] == "aiter.pa_prefill_sparse" for x in snap["would_route"] if x["policy"] == "gfx942_512")


def test_glm_bug_shows_up_as_decode_in_prefill_for_glm_only():
    r, snap = run(150, glm_bug=True)
    dip = snap["decode_in_prefill"]["counts"]
    assert dip and {x["model"] for x in dip} == {GLM_FLASH.name}
    assert {x["call_class"] for x in dip} == {"pure_decode", "mixed"}
    assert sum(x["calls"] for x in dip) == r.counts.by_kind["pure_decode"] + r.counts.by_kind["mixed"]


def test_guard_reroute_sends_pure_decodes_to_split_k():
    r, snap = run(150, glm_bug=True, guard=GuardMode.REROUTE)
    kernels = {(x["kernel"], x["call_class"]) for x in snap["counts"]}
    assert ("intree.sparse_decode", "pure_decode") in kernels
    assert ("intree.ragged_prefill", "pure_decode") not in kernels
    assert snap["guard"]["rerouted"]


def test_guard_raise_is_counted_as_refused_and_the_demo_goes_on():
    r, snap = run(150, glm_bug=True, guard=GuardMode.RAISE)
    assert r.counts.refused > 0 and r.counts.errors == 0
    assert sum(x["calls"] for x in snap["guard"]["refused"]) == r.counts.refused
    assert sum(x["calls"] for x in snap["counts"]) == r.counts.prefill_calls


def test_stop_is_prompt_while_paced():
    r = DemoRunner(Dispatcher(), duty=0.25)
    r.start()
    time.sleep(1.0)
    t0 = time.monotonic()
    assert r.stop(timeout=15.0)
    assert time.monotonic() - t0 < 15.0
    assert r.state == "stopped" and r.counts.prefill_calls + r.counts.decode_path_calls > 0


def test_a_failing_dispatcher_is_counted_not_fatal():
    class Boom(Dispatcher):
        def __call__(self, *a, **kw):
            raise RuntimeError("kernel exploded")

    r = DemoRunner(Boom(), limit=40, duty=1.0, min_gap_s=0.0)
    r.start()
    assert r.wait_done(60)
    assert r.state == "finished"
    assert r.counts.errors > 0 and "kernel exploded" in r.counts.last_error


def test_info_states_the_scale():
    r = DemoRunner(Dispatcher(), limit=1)
    info = r.info()
    assert info["state"] == "not started" and info["device"] == "cpu" and info["scaled"] is True
    assert info["scale_factor"] == pytest.approx(4096)
    assert [s["model"] for s in info["shapes"]] == list(MODELS)
    with pytest.raises(ValueError, match="duty"):
        DemoRunner(Dispatcher(), duty=0.0)
    with pytest.raises(ValueError, match="warm_up_sample"):
        DemoRunner(Dispatcher(), warm_up_sample=-1)


@pytest.mark.parametrize("glm_bug,guard", [(False, GuardMode.OBSERVE), (True, GuardMode.RAISE)])
def test_warm_up_runs_each_class_once_before_the_traffic_and_telemetry_sees_none_of_it(glm_bug, guard):
    r, snap = run(120, glm_bug=glm_bug, guard=guard, warm_up=True)
    c = r.counts
    expected = warm_up_calls(itertools.islice(traffic(7, glm_bug=glm_bug), r.warm_up_sample),
                             max(sc.concurrency for sc in DEFAULT_SCENARIOS))
    assert c.warm_up_calls == len(expected) > 30 and c.warm_up_failed == 0 and c.warm_up_s is not None
    assert r.info()["warm_up"] == {"calls": c.warm_up_calls, "failed": 0, "seconds": c.warm_up_s}
    assert c.errors == 0 and c.prefill_calls + c.decode_path_calls + c.refused == 120  # the limit is the traffic's
    assert sum(x["calls"] for x in snap["counts"]) == c.prefill_calls  # telemetry: the traffic's calls, no more
    assert sum(x["rows"] for x in snap["counts"]) == c.prefill_rows
    assert sum(x["calls"] for x in snap["decode_path"]) == c.decode_path_calls
    assert sum(x["calls"] for x in snap["guard"]["refused"]) == c.refused  # warm-up refusals are not the demo's


def test_warm_up_is_on_by_default_only_on_a_gpu():
    assert DemoRunner(Dispatcher()).warm_up is False
    assert DemoRunner(Dispatcher()).info()["warm_up"] is None
    assert DemoRunner(Dispatcher(), device="cuda").warm_up is True  # nothing touches the GPU before start()
    assert DemoRunner(Dispatcher(), device="cuda", warm_up=False).warm_up is False


def test_state_is_warming_up_until_the_warm_up_ends():
    r = HeldWarmUp(Dispatcher(), limit=20, duty=1.0, min_gap_s=0.0, warm_up=True)
    r.start()
    try:
        deadline = time.monotonic() + 30
        while r.state != "warming up" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert r.state == "warming up" and r.running
        assert r.info()["warm_up"]["seconds"] is None and r.counts.prefill_calls == 0
    finally:
        r.go.set()
    assert r.wait_done(60) and r.state == "finished"
    assert r.counts.warm_up_calls > 0 and r.info()["warm_up"]["seconds"] is not None


def test_a_failing_warm_up_is_counted_and_the_traffic_runs():
    r = HeldWarmUp(Dispatcher(), limit=30, duty=1.0, min_gap_s=0.0, warm_up=True, fail=True)
    r.start()
    assert r.wait_done(60) and r.state == "finished"
    c = r.counts
    assert c.warm_up_calls == 0 and c.warm_up_failed > 30
    assert c.errors == 0 and c.prefill_calls + c.decode_path_calls == 30
