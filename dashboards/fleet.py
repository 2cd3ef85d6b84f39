"""The fleet's Prometheus configs with their placeholders filled: a node's agent and the central receiver.

    python -m dashboards.fleet agent --central-url http://central:9090/api/v1/write --cluster mi325x-east \\
        --node gpu-node-1 --target localhost:9475 [--target ...] [--scrape-interval 15s] [--out FILE]
    python -m dashboards.fleet central --alertmanager alertmanager:9093 --rules-dir /etc/prometheus/rules/routescope \\
        [--evaluation-interval 15s] [--out FILE]

dashboards/prometheus-agent.yml and prometheus-central.yml ship with placeholders (CENTRAL_URL, CLUSTER, NODE,
NODE_TARGET; ALERTMANAGER, RULES_DIR). Rendering replaces those lines only, so comments stay; every value is checked
first and a rendered config holds no placeholder. Without --out the config goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.parse
from collections.abc import Sequence
from pathlib import Path

from dispatcher.outputs import OutputPathError, check_file, write_or_keep

HERE = Path(__file__).parent
AGENT = HERE / "prometheus-agent.yml"
CENTRAL = HERE / "prometheus-central.yml"
AGENT_PLACEHOLDERS = ("CENTRAL_URL", "CLUSTER", "NODE", "NODE_TARGET")
CENTRAL_PLACEHOLDERS = ("ALERTMANAGER", "RULES_DIR")

_DURATION = re.compile(r"^(\d+(ms|s|m|h))+$")
_HOST_PORT = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9._-]+):(\d{1,5})$")
_LABEL_VALUE_BAD = re.compile(r'["\\\n\r\t]')


def _line(text: str, pattern: str, replacement: str) -> str:
    """Replace the one line matching ``pattern`` (a placeholder line of the shipped file)."""
    out, n = re.subn(pattern, lambda m: m.group("key") + replacement, text, count=1, flags=re.M)
    if n != 1:
        raise ValueError(f"the shipped config has no line matching {pattern!r}")
    return out


def check_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or " " in url:
        raise ValueError(f"central URL {url!r}: give the remote-write endpoint, e.g. http://central:9090/api/v1/write")
    return url


def check_address(address: str, what: str) -> str:
    m = _HOST_PORT.match(address)
    if not m or not 1 <= int(m.group(2)) <= 65535:
        raise ValueError(f"{what} {address!r}: expected host:port (e.g. localhost:9475)")
    return address


def check_label(value: str, what: str) -> str:
    if not value.strip() or _LABEL_VALUE_BAD.search(value) or value != value.strip():
        raise ValueError(f"{what} {value!r}: a non-empty label value without quotes, backslashes or spaces at its ends")
    return value


def check_duration(value: str, what: str) -> str:
    if not _DURATION.match(value):
        raise ValueError(f"{what} {value!r}: a Prometheus duration such as 15s or 1m")
    return value


def _left(text: str, placeholders: Sequence[str]) -> list[str]:
    body = "\n".join(line.split("#", 1)[0] for line in text.splitlines())  # comments name the placeholders
    return [p for p in placeholders if re.search(rf"\b{p}\b", body)]


def render_agent(text: str, *, central_url: str, cluster: str, node: str, targets: Sequence[str],
                 scrape_interval: str | None = None) -> str:
    """prometheus-agent.yml for one node."""
    if not targets:
        raise ValueError("give at least one --target (the node's routescope endpoint, host:port)")
    targets = [check_address(t, "target") for t in targets]
    if len(set(targets)) != len(targets):
        raise ValueError(f"targets repeat: {targets} (each endpoint once, or every count doubles)")
    out = _line(text, r"^(?P<key>\s*- url: )CENTRAL_URL\s*$", json.dumps(check_url(central_url)))
    out = _line(out, r"^(?P<key>\s*cluster: )CLUSTER\s*$", json.dumps(check_label(cluster, "cluster")))
    out = _line(out, r"^(?P<key>\s*node: )NODE\s*$", json.dumps(check_label(node, "node")))
    out = _line(out, r'^(?P<key>\s*- targets: )\["NODE_TARGET"\]\s*$', json.dumps(targets))
    if scrape_interval is not None:
        out = _line(out, r"^(?P<key>\s*scrape_interval: )\S+\s*$", check_duration(scrape_interval, "scrape interval"))
        out = _line(out, r"^(?P<key>\s*scrape_timeout: )\S+\s*$", scrape_interval)
    return _finish(out, AGENT_PLACEHOLDERS, "agent")


def render_central(text: str, *, alertmanager: str, rules_dir: str | Path,
                   evaluation_interval: str | None = None) -> str:
    """prometheus-central.yml for the fleet's receiver."""
    rules = str(rules_dir).rstrip("/")
    if not rules or '"' in rules or "\n" in rules:
        raise ValueError(f"rules dir {rules_dir!r}: a directory path")
    out = _line(text, r'^(?P<key>\s*- targets: )\["ALERTMANAGER"\]\s*$',
                json.dumps([check_address(alertmanager, "alertmanager")]))
    out = _line(out, r"^(?P<key>\s*- )RULES_DIR/\*\.yml\s*$", json.dumps(f"{rules}/*.yml"))
    if evaluation_interval is not None:
        out = _line(out, r"^(?P<key>\s*evaluation_interval: )\S+\s*$",
                    check_duration(evaluation_interval, "evaluation interval"))
    return _finish(out, CENTRAL_PLACEHOLDERS, "central")


