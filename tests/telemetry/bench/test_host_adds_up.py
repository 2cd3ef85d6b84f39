"""`bench host` prints a noise band: each median with half its interquartile range over the batches, and each
difference that matters (telemetry on the dispatcher call, tensors handed to the launcher, two launches against
one) as a paired median ± band that covers the difference of the printed medians, "(noise)" where the band is as
wide as it."""

from __future__ import annotations

import json
import re
import statistics

from typer.testing import CliRunner

from routescope.cli import build_app
from telemetry.bench.host import band, diff_cell, differences

LINE = re.compile(r"^(.+): (\S+) - (\S+) = ([+-]\d+\.\d) ± (\d+\.\d) µs( \(noise\))?$")


def test_the_printed_differences_add_up_on_this_machine():
    res = CliRunner().invoke(build_app(), ["bench", "host", "--rows", "2,16", "--batch", "2", "--batches", "5",
                                           "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout[res.stdout.index("{"):])
    us, bands = out["us_per_call"], out["band_us"]
    assert set(bands) == set(us) and all(b >= 0 for b in bands.values())
    assert {d["item"] for d in out["differences"]} >= {"dispatcher_telemetry_2", "dispatcher_telemetry_16"}
    for d in out["differences"]:
        assert abs(us[d["item"]] - us[d["minus"]] - d["us"]) <= d["band_us"] + 1e-9
        assert d["noise"] == (abs(d["us"]) <= d["band_us"])
    text = CliRunner().invoke(build_app(), ["bench", "host", "--rows", "2", "--batch", "2", "--batches", "5"],
                              env={"COLUMNS": "300"})
    assert text.exit_code == 0, text.output
    assert "decode rows in prefill" not in text.output  # the bench's own pure decodes are not a bug to warn about
    lines = [m for line in text.stdout.splitlines() if (m := LINE.match(line.strip()))]
    assert [m[2] for m in lines] == ["dispatcher_telemetry_2"]
    rows = {cells[0]: cells[1:] for line in text.stdout.splitlines() if line.startswith("│")
            and len(cells := [c.strip() for c in line.strip()[1:-1].split("│")]) == 4}
    for m in lines:  # the printed figures, each rounded to 0.1 µs, agree within the printed band
        item, minus, diff, width = m[2], m[3], float(m[4]), float(m[5])
        assert abs(float(rows[item][0]) - float(rows[minus][0]) - diff) <= width + 0.15
        assert bool(m[6]) == (abs(diff) <= width + 0.05)


def test_a_difference_inside_its_band_is_noise():
    times = {"dispatcher_2": [10.0, 11.0, 12.0, 10.5, 30.0], "dispatcher_telemetry_2": [11.0, 10.0, 13.0, 12.0, 10.0],
             "launch_decode_2": [5.0, 5.1, 5.0, 5.2, 5.1], "launch_decode_2_two_launches": [8.0, 8.1, 8.0, 8.2, 8.1]}
    got = {d["item"]: d for d in differences(times)}
    assert set(got) == {"dispatcher_telemetry_2", "launch_decode_2_two_launches"}
    tel, two = got["dispatcher_telemetry_2"], got["launch_decode_2_two_launches"]
    assert tel["minus"] == "dispatcher_2" and tel["noise"] and diff_cell(tel).endswith("(noise)")
    assert two["us"] == 3.0 and not two["noise"] and diff_cell(two) == f"+3.0 ± {two['band_us']:.1f} µs"
    for d in got.values():
        gap = statistics.median(times[d["item"]]) - statistics.median(times[d["minus"]]) - d["us"]
        assert abs(gap) <= d["band_us"]
    assert band([1.0, 2.0, 3.0, 4.0, 5.0]) == 1.0 and band([7.0]) == 0.0
