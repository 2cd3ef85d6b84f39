"""The histogram mode: which forms of the latency histogram an exposition carries (``both``, ``native``, ``classic``).

A latency series is one native histogram (telemetry.native) and 26 classic ``_bucket`` series plus ``_count`` and
``_sum``. Remote write, a fleet's store and its bill grow with series, so a fleet that stores native histograms has
no use for the classic copy:

- ``both``: each exposition carries what its format can (native and classic in protobuf and OpenMetrics 2.0;
  classic in OpenMetrics 1.0 and text 0.0.4);
- ``native``: protobuf and OpenMetrics 2.0 carry the native histogram alone. OpenMetrics 1.0 and text 0.0.4 cannot
  carry a native histogram, so they keep a minimal classic form: the ``+Inf`` bucket, ``_count`` and ``_sum``. A
  histogram family in those formats is only valid with its ``+Inf`` bucket, and a scraper that reads text (Prometheus
  without native histograms, Prometheus 3 without ``scrape_native_histograms``, an OpenTelemetry collector) still
  gets call counts and mean latency; its quantiles need the native form;
- ``classic``: no native histogram anywhere, for stores that take none (old Mimir or Thanos, VictoriaMetrics 1.79).

The mode only shapes families a collector yields (histogram families with a native sample); recording, flush,
multiprocess files and /routing are the same in every mode.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ..config import HISTOGRAM_MODES, HistogramMode

__all__ = ["HISTOGRAM_MODES", "HistogramMode", "shaped"]


_HISTOGRAMS = ("histogram", "gaugehistogram")


def _suffixes(fam: Metric) -> tuple[str, str, str]:
    gauge = fam.type == "gaugehistogram"
    return fam.name + "_bucket", fam.name + ("_gcount" if gauge else "_count"), fam.name + ("_gsum" if gauge else "_sum")


def _series_key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "le"))


def _native_only(fam: Metric) -> Metric:
    """The native sample of each series that has one, without its classic samples; other series as they are."""
    bucket, count, total = _suffixes(fam)
    native = {_series_key(s.labels) for s in fam.samples if s.name == fam.name and s.native_histogram is not None}
    out = Metric(fam.name, fam.documentation, fam.type, fam.unit)
    out.samples = [s for s in fam.samples
                   if not (s.name in (bucket, count, total) and _series_key(s.labels) in native)]
    return out


def _minimal_classic(fam: Metric) -> Metric:
    """No native sample; of the classic buckets only ``+Inf`` (with ``_count`` and ``_sum``) of a series that had one."""
    bucket, _count, _total = _suffixes(fam)
    native = {_series_key(s.labels) for s in fam.samples if s.name == fam.name and s.native_histogram is not None}
    out = Metric(fam.name, fam.documentation, fam.type, fam.unit)
    out.samples = [s for s in fam.samples if s.native_histogram is None and not (
        s.name == bucket and s.labels.get("le") != "+Inf" and _series_key(s.labels) in native)]
    return out


def _without_native(fam: Metric) -> Metric:
    out = Metric(fam.name, fam.documentation, fam.type, fam.unit)
    out.samples = [s for s in fam.samples if s.native_histogram is None]
    return out


class shaped:  # noqa: N801 - reads as a function at the call site: encoder(shaped(collector, mode, native_format))
    """A collector's families in a histogram mode, for a format that can (``native_format``) or cannot carry native
    histograms. Families without a native sample pass through untouched."""

    def __init__(self, collector: Collector, mode: HistogramMode | str, *, native_format: bool) -> None:
        self._collector = collector
        mode = HistogramMode(mode)
        if not native_format:
            self._shape = _minimal_classic if mode is HistogramMode.NATIVE else _without_native
        elif mode is HistogramMode.NATIVE:
            self._shape = _native_only
        elif mode is HistogramMode.CLASSIC:
            self._shape = _without_native
        else:
            self._shape = None

    def collect(self) -> Iterator[Metric]:
        shape = self._shape
        for fam in self._collector.collect():
            if shape is not None and fam.type in _HISTOGRAMS and any(s.native_histogram for s in fam.samples):
                yield shape(fam)
            else:
                yield fam