def _finish(text: str, placeholders: Sequence[str], which: str) -> str:
    left = _left(text, placeholders)
    if left:
        raise ValueError(f"placeholders left in the {which} config: {', '.join(left)}")
    return f"# Rendered by `python -m dashboards.fleet {which}` from dashboards/prometheus-{which}.yml\n" + text


def _write(text: str, out: Path | None, prog: str) -> int:
    """stdout, or ``out`` (checked before, kept aside in a temporary file if the write fails anyway)."""
    if out is None:
        sys.stdout.write(text)
        return 0
    where, failed = write_or_keep(out, text, "--out")
    if failed:
        print(f"{prog}: {failed}", file=sys.stderr)
        return 1
    print(f"wrote {where}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.fleet", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="which", required=True)
    agent = sub.add_parser("agent", help="a node's agent (dashboards/prometheus-agent.yml)")
    agent.add_argument("--central-url", required=True, help="the central store's remote-write endpoint")
    agent.add_argument("--cluster", required=True, help="the cluster label")
    agent.add_argument("--node", required=True, help="the node label")
    agent.add_argument("--target", action="append", required=True, metavar="HOST:PORT",
                       help="a routescope endpoint of this node (repeat for a port per rank)")
    agent.add_argument("--scrape-interval", help="default 15s")
    agent.add_argument("--out", type=Path, metavar="FILE")
    central = sub.add_parser("central", help="the fleet's receiver (dashboards/prometheus-central.yml)")
    central.add_argument("--alertmanager", required=True, metavar="HOST:PORT")
    central.add_argument("--rules-dir", required=True, help="where `python -m dashboards.rules --out` wrote the rules")
    central.add_argument("--evaluation-interval", help="default 15s")
    central.add_argument("--out", type=Path, metavar="FILE")
    args = parser.parse_args(argv)
    if args.out is not None:
        try:
            check_file(args.out, "--out")
        except OutputPathError as exc:
            parser.exit(2, f"{parser.prog}: {exc}\n")
    try:
        if args.which == "agent":
            text = render_agent(AGENT.read_text(encoding="utf-8"), central_url=args.central_url, cluster=args.cluster,
                                node=args.node, targets=args.target, scrape_interval=args.scrape_interval)
        else:
            text = render_central(CENTRAL.read_text(encoding="utf-8"), alertmanager=args.alertmanager,
                                  rules_dir=args.rules_dir, evaluation_interval=args.evaluation_interval)
    except ValueError as exc:
        parser.error(str(exc))
    return _write(text, args.out, parser.prog)


if __name__ == "__main__":
    raise SystemExit(main())
