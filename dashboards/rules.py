"""The alert and recording rules as you install them, with runbook links a notification can open.

`python -m dashboards.rules --runbook-base URL --out DIR` writes alerts.yml, whose every
`runbook_url` becomes URL#<anchor>, and recording.yml (unchanged) into DIR; without --out it
prints alerts.yml. URL is where docs/runbook.md is published (say your Git host's page for it).
The checked-in alerts.yml links docs/runbook.md relative to the repository root, which opens
nothing outside a checkout. The rendering is textual, so comments and YAML anchors survive.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from dashboards.outputs import outputs

RULES_DIR = Path(__file__).parent
ALERTS = RULES_DIR / "alerts.yml"
RECORDING = RULES_DIR / "recording.yml"
RUNBOOK = "docs/runbook.md"

_RUNBOOK_URL = re.compile(r'^(?P<key>\s*runbook_url:\s*)"(?P<base>[^"#]*)#(?P<anchor>[\w-]+)"[ \t]*$', re.M)
_UNSAFE = re.compile(r'[\s"\\#]')


def runbook_urls(alerts_text: str) -> list[tuple[str, str]]:
    """Every (base, anchor) pair an alerts.yml links its runbook with, in file order."""
    return [(m["base"], m["anchor"]) for m in _RUNBOOK_URL.finditer(alerts_text)]


def render_alerts(alerts_text: str, runbook_base: str) -> str:
    """alerts.yml with every runbook_url under ``runbook_base`` (the URL of runbook.md itself)."""
    if not runbook_base or _UNSAFE.search(runbook_base):
        raise ValueError(f"runbook base {runbook_base!r}: give the URL of runbook.md, without spaces, quotes or '#'")
    rendered, count = _RUNBOOK_URL.subn(lambda m: f'{m["key"]}"{runbook_base}#{m["anchor"]}"', alerts_text)
    if count == 0:
        raise ValueError("no runbook_url line to render")
    return f"# Rendered by `python -m dashboards.rules`: runbook links point at {runbook_base}\n" + rendered


def write_rules(out_dir: Path, runbook_base: str) -> list[Path]:
    """Write the rendered alerts.yml and recording.yml into ``out_dir``; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    alerts, recording = out_dir / ALERTS.name, out_dir / RECORDING.name
    alerts.write_text(render_alerts(ALERTS.read_text(encoding="utf-8"), runbook_base), encoding="utf-8")
    recording.write_text(RECORDING.read_text(encoding="utf-8"), encoding="utf-8")
    return [alerts, recording]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.rules", description=__doc__.splitlines()[0])
    parser.add_argument("--runbook-base", required=True, metavar="URL",
                        help="where docs/runbook.md is published, e.g. https://git.example.com/routescope/blob/main/docs/runbook.md")
    parser.add_argument("--out", type=Path, metavar="DIR", help="write alerts.yml and recording.yml here")
    args = parser.parse_args(argv)
    if args.out is not None:
        try:
            outputs().check_folder(args.out, "--out")
        except outputs().OutputPathError as exc:
            parser.exit(2, f"{parser.prog}: {exc}\n")
    try:
        if args.out is None:
            sys.stdout.write(render_alerts(ALERTS.read_text(encoding="utf-8"), args.runbook_base))
        else:
            paths, failed = outputs().write_folder_or_keep(
                args.out, lambda folder: write_rules(folder, args.runbook_base), "--out")
            for path in paths:
                print(path)
            if failed:
                print(f"{parser.prog}: {failed}", file=sys.stderr)
                return 1
    except ValueError as exc:
        parser.error(str(exc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
