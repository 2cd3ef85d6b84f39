"""Plugin on before vLLM loads (as in a worker); real batches through vLLM 0.33.0's ROCm sparse MLA backend
in real ForwardContexts: counts, rows buckets, call classes, decode-in-prefill and decode-entry calls,
and telemetry's warning as a vLLM log line."""

from __future__ import annotations

import re

from .conftest import samples
from .test_loader import SITES

SCRIPT = "loader_before"
INTREE = "intree.ragged_prefill"
VLLM_LINE = re.compile(r"^\(\S+ pid=\d+\) (?P<level>[A-Z]+) \d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+\.py:\d+\] (?P<msg>.*)$")


def prepare(tmp):
    return {"ROUTESCOPE_VLLM": "1"}


def test_the_import_hook_waits_then_wraps_every_site_as_vllm_loads(run):
    assert run.data["state_before_import"] == "waiting"
    assert run.data["state"] == "observing"
    assert run.data["sites"] == {m: dict.fromkeys(sorted(s), True) for m, s in SITES.items()}


def test_calls_rows_and_buckets_are_exact(run):
    s = run.data["samples"]
    calls = {(lab["call_class"], lab["rows_bucket"], lab["kernel"], lab["impl"]): v
             for n, lab, v in s if n == "routescope_calls_total"}
    assert calls == {("mixed", "4-7", INTREE, "triton"): 2, ("pure_decode", "2-3", INTREE, "triton"): 2,
                     ("prefill", "4-7", INTREE, "triton"): 2}
    assert samples(s, "routescope_rows_total", call_class="mixed") == 12
    assert samples(s, "routescope_rows_total", call_class="pure_decode") == 6
    assert samples(s, "routescope_rows_total", call_class="prefill") == 9  # 5 prefill-only + 4 split off
    assert run.data["calls"] == 6 and run.data["errors"] == {} and run.data["mismatches"] == {}


def test_decode_in_prefill_classes_are_exact(run):
    s = run.data["samples"]
    assert samples(s, "routescope_decode_in_prefill_calls_total", call_class="mixed", kernel=INTREE) == 2
    assert samples(s, "routescope_decode_in_prefill_rows_total", call_class="mixed") == 4
    assert samples(s, "routescope_decode_in_prefill_calls_total", call_class="pure_decode", kernel=INTREE) == 2
    assert samples(s, "routescope_decode_in_prefill_rows_total", call_class="pure_decode") == 6
    assert samples(s, "routescope_decode_in_prefill_calls_total", call_class="prefill") == 0


def test_decode_entry_calls_are_exact(run):
    assert run.data["decode_calls"] == 2
    assert samples(run.data["samples"], "routescope_decode_path_calls_total") == 2
    assert samples(run.data["samples"], "routescope_decode_path_rows_total") == 5


def test_decode_in_prefill_warning_is_a_vllm_log_line(run):
    lines = [VLLM_LINE.match(line) for line in run.stdout.splitlines() if "decode rows in prefill" in line]
    assert len(lines) == 1 and lines[0] is not None, run.stdout[-3000:]
    assert lines[0]["level"] == "WARNING" and "mixed batch (2 decode rows of 6" in lines[0]["msg"]
    assert "decode rows in prefill" not in run.stderr  # not a second, bare line


def test_observing_line_names_no_threshold_for_the_absent_gfx942_branch(run):
    lines = [VLLM_LINE.match(line) for line in run.stdout.splitlines() if "routescope: observing" in line]
    assert len(lines) == 1 and lines[0] is not None, run.stdout[-3000:]
    msg = lines[0]["msg"]
    assert "gfx942: no aiter.pa_prefill_sparse branch" in msg
    assert "gfx942_min_rows" not in msg and "512" not in msg
    assert "gfx950: aiter.pa_sparse_prefill_opus from 1024 rows (vLLM's _GFX950_AITER_SPARSE_PREFILL_OPUS_MIN_QUERIES)" in msg


def test_no_threshold_is_exported_for_the_absent_gfx942_branch(run):
    gates = {(lab["gate"], lab["policy"]) for n, lab, _ in run.data["samples"] if n == "routescope_gate_threshold_rows"}
    assert ("gfx950_min_rows", "vllm") in gates
    assert ("gfx942_min_rows", "vllm") not in gates, "vLLM 0.33.0 has no gfx942 branch: no threshold to show"


def test_ragged_calls_carry_their_mean_row_width_as_top_k(run):
    widths = {lab["topk"] for n, lab, v in run.data["samples"] if n == "routescope_traffic_calls_total" and v}
    assert widths and "0" not in widths, widths
