"""Prometheus' protobuf exposition: prometheus_client families as length-delimited ``io.prometheus.client.MetricFamily``.

The one format Prometheus 2.40-2.x ingests native histograms from. A histogram family's series carries its classic
buckets and, where the collector yields a sample with ``native_histogram`` (telemetry.native.native_histogram), the
native schema, zero bucket and positive spans/deltas in the same ``Histogram`` message. The messages are the generated
``metrics_pb2`` classes; only the varint length prefix of the delimited stream is written here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import NativeHistogram, Sample

from . import metrics_pb2 as pb
from .protobuf_direct import histogram_family_bytes, scalar_family_bytes, varint

_SCALAR_TYPES = {"gauge": pb.GAUGE, "info": pb.GAUGE, "stateset": pb.GAUGE, "unknown": pb.UNTYPED,
                 "untyped": pb.UNTYPED}
_HISTOGRAM_TYPES = {"histogram": pb.HISTOGRAM, "gaugehistogram": pb.GAUGE_HISTOGRAM}


def _labels(metric: pb.Metric, labels: dict[str, str]) -> None:
    for name, value in labels.items():
        metric.label.add(name=name, value=value)


def _timestamp(metric: pb.Metric, sample: Sample) -> None:
    if sample.timestamp is not None:
        metric.timestamp_ms = int(float(sample.timestamp) * 1000)


def _exemplar(target: pb.Exemplar, sample: Sample) -> None:
    ex = sample.exemplar
    assert ex is not None
    for name, value in ex.labels.items():
        target.label.add(name=name, value=value)
    target.value = ex.value
    if ex.timestamp is not None:
        ts = float(ex.timestamp)
        target.timestamp.seconds = math.floor(ts)
        target.timestamp.nanos = int(round((ts - math.floor(ts)) * 1e9)) % 1_000_000_000


def _set_count(hist: pb.Histogram, value: float) -> None:
    if float(value).is_integer():
        hist.sample_count = int(value)
    else:
        hist.sample_count_float = value


def _native(hist: pb.Histogram, nh: NativeHistogram) -> None:
    """Native buckets into the series' Histogram (count and sum too, where no classic sample set them)."""
    hist.schema = nh.schema
    hist.zero_threshold = nh.zero_threshold
    if float(nh.zero_count).is_integer():
        hist.zero_count = int(nh.zero_count)
    else:
        hist.zero_count_float = nh.zero_count
    if not hist.HasField("sample_count") and not hist.HasField("sample_count_float"):
        _set_count(hist, nh.count_value)
    if not hist.HasField("sample_sum"):
        hist.sample_sum = nh.sum_value
    spans = nh.pos_spans or ()
    for span in spans:
        hist.positive_span.add(offset=span[0], length=span[1])
    hist.positive_delta.extend(nh.pos_deltas or ())
    if not spans:  # no-op span: an empty native histogram stays native whatever the zero threshold
        hist.positive_span.add(offset=0, length=0)
    for span in nh.neg_spans or ():
        hist.negative_span.add(offset=span[0], length=span[1])
    hist.negative_delta.extend(nh.neg_deltas or ())


class _Series:
    """A histogram family's Metric per label set (``le`` aside), found by the labels as the sample holds them.

    Collectors give a series' samples the same label order (prometheus_client's families put ``le`` last), so
    the raw ``items()`` tuple finds the series without sorting; another order for the same set falls back to the
    sorted form once and is remembered too.
    """

    def __init__(self, out: pb.MetricFamily) -> None:
        self._out = out
        self._by_raw: dict[tuple[tuple[str, str], ...], pb.Histogram] = {}
        self._by_sorted: dict[tuple[tuple[str, str], ...], pb.Histogram] = {}

    def histogram(self, raw: tuple[tuple[str, str], ...], sample: Sample) -> pb.Histogram:
        hist = self._by_raw.get(raw)
        if hist is None:
            canonical = tuple(sorted(raw))
            hist = self._by_sorted.get(canonical)
            if hist is None:
                metric = self._out.metric.add()
                for name, value in raw:
                    metric.label.add(name=name, value=value)
                _timestamp(metric, sample)
                hist = self._by_sorted[canonical] = metric.histogram
            self._by_raw[raw] = hist
        return hist


