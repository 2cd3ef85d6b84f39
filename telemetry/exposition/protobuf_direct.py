"""Counter, gauge and histogram families written as ``MetricFamily`` bytes directly, without the generated classes.

The bytes are the ones ``protobuf.family_message(fam).SerializeToString()`` gives (fields in number order, proto2
presence: a field set is written even when zero; tests/telemetry/test_protobuf_direct.py compares them family by
family), at a fraction of the cost: building the messages was most of a protobuf scrape. A family these writers do
not cover (exemplars, timestamps, negative counts, other types) gets ``None`` and goes the message path.
"""

from __future__ import annotations

import math
import struct

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import NativeHistogram

from . import metrics_pb2 as pb

_DOUBLE = struct.Struct("<d")
_SMALL = [bytes((n,)) for n in range(128)]
_MAX_KEPT = 1 << 17


def varint(n: int) -> bytes:
    """Base-128 varint of a non-negative int (a length, a uint64 field)."""
    if n < 128:
        return _SMALL[n]
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _zigzag(n: int) -> bytes:
    """A sint32/sint64 field's value (ZigZag, then varint)."""
    return varint(n << 1 if n >= 0 else ((-n) << 1) - 1)


def field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field: tag byte, length, payload."""
    return _SMALL[tag] + varint(len(payload)) + payload if tag < 128 else bytes((tag,)) + varint(len(payload)) + payload


_by_id: dict[int, tuple[dict[str, str], bytes]] = {}  # id(labels) -> (that dict, its LabelPair fields)
_by_items: dict[tuple[tuple[str, str], ...], bytes] = {}  # the same, for a dict made afresh with the same labels


def _pairs(items: tuple[tuple[str, str], ...]) -> bytes:
    got = _by_items.get(items)
    if got is None:
        got = b"".join(field(0x0A, field(0x0A, k.encode()) + field(0x12, v.encode())) for k, v in items)
        if len(_by_items) >= _MAX_KEPT:
            _by_items.clear()
        _by_items[items] = got
    return got


def labels_of(labels: dict[str, str]) -> bytes:
    """A Metric's LabelPair fields for a labels dict: kept while the collector yields the same dict again (the
    multiprocess reader keeps one per series between scrapes), else found by its items."""
    got = _by_id.get(id(labels))
    if got is not None and got[0] is labels:
        return got[1]
    raw = _pairs(tuple(labels.items()))
    if len(_by_id) >= _MAX_KEPT:
        _by_id.clear()
    _by_id[id(labels)] = (labels, raw)
    return raw


def scalar_family_bytes(fam: Metric) -> bytes | None:
    """A counter or gauge family's delimited MetricFamily; None where the message path is needed."""
    if fam.type == "counter":
        name, kind, tag, wanted = fam.name + "_total", pb.COUNTER, 0x1A, fam.name + "_total"
    elif fam.type == "gauge":
        name, kind, tag, wanted = fam.name, pb.GAUGE, 0x12, None
    else:
        return None
    metrics = []
    for s in fam.samples:
        if wanted is not None and s.name != wanted:
            continue
        if s.exemplar is not None or s.timestamp is not None:
            return None
        body = labels_of(s.labels) + bytes((tag, 9, 0x09)) + _DOUBLE.pack(s.value)
        metrics.append(field(0x22, body))
    return _delimited(fam, name, kind, metrics)


def _delimited(fam: Metric, name: str, kind: int, metrics: list[bytes]) -> bytes:
    if not metrics:
        return b""
    message = field(0x0A, name.encode()) + field(0x12, fam.documentation.encode()) + bytes((0x18, kind)) \
        + b"".join(metrics)
    return varint(len(message)) + message


class _Histogram:
    """One series' Histogram fields as they are set, written in field-number order by ``encode``."""

    __slots__ = ("labels", "count", "count_float", "total", "buckets", "native")

    def __init__(self, labels: bytes) -> None:
        self.labels = labels
        self.count: int | None = None
        self.count_float: float | None = None
        self.total: float | None = None
        self.buckets: list[bytes] = []
        self.native: bytes = b""  # fields 5-13: schema, zero bucket, spans and deltas

    def set_count(self, value: float) -> None:
        if float(value).is_integer():
            self.count = int(value)
        else:
            self.count_float = value

    def encode(self) -> bytes:
        parts = []
        if self.count is not None:
            parts.append(b"\x08" + varint(self.count))
        if self.total is not None:
            parts.append(b"\x11" + _DOUBLE.pack(self.total))
        parts.extend(self.buckets)
        if self.count_float is not None:
            parts.append(b"\x21" + _DOUBLE.pack(self.count_float))
        parts.append(self.native)
        body = b"".join(parts)
        return field(0x22, self.labels + (field(0x3A, body) if body else b""))


