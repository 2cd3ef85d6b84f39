"""Exposition formats for /metrics, chosen by the scraper's Accept header; native histograms go where they are read.

- protobuf first (``application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited``,
  what Prometheus 2.40+ asks for with ``--enable-feature=native-histograms``): delimited ``MetricFamily`` messages,
  the latency histogram native and classic in one message per series (``protobuf``);
- ``application/openmetrics-text; version=2.0.0``: OpenMetrics 2.0 text (prometheus_client), native and classic;
- OpenMetrics 1.0, ``text/plain`` or anything else: OpenMetrics 1.0 or text 0.0.4, classic buckets only.

The histogram mode (``both``, ``native``, ``classic``: telemetry.exposition.modes) then says which of those forms
each format carries.

Collectors yield prometheus_client families whose histogram series may carry one native sample beside the classic
ones (telemetry.native.native_histogram); the text formats that cannot carry it never see it (``classic_only``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import parse_version

from .modes import HistogramMode, shaped
from .text import TextEncoder, text_encoder

Encoder = Callable[[Collector], bytes]

PROTOBUF_CONTENT_TYPE = "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"

__all__ = ["PROTOBUF_CONTENT_TYPE", "Encoder", "HistogramMode", "classic_only", "join", "negotiate", "wants_protobuf"]

_EOF = b"# EOF\n"


class classic_only:  # noqa: N801 - reads as a function at the call site: encoder(classic_only(collector))
    """A collector's families without native-histogram samples: what a classic text exposition may hold."""

    def __init__(self, collector: Collector) -> None:
        self._collector = collector

    def collect(self) -> Iterator[Metric]:
        for fam in self._collector.collect():
            if fam.type in ("histogram", "gaugehistogram") and any(s.native_histogram for s in fam.samples):
                stripped = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                stripped.samples = [s for s in fam.samples if s.native_histogram is None]
                yield stripped
            else:
                yield fam


def _media_ranges(accept: str) -> list[tuple[float, int, str, dict[str, str]]]:
    """(q, position, type, params) per media range of an Accept header; q defaults to 1."""
    out = []
    for position, part in enumerate(accept.split(",")):
        tokens = [t.strip() for t in part.split(";")]
        if not tokens[0]:
            continue
        params = {}
        for token in tokens[1:]:
            if "=" in token:
                key, value = token.split("=", 1)
                params[key.strip().lower()] = value.strip().strip('"')
        try:
            q = float(params.pop("q", "1"))
        except ValueError:
            q = 0.0
        out.append((q, position, tokens[0].lower(), params))
    return out


def _is_protobuf(media: str, params: dict[str, str]) -> bool:
    return (media == "application/vnd.google.protobuf" and params.get("proto") == "io.prometheus.client.MetricFamily"
            and params.get("encoding") == "delimited")


def wants_protobuf(accept: str | None) -> bool:
    """Whether the protobuf exposition is the Accept header's most preferred format we serve."""
    ranges = sorted((r for r in _media_ranges(accept or "") if r[0] > 0), key=lambda r: (-r[0], r[1]))
    for _q, _pos, media, params in ranges:
        if _is_protobuf(media, params):
            return True
        if media in ("application/openmetrics-text", "text/plain", "*/*", "text/*", "application/*"):
            return False
    return False


def negotiate(accept: str | None, *, lines: TextEncoder | None = None,
              mode: HistogramMode | str = HistogramMode.BOTH) -> tuple[Encoder, str]:
    """(encoder, content type) for an Accept header; native histograms only in protobuf and OpenMetrics >= 2.0.

    ``lines``: the text encoder whose kept lines serve this collector (default: the process's one); a caller that
    encodes two collectors in turn gives each its own, so neither drops the other's lines. ``mode``: the histogram
    mode (telemetry.exposition.modes) the latency families are shaped to."""
    mode = HistogramMode(mode)
    if wants_protobuf(accept):
        from .protobuf import generate_delimited  # protobuf is imported only where it is served (never in vLLM)

        if mode is HistogramMode.BOTH:
            return generate_delimited, PROTOBUF_CONTENT_TYPE
        return (lambda collector: generate_delimited(shaped(collector, mode, native_format=True))), PROTOBUF_CONTENT_TYPE
    encoder, content_type = choose_encoder(accept or "")
    version = ""
    if content_type.startswith("application/openmetrics-text"):
        version = next((t.split("=", 1)[1] for t in content_type.split("; ") if t.startswith("version=")), "")
    if version and parse_version(version) >= (2, 0, 0):
        if mode is HistogramMode.BOTH:
            return encoder, content_type
        return (lambda collector: encoder(shaped(collector, mode, native_format=True))), content_type
    if encoder is generate_latest:
        encoder = lines if lines is not None else text_encoder()  # the same bytes; line heads kept between scrapes
    if mode is HistogramMode.BOTH:
        return (lambda collector: encoder(classic_only(collector))), content_type
    return (lambda collector: encoder(shaped(collector, mode, native_format=False))), content_type


def join(content_type: str, head: bytes, tail: bytes) -> bytes:
    """One exposition from two encoded in turn: delimited protobuf and text concatenate; OpenMetrics keeps one
    ``# EOF``, the tail's."""
    if content_type.startswith("application/openmetrics-text") and head.endswith(_EOF):
        head = head[:-len(_EOF)]
    return head + tail
