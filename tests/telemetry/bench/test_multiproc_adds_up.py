"""`bench multiproc` prints figures that agree: each ratio is the printed routescope time over the printed
prometheus_client time (within their rounding), and the kill and recovery lines say what the JSON holds, in units."""

from __future__ import annotations

import pytest

from telemetry.bench.reliability import COLUMNS, run, scrape_cells, summary_lines


def _ms(cell: str) -> float:
    value, unit = cell.split()
    assert unit == "ms"
    return float(value)


def test_each_printed_ratio_is_the_printed_times_over_each_other():
    result = run(kills=0, repeats=0, processes=(2,), scrapes=1)
    assert result["kill_loss"] is None and result["recovery"] is None and summary_lines(result) == []
    assert [r["series"] for r in result["scrape"]] == ["classic", "native"]
    for r in result["scrape"]:
        row = scrape_cells(r)
        assert len(row) == len(COLUMNS) and COLUMNS[7] == COLUMNS[9] == "÷ p_c"
        stock = _ms(row[5])
        for time_col, ratio_col in ((6, 7), (8, 9)):
            ours, ratio = _ms(row[time_col]), float(row[ratio_col])
            low, high = (ours - 0.05) / (stock + 0.05), (ours + 0.05) / max(stock - 0.05, 1e-9)
            assert low - 0.005 <= ratio <= high + 0.005, (row[time_col], row[5], row[ratio_col])
        assert int(row[1]) == r["files"] and int(row[4]) == r["samples"] > 0
        assert row[2] == ("classic" if r["series"] == "classic" else "+native")


def test_the_kill_and_recovery_lines_carry_units_and_the_json_figures():
    result = {"kill_loss": {"kills": [{"lost": 1951}, {"lost": 3474}], "flush_interval_s": 1.0,
                            "lost_calls_median": 2712.5, "lost_calls_max": 3474, "lost_seconds_median": 0.2125,
                            "lost_seconds_max": 0.378, "exported_more_than_started": 0},
              "recovery": {"repeats": 1, "median_s": 0.514, "max_s": 0.514, "times_s": [0.514]}}
    kill, recovery = summary_lines(result)
    assert kill == ("kill -9 (2 kills, flush every 1 s): calls lost median 2712.5, max 3474; as seconds of that "
                    "worker's calls: median 0.21 s, max 0.38 s; kills that exported more calls than started: 0")
    assert recovery.startswith("corrupt live file to exact totals again: median 0.51 s, max 0.51 s over 1 corrupt "
                               "file (")
    result["kill_loss"].update(lost_seconds_median=None, lost_seconds_max=None)
    assert "as seconds" not in summary_lines(result)[0]


@pytest.mark.parametrize("repeats", [2, 5])
def test_recoveries_are_counted_in_the_plural(repeats):
    line = summary_lines({"recovery": {"repeats": repeats, "median_s": 0.5, "max_s": 0.6}})[0]
    assert f"over {repeats} corrupt files (" in line
