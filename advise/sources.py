"""Where the traffic comes from: a running service's /routing, a multiprocess directory, or Prometheus over a range.

Each reader returns an ``advise.traffic.Traffic``; what a source cannot know (the span of a
multiprocess directory, decode rows per entry in Prometheus) it says in the traffic's notes.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from dispatcher.policy import Policy
from dispatcher.types import GuardMode

from .traffic import TRAFFIC_LABELS, Traffic, entries_from, fill_decode_rows, policy_from_dict, unknown_decode_rows

TRAFFIC_SERIES = {"routescope_traffic_calls_total": "calls", "routescope_traffic_rows_total": "rows",
                  "routescope_traffic_decode_rows_total": "decode_rows"}
_DURATION = re.compile(r"^(?:(\d+)(ms|s|m|h|d|w|y))+$")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
MIXED_ESTIMATE = ("decode rows of mixed calls are estimated: the source has them per kernel x model only "
                  "(routescope_decode_in_prefill_rows_total), so they are shared out over that pair's mixed "
                  "entries by calls")


class SourceError(RuntimeError):
    """The source could not be read, or holds no traffic aggregates."""


def duration_seconds(text: str) -> float:
    """A Prometheus duration (``1h``, ``7d``, ``1h30m``) in seconds; ValueError if it is not one."""
    text = text.strip()
    if not _DURATION.match(text):
        raise ValueError(f"{text!r} is not a Prometheus duration like 30m, 1h, 7d or 1h30m")
    return sum(int(n) * _UNIT_S[u] for n, u in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", text))


def _error_text(body: bytes) -> str:
    """An error reply in one line: the API's own message (Prometheus' ``error``, FastAPI's ``detail``), or what
    the reply is when it is not this API's JSON."""
    text = body.decode(errors="replace")
    try:
        doc = json.loads(text)
        text = str(doc.get("error") or doc.get("detail") or text) if isinstance(doc, dict) else text
    except json.JSONDecodeError:
        if text.lstrip().startswith("<"):
            return "an HTML page, not the JSON this API answers: is the URL right?"
    return " ".join(text.split())[:300]