def _without_le(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    items = tuple(labels.items())
    if items and items[-1][0] == "le":
        return items[:-1]
    return tuple(item for item in items if item[0] != "le")


def _histogram_family(fam: Metric, out: pb.MetricFamily) -> None:
    """One Metric per label set (``le`` aside); samples are read by suffix as prometheus_client writes them."""
    gauge = fam.type == "gaugehistogram"
    bucket_name = fam.name + "_bucket"
    count_name = fam.name + ("_gcount" if gauge else "_count")
    sum_name = fam.name + ("_gsum" if gauge else "_sum")
    series = _Series(out)
    bounds: dict[str, float] = {}
    for s in fam.samples:
        name = s.name
        if name == bucket_name:
            le = s.labels["le"]
            bound = bounds.get(le)
            if bound is None:
                bound = bounds[le] = float(le)
            hist = series.histogram(_without_le(s.labels), s)
            if bound == math.inf:
                continue  # the +Inf bucket is the count (the schema makes it optional)
            value = s.value
            if s.exemplar is None and value == int(value):
                hist.bucket.add(upper_bound=bound, cumulative_count=int(value))
                continue
            bucket = hist.bucket.add(upper_bound=bound)
            if float(value).is_integer():
                bucket.cumulative_count = int(value)
            else:
                bucket.cumulative_count_float = value
            if s.exemplar is not None:
                _exemplar(bucket.exemplar, s)
        elif name == count_name:
            _set_count(series.histogram(tuple(s.labels.items()), s), s.value)
        elif name == sum_name:
            series.histogram(tuple(s.labels.items()), s).sample_sum = s.value
        elif name == fam.name and s.native_histogram is not None:
            _native(series.histogram(tuple(s.labels.items()), s), s.native_histogram)


def family_message(fam: Metric) -> pb.MetricFamily | None:
    """The MetricFamily of one prometheus_client family; None for a type the schema lacks."""
    if fam.type == "counter":
        out = pb.MetricFamily(name=fam.name + "_total", help=fam.documentation, type=pb.COUNTER)
        for s in fam.samples:
            if s.name == fam.name + "_total":
                metric = out.metric.add()
                _labels(metric, s.labels)
                _timestamp(metric, s)
                metric.counter.value = s.value
                if s.exemplar is not None:
                    _exemplar(metric.counter.exemplar, s)
        return out
    if fam.type in _HISTOGRAM_TYPES:
        out = pb.MetricFamily(name=fam.name, help=fam.documentation, type=_HISTOGRAM_TYPES[fam.type])
        _histogram_family(fam, out)
        return out
    if fam.type == "summary":
        out = pb.MetricFamily(name=fam.name, help=fam.documentation, type=pb.SUMMARY)
        by_labels: dict[tuple[tuple[str, str], ...], pb.Metric] = {}
        for s in fam.samples:
            labels = {k: v for k, v in s.labels.items() if k != "quantile"}
            key = tuple(sorted(labels.items()))
            metric = by_labels.get(key)
            if metric is None:
                metric = by_labels[key] = out.metric.add()
                _labels(metric, labels)
            if s.name == fam.name + "_count":
                metric.summary.sample_count = int(s.value)
            elif s.name == fam.name + "_sum":
                metric.summary.sample_sum = s.value
            elif s.name == fam.name and "quantile" in s.labels:
                metric.summary.quantile.add(quantile=float(s.labels["quantile"]), value=s.value)
        return out
    kind = _SCALAR_TYPES.get(fam.type)
    if kind is None:
        return None
    name = fam.name + "_info" if fam.type == "info" else fam.name
    out = pb.MetricFamily(name=name, help=fam.documentation, type=kind)
    for s in fam.samples:
        metric = out.metric.add()
        _labels(metric, s.labels)
        _timestamp(metric, s)
        if kind == pb.GAUGE:
            metric.gauge.value = s.value
        else:
            metric.untyped.value = s.value
    return out


def encode_messages(messages: Iterable[pb.MetricFamily]) -> bytes:
    """MetricFamily messages as one delimited stream (each behind its varint length)."""
    chunks: list[bytes] = []
    for message in messages:
        body = message.SerializeToString()
        chunks.append(varint(len(body)))
        chunks.append(body)
    return b"".join(chunks)


def encode_families(families: Iterable[Metric]) -> bytes:
    """Length-delimited MetricFamily messages, one per family with samples (counters, gauges and histograms written
    directly, ``protobuf_direct``: building their messages cost most of a scrape's encoding)."""
    chunks: list[bytes] = []
    for fam in families:
        direct = scalar_family_bytes(fam)
        if direct is None:
            direct = histogram_family_bytes(fam)
        if direct is not None:
            chunks.append(direct)
            continue
        message = family_message(fam)
        if message is not None and message.metric:
            chunks.append(encode_messages((message,)))
    return b"".join(chunks)


def generate_delimited(collector: Collector) -> bytes:
    """What /metrics answers a scraper that asked for the protobuf exposition."""
    return encode_families(collector.collect())


def decode_delimited(data: bytes) -> list[pb.MetricFamily]:
    """The families of a delimited stream (tests and the benchmark read a scrape back with it)."""
    out: list[pb.MetricFamily] = []
    pos = 0
    while pos < len(data):
        length = shift = 0
        while True:
            byte = data[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        fam = pb.MetricFamily()
        fam.ParseFromString(data[pos:pos + length])
        out.append(fam)
        pos += length
    return out
