"""Reference pages that must say what the code does: every telemetry setting in docs/telemetry.md's table,
the ``impl`` of a raised call and the omitted threshold in docs/metrics.md, and one account of the seed patch
and of vLLM 0.33.0's binding sites in docs/vllm.md."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from telemetry.config import TelemetryConfig

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def table_after(page: Path, heading: str) -> list[str]:
    """The first markdown table's rows after ``heading`` (header and rule included)."""
    lines = page.read_text().splitlines()
    at = lines.index(heading)
    rows: list[str] = []
    for line in lines[at + 1:]:
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    return rows


def first_cells(rows: list[str]) -> set[str]:
    """The backticked names in each row's first cell (a cell may name several: `a`, `b`)."""
    return {name for row in rows for name in re.findall(r"`([^`]+)`", row.split("|")[1])}


def row_of(page: Path, first_cell: str) -> str:
    (row,) = [line for line in page.read_text().splitlines() if line.startswith(f"| {first_cell} |")]
    return row


def test_every_telemetry_setting_is_in_the_configuration_table():
    documented = first_cells(table_after(DOCS / "telemetry.md", "### Configuration"))
    missing = [f.name for f in fields(TelemetryConfig) if f.name not in documented]
    assert not missing, f"docs/telemetry.md's configuration table lacks {missing}"


def test_the_impl_label_says_what_a_raised_call_carries():
    row = row_of(DOCS / "metrics.md", "`impl`")
    assert "raised" in row and "attempted" in row


def test_the_threshold_gauge_says_when_it_is_omitted():
    row = row_of(DOCS / "metrics.md", "`routescope_gate_threshold_rows`")
    assert "absent_gates" in row and "lacks" in row


def test_the_seed_patch_is_described_one_way():
    """The patch's own header says it is not the seed PR's code; the page must not say otherwise."""
    header = (ROOT / "tests" / "vllm_real" / "seed_gfx942.patch").read_text().split("diff --git")[0]
    assert "NOT the seed PR's code" in header
    text = (DOCS / "vllm.md").read_text()
    assert "as the seed PR wrote it" not in text
    assert "a patch this project\n  wrote, not the seed PR's code" in text


def test_no_page_or_double_names_a_binding_site_vllm_0_33_0_lacks():
    for path in (DOCS / "vllm.md", ROOT / "tests" / "vllm_plugin" / "doubles.py",
                 ROOT / "tests" / "vllm_plugin" / "conftest.py"):
        assert "rocm_aiter_mla_sparse_dsv4" not in path.read_text(), path