def _get_json(url: str, timeout: float) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        raise SourceError(f"GET {url}: HTTP {exc.code}: {_error_text(exc.read()[:2000])}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise SourceError(f"GET {url}: {getattr(exc, 'reason', exc)}") from None
    except json.JSONDecodeError as exc:
        raise SourceError(f"GET {url}: not JSON ({exc.msg})") from None


# -- a running service -------------------------------------------------------------------------------------------

def routing_url(url: str) -> str:
    """``http://host:9475`` or ``.../`` means its /routing."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{url!r} is not an http(s) URL")
    if parts.path in ("", "/"):
        parts = parts._replace(path="/routing")
    return urllib.parse.urlunsplit(parts)


def traffic_from_routing(doc: Mapping, where: str) -> Traffic:
    """The traffic in a /routing document (telemetry's snapshot plus the service's facts)."""
    if "traffic" not in doc:
        raise SourceError(f"{where} has no `traffic`: this service's telemetry does not aggregate calls per shape "
                          "(top-k, layout, dtypes) yet, which advise needs")
    cf_platform = doc.get("counterfactual_platform") or {}
    service = doc.get("service") or {}
    entries = entries_from(doc["traffic"])
    notes = ()
    mixed: dict[tuple[str, str], float] = {}
    if unknown_decode_rows(entries):  # merged from several processes: per kernel x model only
        dip = (doc.get("decode_in_prefill") or {}).get("counts") or []
        mixed = {(r["kernel"], r["model"]): float(r.get("rows", 0)) for r in dip if r.get("call_class") == "mixed"}
        notes = (MIXED_ESTIMATE,)
    return Traffic(
        entries=fill_decode_rows(entries, mixed), notes=notes,
        platform_arch=str((doc.get("platform") or {}).get("arch", doc.get("arch", "unknown"))),
        active=policy_from_dict(doc.get("policy") or {}, name="active"),
        counterfactuals=tuple(policy_from_dict(c) for c in doc.get("counterfactuals") or []),
        counterfactual_arch=cf_platform.get("arch"),
        span_s=service.get("uptime_s") or None,
        span_note="the service's uptime" + (" (other processes' series may be older)"
                                            if (doc.get("scope") or {}).get("series") == "every process" else ""),
        source=where,
        demo=doc.get("demo"),
    )


def from_routing(url: str, *, timeout: float = 10.0) -> Traffic:
    where = routing_url(url)
    return traffic_from_routing(_get_json(where, timeout), where)


# -- a multiprocess directory ------------------------------------------------------------------------------------

def traffic_rows(samples: Iterable[tuple[str, Mapping[str, str], float]]) -> list[dict]:
    """(sample name, labels, value) of the traffic counters -> entry dicts, summed over rank and processes.

    Counts from increase() are fractional; calls are rounded and rows scaled with them, so the mean
    rows per call (what a call is priced at) stays the measured one.
    """
    merged: dict[tuple, dict] = {}
    for name, labels, value in samples:
        field = TRAFFIC_SERIES.get(name)
        if field is None:
            continue
        key = tuple(labels.get(k, "") for k in TRAFFIC_LABELS)
        row = merged.setdefault(key, {**dict(zip(TRAFFIC_LABELS, key)), "calls": 0.0, "rows": 0.0, "decode_rows": None})
        row[field] = (row[field] or 0.0) + value
    out = []
    for row in merged.values():
        calls = round(row["calls"])
        scale = calls / row["calls"] if row["calls"] else 0.0
        decode = None if row["decode_rows"] is None else round(row["decode_rows"] * scale)
        out.append({**row, "calls": calls, "rows": round(row["rows"] * scale), "decode_rows": decode})
    return out


def _policies(thresholds: Mapping[tuple, float], cf_info: Mapping[tuple, float], guard: GuardMode):
    by_policy: dict[str, dict[str, int]] = {}
    for (gate, policy), v in thresholds.items():
        by_policy.setdefault(policy, {})[gate] = int(v)
    active = Policy(**by_policy.get("active", {}), guard=guard, name="active")
    names = sorted({p for p, _ in cf_info} | (set(by_policy) - {"active"}))
    cfs = tuple(Policy(**{**by_policy.get("active", {}), **by_policy.get(n, {})}, guard=guard, name=n) for n in names)
    archs = {a for _, a in cf_info}
    return active, cfs, (archs.pop() if len(archs) == 1 else None)


def from_multiproc(path: str, *, span_s: float | None = None) -> Traffic:
    """Every process's series in a Prometheus multiprocess directory (telemetry's own readers)."""
    import os

    from telemetry.multiproc.merge import totals_from_families
    from telemetry.multiproc.reader import multiprocess_registry

    if not os.path.isdir(path):
        raise SourceError(f"multiprocess directory {path!r} does not exist")
    families = list(multiprocess_registry(path).collect())
    totals = totals_from_families(families)
    rows = traffic_rows((s.name, s.labels, s.value) for f in families for s in f.samples)
    if not rows and not totals.calls:
        raise SourceError(f"{path}: no routescope series in this directory")
    if not rows:
        raise SourceError(f"{path}: routescope's files hold no traffic series (routescope_traffic_calls_total): "
                          "telemetry there does not aggregate calls per shape yet")
    guard = GuardMode.REROUTE if any(totals.rerouted.values()) else GuardMode.OBSERVE
    active, cfs, cf_arch = _policies(totals.thresholds, totals.cf_info, guard)
    archs = sorted({k[1] for k in totals.build_info})
    entries = entries_from(rows)
    notes = [MIXED_ESTIMATE] if unknown_decode_rows(entries) else []
    if len(archs) > 1:
        notes.append(f"processes on several archs ({', '.join(archs)}): priced as {archs[0]}")
    mixed = {(k, m): float(v) for (k, m, cc), v in totals.dip_rows.items() if cc == "mixed"}
    return Traffic(
        entries=fill_decode_rows(entries, mixed), platform_arch=archs[0] if archs else "unknown",
        active=active, counterfactuals=cfs, counterfactual_arch=cf_arch, span_s=span_s,
        span_note="given by --span" if span_s else "unknown: the files do not say how long they counted (--span)",
        source=path, notes=tuple(notes + [f"guard mode inferred as {guard.value} (rerouted calls seen: "
                                          f"{'yes' if guard is GuardMode.REROUTE else 'none'})"]),
    )


# -- Prometheus --------------------------------------------------------------------------------------------------

class Prometheus:
    """Instant queries against a Prometheus server's HTTP API, at one evaluation time."""

    def __init__(self, url: str, *, at: float | str | None = None, timeout: float = 30.0) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{url!r} is not an http(s) URL")
        self.url = url.rstrip("/")
        self.at = at if at is not None else time.time()
        self.timeout = timeout

    def query(self, expr: str) -> list[dict]:
        q = urllib.parse.urlencode({"query": expr, "time": self.at})
        body = _get_json(f"{self.url}/api/v1/query?{q}", self.timeout)
        if body.get("status") != "success":
            raise SourceError(f"Prometheus refused {expr!r}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]["result"]

    def samples(self, expr: str, name: str = "") -> list[tuple[str, dict, float]]:
        return [(name, r["metric"], float(r["value"][1])) for r in self.query(expr)]


def from_prometheus(url: str, range_: str, *, at: float | str | None = None, selector: str = "",
                    timeout: float = 30.0) -> Traffic:
    """The traffic of the last ``range_`` before ``at`` (default now), by increase() over the range."""
    span = duration_seconds(range_)
    prom = Prometheus(url, at=at, timeout=timeout)
    sel = selector.strip().strip("{}")
    by = ", ".join(TRAFFIC_LABELS)

    def inc(metric: str, group: str) -> str:
        return f"sum by ({group}) (increase({metric}{{{sel}}}[{range_}]))"

    def last(metric: str, group: str) -> str:
        return f"max by ({group}) (max_over_time({metric}{{{sel}}}[{range_}]))"

    samples = []
    for metric in TRAFFIC_SERIES:
        samples += prom.samples(inc(metric, by), metric)
    rows = traffic_rows(samples)
    if not rows:
        raise SourceError(f"{url}: no routescope_traffic_calls_total over the last {range_}"
                          + (f" matching {{{sel}}}" if sel else ""))
    thresholds = {(m.get("gate", ""), m.get("policy", "")): v
                  for _, m, v in prom.samples(last("routescope_gate_threshold_rows", "gate, policy"))}
    cf_info = {(m.get("policy", ""), m.get("arch", "")): v
               for _, m, v in prom.samples(last("routescope_counterfactual_policy_info", "policy, arch"))}
    archs = sorted(m.get("arch", "") for _, m, _ in prom.samples(last("routescope_build_info", "arch")))
    rerouted = sum(v for _, _, v in prom.samples(inc("routescope_guard_rerouted_calls_total", "model")))
    guard = GuardMode.REROUTE if rerouted > 0 else GuardMode.OBSERVE
    active, cfs, cf_arch = _policies(thresholds, cf_info, guard)
    mixed = {(m.get("kernel", ""), m.get("model", "")): v for _, m, v in
             prom.samples(inc("routescope_decode_in_prefill_rows_total", "kernel, model, call_class"))
             if m.get("call_class") == "mixed"}
    entries = entries_from(rows)
    notes = ["counts are increase() over the range: Prometheus extrapolates them to the range's edges"]
    if unknown_decode_rows(entries):
        notes.append(MIXED_ESTIMATE)
    if len(archs) > 1:
        notes.append(f"series from several archs ({', '.join(archs)}): priced as {archs[0]}")
    notes.append(f"guard mode inferred as {guard.value}")
    return Traffic(
        entries=fill_decode_rows(entries, mixed),
        platform_arch=archs[0] if archs else "unknown", active=active, counterfactuals=cfs,
        counterfactual_arch=cf_arch, span_s=float(span), span_note=f"the range asked for ({range_})",
        source=f"{url} over {range_}" + (f" at {at}" if at is not None else "") + (f" {{{sel}}}" if sel else ""),
        notes=tuple(notes),
    )


# -- the demo's traffic generator --------------------------------------------------------------------------------

DECLARED_DEMO = "declared by --demo-shapes"


def as_demo(traffic: Traffic) -> Traffic:
    """The traffic of `routescope serve --demo`, said so by the caller (Prometheus and multiprocess files cannot
    tell): its models' calls are priced at the real models' shapes (the CPU demo runs them scaled down, rows per
    call real), and a platform without a table of its own gets the H200's, with the demo's what-if note.

    /routing knows its demo by itself; a traffic that already has one is returned as it is.
    """
    if traffic.demo is not None:
        return traffic
    from workloads.traffic import DEMO_MODELS

    demo = {"scaled": True, "shapes": [{"model": m.name} for m in DEMO_MODELS], "source": DECLARED_DEMO}
    return replace(traffic, demo=demo)


GENERATED = "none (generated, not run)"


def from_demo(calls: int, *, glm_bug: bool = False, seed: int = 7) -> Traffic:
    """The demo's first ``calls`` calls (workloads/traffic.py; both entries, the prefill entry's priced) at the real
    models' shapes: what `serve --demo` would route, generated without running a kernel; the demo's policies."""
    import itertools

    from workloads.traffic import DEMO_MODELS, traffic
    from telemetry.config import DEFAULT_COUNTERFACTUALS, counterfactual_policy

    from .traffic import ObservedCall, aggregate

    specs = {m.name: m for m in DEMO_MODELS}
    seen = [
        ObservedCall(c.model, "intree.ragged_prefill", c.rows, c.kind, c.decode_rows, specs[c.model].topk,
                     f"{specs[c.model].nope_head_dim}+{specs[c.model].rope_head_dim}")
        for c in itertools.islice(traffic(seed, glm_bug=glm_bug), calls) if c.entry == "prefill"
    ]
    active = Policy()
    return Traffic(
        entries=aggregate(seen, active.thresholds), platform_arch=GENERATED, active=active,
        counterfactuals=tuple(counterfactual_policy(s, active) for s in DEFAULT_COUNTERFACTUALS),
        counterfactual_arch="gfx942", span_s=None, span_note="generated calls: no wall time",
        source=f"the demo's traffic generator: its first {calls} calls, seed {seed}, GLM decode bug "
               f"{'on' if glm_bug else 'off'} (workloads/traffic.py)",
    )
