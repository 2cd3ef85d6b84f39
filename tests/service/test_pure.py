"""Pure pieces: settings, 422 wording, the /routing view, the startup banner, the metrics chain."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter
from pydantic import ValidationError

from dispatcher.explain import ExplainRequest
from service.cli import banner
from service.errors import describe_errors
from service.metrics import ChainedCollector, render
from service.routing import routing_view
from service.settings import DEFAULT_PORT, ServiceSettings


def test_settings_defaults_are_safe():
    s = ServiceSettings()
    assert s.host == "127.0.0.1" and s.port == DEFAULT_PORT and s.demo is False
    assert s.policy().gfx942_min_rows == 512 and s.policy().gfx950_min_rows == 1024


def test_settings_from_env(monkeypatch):
    monkeypatch.setenv("ROUTESCOPE_PORT", "9999")
    monkeypatch.setenv("ROUTESCOPE_MODELS", "a, b,a")
    monkeypatch.setenv("ROUTESCOPE_GFX942_MIN_ROWS", "1024")
    s = ServiceSettings()
    assert s.port == 9999 and s.models == ["a", "b"] and s.policy().gfx942_min_rows == 1024
    monkeypatch.setenv("ROUTESCOPE_MODELS", '["x", "y"]')
    assert ServiceSettings().models == ["x", "y"]


def test_settings_model_set_adds_demo_models_when_the_demo_runs():
    assert ServiceSettings(models=["m"]).model_set() == ["m"]
    assert ServiceSettings(models=["m"], demo=True).model_set() == ["m", "DeepSeek-V4.1-Flash", "GLM-5.3-Flash"]


@pytest.mark.parametrize("kw", [dict(port=70000), dict(rank=-1), dict(demo_duty=0), dict(models=["m"] * 0 + [str(i) for i in range(65)])])
def test_settings_refuse_bad_values(kw):
    with pytest.raises(ValidationError):
        ServiceSettings(**kw)


def test_describe_errors_names_parameters():
    msg, items = describe_errors(
        [
            {"loc": ("query", "rows"), "msg": "Input should be a valid integer", "type": "int_parsing"},
            {"loc": ("query",), "msg": "Value error, give rows or query_lens", "type": "value_error"},
            {"loc": (), "msg": "odd", "type": "x"},
        ],
        ExplainRequest.model_fields,
    )
    assert msg.splitlines() == [
        "query parameter rows: Input should be a valid integer",
        "query parameter rows, query_lens: give rows or query_lens",  # the check's words, as the CLI says them
        "request: odd",
    ]
    assert [i["parameter"] for i in items] == ["rows", "rows, query_lens", None]


def test_routing_view_trims_and_orders_decisions_and_sums_decode_in_prefill():
    snapshot = {
        "decisions": [{"ts": float(i)} for i in range(10)],
        "decode_in_prefill": {
            "counts": [
                {"kernel": "aiter.pa_prefill_sparse", "model": "g", "call_class": "pure_decode", "calls": 3, "rows": 6},
                {"kernel": "intree.ragged_prefill", "model": "g", "call_class": "mixed", "calls": 1, "rows": 1},
            ],
            "first_occurrences": [],
        },
        "decode_path": [{"model": "d", "calls": 5, "rows": 9}, {"model": "g", "calls": 4, "rows": 4}],
        "rank": "3",
    }
    out = routing_view(snapshot, demo=None, settings=ServiceSettings(decisions=4), started_ts=100.0, version="v", now=130.0)
    assert [d["ts"] for d in out["decisions"]] == [9.0, 8.0, 7.0, 6.0]
    dip = out["decode_in_prefill"]
    assert (dip["calls"], dip["rows"]) == (4, 7)
    assert dip["by_model"] == [
        {"model": "d", "calls": 0, "decode_rows": 0, "decode_path_calls": 5, "share_of_decode_calls": 0.0},
        {"model": "g", "calls": 4, "decode_rows": 7, "decode_path_calls": 4, "share_of_decode_calls": 0.5},
    ]
    assert out["service"]["uptime_s"] == 30.0 and out["service"]["rank"] == "3" and out["demo"] is None
    assert snapshot["decisions"][0] == {"ts": 0.0}  # the input is not changed


def test_banner_prints_every_url_and_the_demo_scale():
    info = {"shapes": [{"model": "A"}, {"model": "B"}], "scaled": True, "scale_factor": 4096.0, "glm_bug": True, "device": "cpu"}
    lines = banner(ServiceSettings(), 9475, info)
    text = "\n".join(lines)
    for path in ("/", "/routing", "/metrics", "/docs"):
        assert f"http://127.0.0.1:9475{path}" in text
    assert "1/4096" in text and "GLM decode bug ON" in text and "not loopback" not in text
    assert "not loopback" in "\n".join(banner(ServiceSettings(host="0.0.0.0"), 1, None))


def test_chained_collector_skips_a_family_seen_twice_and_encodes_both_formats():
    a, b = CollectorRegistry(), CollectorRegistry()
    Counter("x", "x", registry=a).inc()
    Counter("x", "dup", registry=b).inc(5)
    Counter("y", "y", registry=b).inc(2)
    chain = ChainedCollector((lambda: a, lambda: None, lambda: b))
    body, ctype = render(chain, None)
    text = body.decode()
    assert ctype.startswith("text/plain") and "x_total 1.0" in text and "x_total 5.0" not in text and "y_total 2.0" in text
    body, ctype = render(chain, "application/openmetrics-text; version=1.0.0")
    assert ctype.startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")


def test_bound_socket_is_tcp_so_asyncio_sets_nodelay():
    """proto 0 would skip asyncio's TCP_NODELAY: every keep-alive response then waited 40 ms (delayed ACK)."""
    import asyncio
    import socket

    from service.cli import bind

    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    seen: list[int] = []

    async def main() -> None:
        async def handle(reader, writer):
            seen.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(handle, sock=sock)
        _, w = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.02)
        w.close()
        server.close()
        await server.wait_closed()

    assert sock.proto == socket.IPPROTO_TCP
    asyncio.run(main())
    assert seen and seen[0] != 0
