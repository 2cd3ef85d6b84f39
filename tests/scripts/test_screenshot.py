"""scripts/screenshot.py, the README picture's maintained recipe: it refuses a bad --out before starting anything,
waits for a page with its whole picture, and writes the PNG chromium takes of the page (real headless chromium)."""

from __future__ import annotations

import importlib.util
import struct
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("routescope_screenshot", ROOT / "scripts" / "screenshot.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


shot = load()


@pytest.mark.parametrize("out", ["/proc/routescope-nope/s.png", "/tmp"])
def test_a_bad_out_is_refused_before_the_demo_starts(out, capsys):
    with pytest.raises(SystemExit) as exc:
        shot.main(["--out", out])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith(f"python scripts/screenshot.py: --out {out}: ") and "Traceback" not in err


@pytest.mark.parametrize("url", ["http://127.0.0.1:9", "notaurl"])
def test_a_url_without_a_page_is_refused_before_chromium_starts(url, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        shot.main(["--url", url, "--out", str(tmp_path / "s.png")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"python scripts/screenshot.py: --url {url}: no routescope page there (")
    assert not (tmp_path / "s.png").exists()


def test_ready_waits_for_the_whole_picture():
    doc = {"counts": [{"model": "a"}, {"model": "b"}], "decode_in_prefill": {"calls": 3}, "latency": [{}],
           "history": {"rates": [{"dt_s": 20.0}, {"dt_s": 25.0}]}, "advice": {"status": "ok"}}
    assert shot.ready(doc, settle_s=40)
    assert not shot.ready(doc, settle_s=60)  # too little time of rates
    assert not shot.ready({**doc, "decode_in_prefill": {"calls": 0}}, settle_s=40)
    assert not shot.ready({**doc, "advice": {"status": "no_table"}}, settle_s=40)


@pytest.mark.slow
@pytest.mark.skipif(shot.find_chromium() is None, reason="chromium (Debian package) is not installed")
def test_capture_writes_the_pages_png_at_the_size_asked(tmp_path):
    import time

    from dispatcher import Policy, what_if
    from service.routing import routing_view
    from service.settings import ServiceSettings
    from telemetry import Telemetry, TelemetryConfig
    from tests.advise.standin import RoutingStandIn

    with Telemetry(TelemetryConfig(models=("glm",)), platform=what_if("gfx942"), policy=Policy()) as tel:
        doc = routing_view(tel.snapshot(), demo=None, settings=ServiceSettings(), started_ts=time.time(),
                           advice=lambda d: None)
    out = tmp_path / "shot.png"
    with RoutingStandIn(doc) as server:
        shot.capture(server.url + "/", out, chromium=shot.find_chromium(), width=800, height=600)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (800, 600)  # IHDR: the window asked for
