"""The routescope Grafana dashboard, built as code with grafana-foundation-sdk.

`python -m dashboards.build` writes dashboards/routescope.json (checked in);
`python -m dashboards.build --check` exits 1 when that file is stale.
Every query reads the series of docs/metrics.md, or the recording rules of recording.yml;
the panels themselves are in dashboards/panels.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm

from dashboards.outputs import outputs
from dashboards.panels import (  # noqa: F401 - re-exported for tests and dashboards.queries
    DECODE_IN_PREFILL_THRESHOLD,
    DS,
    FALLBACK,
    FLUSH_LAG_THRESHOLD_SECONDS,
    ROWS,
)

OUTPUT = Path(__file__).with_name("routescope.json")
UID = "routescope"
TITLE = "routescope: sparse MLA prefill routing"

# name -> (label_values() series selector, label); chained so choices narrow.
# cluster and node are the labels a fleet's agents add (dashboards/prometheus-agent.yml); on a single Prometheus they
# have no values and stay at "All" (.*), which matches series without them.
VARIABLES: dict[str, tuple[str, str]] = {
    "cluster": ("routescope_calls_total", "cluster"),
    "node": ('routescope_calls_total{cluster=~"$cluster"}', "node"),
    "model": ('routescope_calls_total{cluster=~"$cluster", node=~"$node"}', "model"),
    "instance": ('routescope_calls_total{cluster=~"$cluster", node=~"$node", model=~"$model"}', "instance"),
    "rank": ('routescope_calls_total{cluster=~"$cluster", node=~"$node", model=~"$model", instance=~"$instance"}',
             "rank"),
    "kernel": ('routescope_calls_total{cluster=~"$cluster", node=~"$node", model=~"$model", instance=~"$instance"}',
               "kernel"),
}

ANNOTATION_EXPR = (
    'ALERTS{alertname=~"DecodeInPrefill|DecodeRowsInPrefill", alertstate="firing", '
    'cluster=~"$cluster", node=~"$node", instance=~"$instance"}'
)


def _variables() -> list[Any]:
    out: list[Any] = [db.DatasourceVariable("datasource").id("datasource").label("Prometheus").type("prometheus")]
    for name, (selector, label) in VARIABLES.items():
        out.append(
            db.QueryVariable(name)
            .id(name)
            .label(name)
            .datasource(DS)
            .query(f"label_values({selector}, {label})")
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .current(dm.VariableOption(selected=True, text="All", value="$__all"))
        )
    return out



def build_dashboard() -> dict[str, Any]:
    """The dashboard as the JSON-ready dict Grafana imports."""
    d = (
        db.Dashboard(TITLE)
        .uid(UID)
        .description("How sparse MLA prefill calls are routed to attention kernels (routescope).")
        .tags(["routescope", "rocm", "vllm", "attention"])
        .editable()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .time("now-1h", "now")
        .refresh("30s")
        .annotation(
            db.AnnotationQuery()
            .name("Decode-in-prefill alerts")
            .datasource(DS)
            .enable(True)
            .icon_color("red")
            .expr(ANNOTATION_EXPR)
        )
    )
    for v in _variables():
        d = d.with_variable(v)
    panel_id = 0
    for title, panels in ROWS:
        panel_id += 1
        d = d.with_row(db.Row(title).id(panel_id))
        for p in panels():
            panel_id += 1
            d = d.with_panel(p.id(panel_id))
    return json.loads(json.dumps(d.build(), cls=JSONEncoder))


def render(dashboard: dict[str, Any] | None = None) -> str:
    """The exact text of routescope.json."""
    return json.dumps(dashboard if dashboard is not None else build_dashboard(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.build", description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=OUTPUT, help="where to write the JSON (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs from a fresh build")
    args = parser.parse_args(argv)
    if not args.check:
        try:
            outputs().check_file(args.output, "--output")
        except outputs().OutputPathError as exc:
            parser.exit(2, f"{parser.prog}: {exc}\n")
    text = render()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            state = "is stale" if args.output.exists() else "does not exist"
            print(f"{args.output} {state}: run python -m dashboards.build --output {args.output}", file=sys.stderr)
            return 1
        print(f"{args.output} is up to date")
        return 0
    where, failed = outputs().write_or_keep(args.output, text, "--output")
    if failed:
        print(f"{parser.prog}: {failed}", file=sys.stderr)
        return 1
    print(f"wrote {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
