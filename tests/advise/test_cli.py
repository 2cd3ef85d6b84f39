"""`routescope advise` through typer: a /routing URL to JSON and a table; bad options exit 2 naming the option."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from advise.report import AdviceOut
from routescope.cli import build_app

from .fixtures import demo_entries, routing_doc
from .standin import RoutingStandIn

GLM = "GLM-5.3-Flash"


@pytest.fixture(scope="module")
def demo_url():
    with RoutingStandIn(routing_doc(demo_entries(steps=1500))) as server:
        yield server.url


def run(*args: str):
    return CliRunner().invoke(build_app(), ["advise", *args])


def test_json_from_a_routing_url(demo_url):
    res = run("--url", demo_url, "--json")
    assert res.exit_code == 0, res.output
    out = AdviceOut.model_validate(json.loads(res.output))
    assert out.status == "ok" and out.source.where == demo_url + "/routing" and out.source.span_s == 600.0
    glm = next(m for m in out.models if m.model == GLM)
    assert glm.decode_in_prefill.cost.mid > 0
    assert out.tables[0].provenance == "measured here" and out.target.what_if


def test_a_table_for_people(demo_url):
    res = run("--url", demo_url, "--model", GLM)
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "predicted" in text and "nothing here was measured" in text and "h200-sweep-cupti" in text
    assert "measured here" in text and "demo on cpu" in text and GLM in text and "DeepSeek" not in text
    assert "decode-in-prefill" in text and "--all shows every gate" in text
    # What the figures are of: the prefill-entry calls (the table's headers wrap, so their first words).
    assert "prefill-entry kernel" in text and "share of prefill-entry" in text


def test_a_published_table_on_request(demo_url):
    res = run("--url", demo_url, "--table", "gfx942", "--json", "--gates", "256,1024")
    out = AdviceOut.model_validate(json.loads(res.output))
    assert out.tables[0].provenance == "published, not measured here" and out.target.arch == "gfx942"
    names = {c.name for c in out.models[0].candidates}
    assert {"gfx942_256", "gfx942_1024"} <= names and "gfx942_64" not in names


@pytest.mark.parametrize("args, words", [
    ([], "give exactly one source"),
    (["--url", "http://x", "--multiproc-dir", "/tmp"], "give exactly one source"),
    (["--prometheus", "http://x"], "--prometheus needs --range"),
    (["--prometheus", "http://x", "--range", "5x"], "--range: '5x' is not a Prometheus duration"),
    (["--url", "http://x", "--range", "1h"], "--range, --at and --selector go with --prometheus"),
    (["--url", "http://x", "--span", "1h"], "--span goes with --multiproc-dir"),
    (["--url", "x:1"], "--url: 'x:1' is not an http(s) URL"),
    (["--url", "http://x", "--gates", "a,b"], "--gates takes comma-separated row counts"),
    (["--multiproc-dir", "/tmp", "--span", "2"], "--span: '2' is not a Prometheus duration"),
    (["--url", "http://x", "--demo-shapes"], "--demo-shapes goes with --prometheus or --multiproc-dir"),
    (["--multiproc-dir", "/nonexistent/mp"], "--multiproc-dir /nonexistent/mp is not a directory"),
    (["--multiproc-dir", "/etc/hostname"], "--multiproc-dir /etc/hostname is not a directory"),  # as serve says it
])
def test_bad_options_exit_2_naming_the_option(args, words):
    res = run(*args)
    assert res.exit_code == 2, res.output
    assert words in res.output


def test_a_bad_table_exits_2_naming_file_and_field(demo_url, tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"device": "NVIDIA H200", "results": [{"kernel": "intree.ragged_prefill"}]}))
    res = run("--url", demo_url, "--table", str(bad))
    assert res.exit_code == 2
    assert f"--table: {bad}: results[0].layout: Field required" in res.output


def test_an_unreachable_source_exits_1():
    res = run("--url", "http://127.0.0.1:9", "--json")
    assert res.exit_code == 1 and "GET http://127.0.0.1:9/routing" in res.output


def test_the_demo_generator_without_a_server():
    res = run("--demo-traffic", "600", "--demo-glm-bug", "--json")
    assert res.exit_code == 0, res.output
    out = AdviceOut.model_validate(json.loads(res.output))
    assert out.source.kind == "demo" and out.source.span_s is None and "generated" in out.target.note
    glm = next(m for m in out.models if m.model == GLM)
    assert glm.decode_in_prefill.cost.mid > 0 and glm.candidates[0].seconds_per_hour is None
    off = AdviceOut.model_validate(json.loads(run("--demo-traffic", "600", "--json").output))
    assert all(m.decode_in_prefill.calls == 0 for m in off.models)  # without the bug GLM decodes use the decode entry
    bad = run("--url", "http://x", "--demo-glm-bug")
    assert bad.exit_code == 2 and "--demo-glm-bug goes with --demo-traffic" in bad.output


def test_a_model_filter_that_keeps_nothing_is_refused_naming_the_models_seen():
    res = run("--demo-traffic", "100", "--model", "nosuch")
    assert res.exit_code == 2 and res.output.strip() == (
        "routescope advise: --model nosuch: not in the traffic (its models: DeepSeek-V4.1-Flash, GLM-5.3-Flash)")


def test_an_error_page_is_one_line_saying_what_answered():
    """A real HTTP server that is not routescope's (the standard library's, answering 404 with an HTML page)."""
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):  # noqa: ANN002, D102 - no request log in the test's output
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        res = run("--url", url)
    finally:
        server.shutdown()
        server.server_close()
    assert res.exit_code == 1 and res.output.strip() == (
        f"routescope advise: GET {url}/routing: HTTP 404: an HTML page, not the JSON this API answers: is the URL right?")


def _seconds(cell: str) -> float:
    value, unit = cell.split()[:2]
    return float(value) * {"s": 1.0, "ms": 1e-3, "µs": 1e-6}[unit]


@pytest.mark.parametrize("every", [False, True])
def test_each_printed_saving_is_the_printed_totals_difference(every):
    """A 10 µs saving between totals of 2.9 s: the totals carry the digits that show it (it printed 2.92 s against
    2.91 s beside a saving of 1.04 ms)."""
    res = CliRunner().invoke(build_app(), ["advise", "--demo-traffic", "3000", *(["--all"] if every else [])],
                             env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    tables, rows = [], None
    for line in res.stdout.splitlines():
        cells = [c.strip() for c in line.strip()[1:-1].split("│")] if line.startswith("│") else None
        if cells and cells[0] == "active":
            rows = {}
            tables.append(rows)
        if cells and rows is not None:
            rows[cells[0]] = cells
    assert len(tables) == 2  # one per model
    checked = 0
    for rows in tables:
        active = _seconds(rows["active"][2])
        for name, cells in rows.items():
            if name == "active" or not cells[3][0].isdigit() and not cells[3].startswith("-"):
                continue
            saving = _seconds(cells[3])
            assert abs((active - _seconds(cells[2])) - saving) <= 0.02 * abs(saving) + 1e-12, (name, cells)
            checked += saving != 0
    assert checked >= (10 if every else 2)