def _span(tag: int, span: tuple[int, int]) -> bytes:
    return field(tag, b"\x08" + _zigzag(span[0]) + b"\x10" + varint(span[1]))


def _native(hist: _Histogram, nh: NativeHistogram) -> bool:
    """The native fields into the series (count and sum too where no classic sample set them); False where the
    message path is needed (a negative count)."""
    out = [b"\x28" + _zigzag(nh.schema), b"\x31" + _DOUBLE.pack(nh.zero_threshold)]
    if float(nh.zero_count).is_integer():
        if nh.zero_count < 0:
            return False
        out.append(b"\x38" + varint(int(nh.zero_count)))
    else:
        out.append(b"\x41" + _DOUBLE.pack(nh.zero_count))
    if hist.count is None and hist.count_float is None:
        if float(nh.count_value).is_integer() and nh.count_value < 0:
            return False
        hist.set_count(nh.count_value)
    if hist.total is None:
        hist.total = nh.sum_value
    for span in nh.neg_spans or ():
        out.append(_span(0x4A, span))
    out.extend(b"\x50" + _zigzag(d) for d in nh.neg_deltas or ())
    spans = nh.pos_spans or ((0, 0),)  # no-op span: an empty native histogram stays native whatever the threshold
    for span in spans:
        if span[1] < 0:
            return False
        out.append(_span(0x62, span))
    out.extend(b"\x68" + _zigzag(d) for d in nh.pos_deltas or ())
    hist.native = b"".join(out)
    return True


_bounds: dict[str, tuple[float, bytes]] = {}  # le -> (bound, its upper_bound field)


def histogram_family_bytes(fam: Metric) -> bytes | None:
    """A histogram or gauge histogram family's delimited MetricFamily; None where the message path is needed."""
    if fam.type == "histogram":
        kind, count_name, sum_name = pb.HISTOGRAM, fam.name + "_count", fam.name + "_sum"
    elif fam.type == "gaugehistogram":
        kind, count_name, sum_name = pb.GAUGE_HISTOGRAM, fam.name + "_gcount", fam.name + "_gsum"
    else:
        return None
    bucket_name = fam.name + "_bucket"
    by_raw: dict[tuple, _Histogram] = {}
    by_sorted: dict[tuple, _Histogram] = {}
    order: list[_Histogram] = []

    def series(raw: tuple) -> _Histogram:
        hist = by_raw.get(raw)
        if hist is None:
            canonical = tuple(sorted(raw))
            hist = by_sorted.get(canonical)
            if hist is None:
                hist = by_sorted[canonical] = _Histogram(_pairs(raw))
                order.append(hist)
            by_raw[raw] = hist
        return hist

    for s in fam.samples:
        if s.exemplar is not None or s.timestamp is not None:
            return None
        name = s.name
        if name == bucket_name:
            labels = s.labels
            le = labels["le"]
            bound = _bounds.get(le)
            if bound is None:
                bound = _bounds[le] = (float(le), b"\x11" + _DOUBLE.pack(float(le)))
            items = tuple(labels.items())
            hist = series(items[:-1] if items[-1][0] == "le" else tuple(i for i in items if i[0] != "le"))
            if bound[0] == math.inf:
                continue  # the +Inf bucket is the count (the schema makes it optional)
            value = s.value
            if float(value).is_integer():
                if value < 0:
                    return None
                hist.buckets.append(field(0x1A, b"\x08" + varint(int(value)) + bound[1]))
            else:
                hist.buckets.append(field(0x1A, bound[1] + b"\x21" + _DOUBLE.pack(value)))
        elif name == count_name:
            if float(s.value).is_integer() and s.value < 0:
                return None
            series(tuple(s.labels.items())).set_count(s.value)
        elif name == sum_name:
            series(tuple(s.labels.items())).total = s.value
        elif name == fam.name and s.native_histogram is not None:
            if not _native(series(tuple(s.labels.items())), s.native_histogram):
                return None
    return _delimited(fam, fam.name, kind, [h.encode() for h in order])
