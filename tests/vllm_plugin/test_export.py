"""Export from workers: the shared multiprocess directory (rank-labelled) and the per-rank port.
vLLM here is TEST DOUBLES; the telemetry and prometheus_client are real."""

from __future__ import annotations

import socket
import sys
import urllib.request

from prometheus_client import generate_latest

from dispatcher import what_if
from routescope.vllm import plugin
from telemetry.multiproc.reader import multiprocess_registry

from .conftest import Meta, prefill_args, telemetry


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_write_one_directory_the_service_can_read(vllm_doubles, tmp_path):
    shared = tmp_path / "mp"
    env = {"ROUTESCOPE_VLLM": "1", "ROUTESCOPE_TELEMETRY_MULTIPROC_DIR": str(shared)}
    d = vllm_doubles()
    for rank in (0, 1):  # one process here, so the two "workers" run one after the other
        sys.modules.pop("vllm.distributed", None)
        dist = __import__("vllm.distributed", fromlist=["x"])
        dist.TP_RANK = rank
        assert plugin.install(env=env, platform=what_if("gfx942")) in ("observing", "waiting")
        backend = d.backend()
        fc = d.fc()
        args, _ = prefill_args(16)
        with fc.set_forward_context({"l0": Meta(16, 16, 0, 0, 16)}):
            backend.forward_prefill(*args)
        tel = telemetry()
        tel.flush()
        tel.close()
        plugin.uninstall()
    text = generate_latest(multiprocess_registry(str(shared))).decode()
    for rank in ("0", "1"):
        line = next(l for l in text.splitlines() if l.startswith("routescope_decode_in_prefill_calls_total{")
                    and f'rank="{rank}"' in l)
        assert 'call_class="pure_decode"' in line and line.endswith(" 1.0")


def test_per_rank_port_serves_metrics(vllm_doubles):
    port = _free_port()
    d = vllm_doubles()
    dist = d.ops() and __import__("vllm.distributed", fromlist=["x"])
    dist.TP_RANK = 1
    env = {"ROUTESCOPE_VLLM": "1", "ROUTESCOPE_VLLM_PORT_BASE": str(port - 1), "ROUTESCOPE_VLLM_ADDR": "127.0.0.1"}
    plugin.install(env=env, platform=what_if("gfx942"))
    args, _ = prefill_args(8)
    d.backend().forward_prefill(*args)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        body = r.read().decode()
    assert 'routescope_calls_total{arch="gfx942",call_class="unknown"' in body and 'rank="1"' in body


def test_no_exporter_configured_is_said_once(vllm_doubles, caplog):
    d = vllm_doubles()
    plugin.install(env={"ROUTESCOPE_VLLM": "1"}, platform=what_if("gfx942"))
    with caplog.at_level("WARNING", logger="vllm.routescope"):
        for _ in range(3):
            args, _ = prefill_args(4)
            d.backend().forward_prefill(*args)
    assert sum("no export configured" in r.getMessage() for r in caplog.records) == 1
