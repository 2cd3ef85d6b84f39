"""advise.tables: the shipped tables say where each figure comes from; a bad table names its file and field."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from advise.tables import MEASURED, PUBLISHED, TableError, load_table, shipped_path, sweep_to_table_doc

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "docs" / "benchmarks" / "h200-sweep-cupti.json"


def test_gfx942_table_is_the_seed_published_figures_each_cited():
    doc = json.loads(shipped_path("gfx942").read_text())
    t = load_table("gfx942")
    assert t.meta.arch == "gfx942" and t.meta.provenance == PUBLISHED and not t.meta.measured_here
    for item in doc["points"] + doc["ratios"]:
        assert item["provenance"] == PUBLISHED
        assert "seed PR" in item["source"]
    abs_points = {(p["kernel"], p["rows"]): p["us"] for p in doc["points"]}
    assert abs_points == {  # the seed PR's A/B comment: 16 heads, D=512, top-k 2048 on an MI325X
        ("aiter.pa_prefill_sparse", 2): 293.0, ("aiter.pa_prefill_sparse", 16): 294.0,
        ("aiter.pa_prefill_sparse", 16384): 8780.0, ("intree.sparse_decode", 2): 32.0,
        ("intree.sparse_decode", 16): 36.0, ("intree.sparse_decode", 16384): 12330.0,
    }
    ratios = {(r["rows"], r["topk"]): r["ratio"] for r in doc["ratios"]}
    assert ratios[(256, 128)] == 1.04 and ratios[(512, 2048)] == 0.46 and ratios[(2048, 512)] == 0.39
    assert len(ratios) == 12
    assert {k[2] for k in t.series} == {"448+64", "512+0"}  # D=512: both production layouts


def test_h200_table_is_the_sweep_in_docs_measured_here():
    shipped = json.loads(shipped_path("h200").read_text())
    again = sweep_to_table_doc(json.loads(SWEEP.read_text()), name=shipped["name"], date=shipped["date"],
                               commit=shipped["commit"], source=shipped["source"],
                               file="docs/benchmarks/h200-sweep-cupti.json")
    assert again == shipped, "advise/data/h200-sweep-cupti.json is stale against docs/benchmarks/h200-sweep-cupti.json"
    t = load_table("h200")
    assert (t.meta.device, t.meta.arch, t.meta.provenance) == ("NVIDIA H200", "sm90", MEASURED)


def test_a_sweep_json_loads_as_it_is():
    direct = load_table(str(SWEEP))
    shipped = load_table("h200")
    key = ("intree.sparse_decode", 2048, "512+0", "bfloat16", "bfloat16")
    assert direct.series[key].rows == shipped.series[key].rows
    flat = [v for point in direct.series[key].values for v in point]
    assert flat == pytest.approx([v for point in shipped.series[key].values for v in point], rel=1e-4)
    assert direct.meta.date == "not recorded in the file" and direct.meta.provenance == MEASURED


def _gfx942() -> dict:
    return json.loads(shipped_path("gfx942").read_text())


def _sweep() -> dict:
    return json.loads(SWEEP.read_text())


def _set(path, value):
    def change(doc):
        target = doc
        for p in path[:-1]:
            target = target[p]
        if value is KeyError:
            del target[path[-1]]
        else:
            target[path[-1]] = value
        return doc
    return change


def _dup(doc):
    doc["points"].append(copy.deepcopy(doc["points"][0]))
    return doc


BAD = [
    (_gfx942, _set(["format"], KeyError), "format", "missing"),
    (_gfx942, _set(["points", 1, "rows"], -3), "points[1].rows", "greater than 0"),
    (_gfx942, _set(["points", 0, "source"], KeyError), "points[0].source", "required"),
    (_gfx942, _set(["points", 0, "kernel"], "aiter.flash"), "points[0].kernel", "aiter.pa_prefill_sparse"),
    (_gfx942, _set(["points", 0, "low_us"], 400.0), "points[0]", "low_us <= us"),
    (_gfx942, _set(["points", 2, "layout"], "256+0"), "points[2].layout", "not one of the table's layouts"),
    (_gfx942, _set(["layouts"], ["512"]), "layouts[0]", "NOPE+ROPE"),
    (_gfx942, _set(["provenance"], "measured"), "provenance", "published, not measured here"),
    (_gfx942, _set(["ratios", 0, "over"], "aiter.pa_prefill_sparse"), "ratios[0].over", "two kernels"),
    (_gfx942, _dup, "points[6].rows", "a second value at rows 2"),
    (_sweep, _set(["results", 2, "median_us"], KeyError), "results[2].median_us", "required"),
    (_sweep, _set(["results", 0, "layout"], "dsv4"), "results[0].layout", "NOPE+ROPE"),
    (_sweep, _set(["device"], "Some GPU"), "device", "unknown"),
    (_sweep, _set(["results"], []), "results", "at least 1"),
]


@pytest.mark.parametrize("base, change, where, words", BAD, ids=[w for _, _, w, _ in BAD])
def test_a_bad_table_names_its_file_and_field(tmp_path, base, change, where, words):
    path = tmp_path / "bad-table.json"
    path.write_text(json.dumps(change(base())))
    with pytest.raises(TableError) as err:
        load_table(str(path))
    assert err.value.file == str(path) and err.value.where == where, str(err.value)
    assert words in err.value.problem
    assert str(err.value).startswith(f"{path}: {where}: ")


def test_not_json_and_missing_files(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{"format": ')
    with pytest.raises(TableError, match=r"t\.json: line 1 column 12: not JSON"):
        load_table(str(path))
    with pytest.raises(TableError, match=r"nothing\.json: \(file\): no such file"):
        load_table(str(tmp_path / "nothing.json"))
    path.write_text('{"points": []}')
    with pytest.raises(TableError, match="format: missing"):
        load_table(str(path))
