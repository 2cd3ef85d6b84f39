"""Every PromQL expression the dashboard runs, with Grafana's variables filled in.

Tests send these to a real Prometheus: all must parse, and against a live demo all must
return data. Substitution follows Grafana's Prometheus data source: a variable left at
"All" becomes its allValue `.*`; a chosen value is regex-escaped; several become `(a|b)`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dashboards.build import ANNOTATION_EXPR, FALLBACK, VARIABLES, build_dashboard

# Grafana's built-in interval variables, with values that suit a short test run.
BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m", "__range_s": "300"}

_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
_REGEX_SPECIAL = re.compile(r"[\\^$.|?*+()\[\]{}]")

Values = Mapping[str, str | Sequence[str]]


@dataclass(frozen=True)
class PanelQuery:
    panel_id: int
    panel: str
    ref_id: str
    template: str  # as written in the dashboard JSON
    expr: str  # variables substituted
    instant: bool

    @property
    def has_fallback(self) -> bool:
        """True when the query ends in `or on() vector(0)` (an event counter)."""
        return self.expr.endswith(FALLBACK)

    @property
    def core(self) -> str:
        """The expression without its `or on() vector(0)` fallback: real data only."""
        return self.expr[: -len(FALLBACK)] if self.has_fallback else self.expr


def _escape(value: str) -> str:
    # One backslash in the regex is two in a PromQL double-quoted string.
    return _REGEX_SPECIAL.sub(lambda m: "\\\\" + m.group(0), value)


def substitute(
    template: str,
    values: Values | None = None,
    *,
    variables: Sequence[str] = tuple(VARIABLES),
    builtins: Mapping[str, str] | None = None,
) -> str:
    """Fill in $var / ${var}; unknown names raise KeyError so a typo cannot hide."""
    values = values or {}
    builtin = {**BUILTINS, **(builtins or {})}

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name in builtin:
            return builtin[name]
        if name not in variables:
            raise KeyError(f"unknown dashboard variable ${name} in {template!r}")
        chosen = values.get(name)
        if chosen is None:
            return ".*"
        if isinstance(chosen, str):
            return _escape(chosen)
        return "(" + "|".join(_escape(v) for v in chosen) + ")"

    return _VAR.sub(repl, template)


def _panels(dashboard: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    out: list[Mapping[str, Any]] = []
    for p in dashboard.get("panels", []):
        out.append(p)
        out.extend(p.get("panels", []))  # panels nested in collapsed rows
    return out


def panel_queries(
    values: Values | None = None,
    *,
    dashboard: Mapping[str, Any] | None = None,
    builtins: Mapping[str, str] | None = None,
) -> list[PanelQuery]:
    """Every target of every panel, in dashboard order."""
    dashboard = dashboard if dashboard is not None else build_dashboard()
    names = [v["name"] for v in dashboard.get("templating", {}).get("list", [])]
    out = []
    for p in _panels(dashboard):
        for t in p.get("targets", []):
            out.append(
                PanelQuery(
                    panel_id=p["id"],
                    panel=p.get("title", ""),
                    ref_id=t.get("refId", ""),
                    template=t["expr"],
                    expr=substitute(t["expr"], values, variables=names, builtins=builtins),
                    instant=bool(t.get("instant")),
                )
            )
    return out


def variable_queries(values: Values | None = None) -> list[tuple[str, str, str]]:
    """(variable, series selector, label) behind each label_values() variable."""
    return [(name, substitute(sel, values), label) for name, (sel, label) in VARIABLES.items()]


def annotation_queries(values: Values | None = None) -> list[str]:
    return [substitute(ANNOTATION_EXPR, values)]
