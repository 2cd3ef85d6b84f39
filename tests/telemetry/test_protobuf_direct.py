"""The direct protobuf writers (telemetry.exposition.protobuf_direct) give the generated classes' bytes, family by
family, for histograms in every form the message path takes: classic and native, integer and float counts, a native
sample before or after the classic ones, negative spans, an empty native part, a series with only its +Inf bucket,
label orders that differ between a series' samples, gauge histograms, and the families it leaves to the messages."""

from __future__ import annotations

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Exemplar, NativeHistogram, Sample

from telemetry.exposition.protobuf import encode_families, encode_messages, family_message
from telemetry.exposition.protobuf_direct import histogram_family_bytes, scalar_family_bytes


def _family(typ: str, samples: list[Sample], name: str = "lat", doc: str = "Latency.") -> Metric:
    fam = Metric(name, doc, typ)
    fam.samples = samples
    return fam


def _messages(fam: Metric) -> bytes:
    message = family_message(fam)
    return encode_messages([message]) if message is not None and message.metric else b""


NH = NativeHistogram(count_value=5, sum_value=0.25, schema=4, zero_threshold=2.0 ** -30, zero_count=1,
                     pos_spans=((-200, 2), (3, 1)), pos_deltas=(2, -1, 0), neg_spans=((1, 1),), neg_deltas=(1,))
EMPTY = NativeHistogram(count_value=0, sum_value=0.0, schema=4, zero_threshold=0.0, zero_count=0)
FLOATS = NativeHistogram(count_value=2.5, sum_value=1.0, schema=-1, zero_threshold=0.0, zero_count=0.5,
                         pos_spans=((0, 1),), pos_deltas=(3,))


def _classic(labels: dict[str, str], buckets: list[tuple[str, float]], count: float, total: float,
             name: str = "lat", gauge: bool = False) -> list[Sample]:
    out = [Sample(name + "_bucket", {**labels, "le": le}, v) for le, v in buckets]
    out.append(Sample(name + ("_gcount" if gauge else "_count"), labels, count))
    out.append(Sample(name + ("_gsum" if gauge else "_sum"), labels, total))
    return out


CASES = {
    "classic": _classic({"k": "a"}, [("0.1", 1), ("1.0", 3), ("+Inf", 5)], 5, 2.5),
    "native first": [Sample("lat", {"k": "a"}, 5, native_histogram=NH),
                     *_classic({"k": "a"}, [("0.1", 1), ("+Inf", 5)], 5, 0.25)],
    "native after": [*_classic({"k": "a"}, [("0.1", 1), ("+Inf", 5)], 5, 0.25),
                     Sample("lat", {"k": "a"}, 5, native_histogram=NH)],
    "native alone": [Sample("lat", {"k": "a"}, 5, native_histogram=NH),
                     Sample("lat", {"k": "b"}, 0, native_histogram=EMPTY)],
    "float counts": [Sample("lat", {"k": "a"}, 2.5, native_histogram=FLOATS),
                     *_classic({"k": "a"}, [("0.5", 0.5), ("+Inf", 2.5)], 2.5, 1.0)],
    "int native, float classic count": [Sample("lat", {}, 5, native_histogram=NH),
                                        *_classic({}, [("+Inf", 5)], 4.5, 0.25)],
    "only +Inf": [Sample("lat_bucket", {"k": "z", "le": "+Inf"}, 0)],
    "label orders": [Sample("lat_bucket", {"b": "2", "a": "1", "le": "0.1"}, 1),
                     Sample("lat_bucket", {"le": "1.0", "a": "1", "b": "2"}, 2),
                     Sample("lat_count", {"a": "1", "b": "2"}, 2), Sample("lat_sum", {"b": "2", "a": "1"}, 0.5),
                     *_classic({"k": "ü", "e": ""}, [("0.001", 0), ("+Inf", 0)], 0, 0.0)],
    "big counts": _classic({"k": "a"}, [("0.1", 2 ** 40), ("+Inf", 2 ** 41)], 2 ** 41, 1e300),
    "no samples": [],
}


@pytest.mark.parametrize("case", list(CASES))
def test_histograms_written_directly_are_the_messages_bytes(case):
    fam = _family("histogram", CASES[case])
    direct = histogram_family_bytes(fam)
    assert direct is not None
    assert direct == _messages(fam)


def test_gauge_histograms_and_empty_help_too():
    fam = _family("gaugehistogram", _classic({"k": "a"}, [("0.1", 1), ("+Inf", 2)], 2, 0.5, gauge=True), doc="")
    assert histogram_family_bytes(fam) == _messages(fam) != b""


@pytest.mark.parametrize("sample", [
    Sample("lat_bucket", {"le": "0.1"}, 1, exemplar=Exemplar({"trace_id": "x"}, 0.05)),
    Sample("lat_bucket", {"le": "0.1"}, 1, timestamp=12.5),
])
def test_exemplars_and_timestamps_go_the_message_path_with_the_same_stream(sample):
    fam = _family("histogram", [sample, Sample("lat_bucket", {"le": "+Inf"}, 1)])
    assert histogram_family_bytes(fam) is None
    assert encode_families([fam]) == _messages(fam) != b""


def test_a_negative_count_is_refused_as_the_messages_refuse_it():
    fam = _family("histogram", _classic({}, [("0.1", -1), ("+Inf", 1)], 1, 0.0))
    assert histogram_family_bytes(fam) is None
    with pytest.raises(ValueError):
        _messages(fam)


def test_other_types_are_not_histograms_and_counters_stay_direct():
    counter = _family("counter", [Sample("c_total", {"a": "b"}, 3.0)], name="c")
    assert histogram_family_bytes(counter) is None
    assert scalar_family_bytes(counter) == _messages(counter)
    assert histogram_family_bytes(_family("summary", [Sample("s_count", {}, 1)], name="s")) is None
