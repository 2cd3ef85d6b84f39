"""The classic text exposition (format 0.0.4), byte for byte what ``prometheus_client.generate_latest`` writes, cheaper.

``generate_latest`` checks and escapes every label name and value of every sample at every scrape, which makes
the text cost most of a multiprocess ``/metrics``. Here a sample's line up to its value is built once for a
(name, labels dict) and reused while the collector yields the same dict again: the multiprocess reader
(telemetry.multiproc.families) keeps one labels dict per series between scrapes, so a scrape writes only values,
and a series whose value did not move gets its whole line again. A labels dict a collector builds afresh each time is found by its items instead (one tuple a sample). Only the
lines of the last scrape are kept.
"""

from __future__ import annotations

import gc
import math
import threading
from functools import cache
from typing import Any

from prometheus_client.openmetrics.exposition import UNDERSCORES, escape_label_name, escape_metric_name
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

_OM_ONLY = ("_created", "_gsum", "_gcount")  # OpenMetrics samples that the 0.0.4 text moves into gauges at the end
_TYPES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}


def _label_value(v: str) -> str:
    if "\\" in v or "\n" in v or '"' in v:
        return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return v


class TextEncoder:
    """``encoder(collector) -> bytes``; thread-safe (concurrent scrapes share the lines of the last one)."""

    def __init__(self) -> None:
        # (name, id(labels)) -> (labels, line head, value, timestamp, line): a series whose value did not move
        # since the last scrape gets its line again
        self._lines: dict[tuple[str, int], tuple[Any, str, Any, Any, str]] = {}
        self._heads: dict[tuple[str, tuple], str] = {}  # (name, labels' items) -> line head, for fresh dicts
        self._label_names: dict[str, str] = {}
        self._lock = threading.Lock()

    def _head(self, name: str, labels: dict[str, str]) -> str:
        if not labels:
            return f"{escape_metric_name(name, UNDERSCORES)} "
        names = self._label_names
        parts = []
        for k, v in sorted(labels.items()):
            ek = names.get(k)
            if ek is None:
                ek = names[k] = escape_label_name(k, UNDERSCORES)
            parts.append(f'{ek}="{_label_value(v)}"')
        return f"{escape_metric_name(name, UNDERSCORES)}{{{','.join(parts)}}} "

    def __call__(self, collector: Collector) -> bytes:
        """The exposition; the garbage collector held off meanwhile (tens of thousands of lines kept for the next
        scrape would otherwise trigger collections that walk every object of the process)."""
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._encode(collector)
        finally:
            if collecting:
                gc.enable()

    def _encode(self, collector: Collector) -> bytes:
        old, old_heads = self._lines, self._heads
        new: dict[tuple[str, int], tuple[Any, str, Any, Any, str]] = {}
        new_heads: dict[tuple[str, tuple], str] = {}
        output: list[str] = []

        def line(s: Any) -> str:
            key = (s.name, id(s.labels))
            got = old.get(key)
            value, timestamp = s.value, s.timestamp
            if got is None or got[0] is not s.labels:
                content = (s.name, tuple(s.labels.items()))  # a dict made afresh with the same labels
                head = old_heads.get(content)
                if head is None:
                    head = self._head(s.name, s.labels)
                new_heads[content] = head
                got = (s.labels, head, None, None, "")
            elif got[2] == value and got[3] == timestamp and type(got[2]) is type(value) and (
                    value or math.copysign(1.0, value) == math.copysign(1.0, got[2])):  # 0.0 and -0.0 read apart
                new[key] = got  # the same series with the same value: the same line
                return got[4]
            ts = "" if timestamp is None else f" {int(float(timestamp) * 1000):d}"
            text = f"{got[1]}{floatToGoString(value)}{ts}\n"
            new[key] = (got[0], got[1], value, timestamp, text)
            return text

        for metric in collector.collect():
            try:
                mname, mtype = metric.name, metric.type
                if mtype == "counter":
                    mname += "_total"
                elif mtype == "info":
                    mname += "_info"
                mtype = _TYPES.get(mtype, mtype)
                doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
                escaped = escape_metric_name(mname, UNDERSCORES)
                output.append(f"# HELP {escaped} {doc}\n# TYPE {escaped} {mtype}\n")
                om: dict[str, list[str]] = {}
                prefix = metric.name
                for s in metric.samples:
                    n = s.name
                    if n.startswith(prefix) and n[len(prefix):] in _OM_ONLY:
                        om.setdefault(n[len(prefix):], []).append(line(s))
                    else:
                        output.append(line(s))
            except Exception as exception:
                exception.args = (exception.args or ("",)) + (metric,)
                raise
            for suffix, lines in sorted(om.items()):
                escaped = escape_metric_name(metric.name + suffix, UNDERSCORES)
                output.append(f"# HELP {escaped} {doc}\n# TYPE {escaped} gauge\n")
                output.extend(lines)
        with self._lock:
            self._lines, self._heads = new, new_heads
        return "".join(output).encode("utf-8")


@cache
def text_encoder() -> TextEncoder:
    """The process's one text encoder, made at first use (its lines serve every /metrics of the process)."""
    return TextEncoder()
