"""telemetry.exposition.text: the classic text exposition, byte for byte prometheus_client's generate_latest."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, Summary, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from telemetry.exposition import negotiate
from telemetry.exposition.text import TextEncoder


class Fixed:
    """A collector that yields the families it was given (the same label dicts every time)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def test_every_metric_type_of_a_real_registry():
    reg = CollectorRegistry()
    Counter("c", "a counter\nwith \\ a newline", ["x"], registry=reg).labels('q"uo\\te\n').inc(3)
    Gauge("g", "h", registry=reg).set(1e22)
    Histogram("h_seconds", "h", ["k"], registry=reg, buckets=(0.001, 1.0)).labels("a").observe(0.5)
    Summary("s", "h", registry=reg).observe(2.5)
    Info("i", "h", registry=reg).info({"version": "1"})
    enc = TextEncoder()
    assert enc(reg) == generate_latest(reg)  # _created samples moved to gauges at the end, as there
    assert enc(reg) == generate_latest(reg)  # label dicts made afresh by each collect: no stale line


def test_a_kept_labels_dict_reuses_its_line_but_never_its_value():
    labels = {"rank": "0", "le": "+Inf"}
    fam = Metric("m", "h", "gauge")
    fam.samples = [Sample("m", labels, 1.0)]
    enc = TextEncoder()
    first = enc(Fixed([fam]))
    fam.samples = [Sample("m", labels, 2.5, 1700000000.0)]
    assert enc(Fixed([fam])) == generate_latest(Fixed([fam])) != first
    labels2 = {"rank": "1", "le": "+Inf"}  # another dict: its own line
    fam.samples = [Sample("m", labels, 2.0), Sample("m", labels2, 3.0)]
    assert enc(Fixed([fam])) == generate_latest(Fixed([fam]))


def test_an_unmoved_value_gets_its_line_again_and_every_move_is_written():
    """A kept labels dict whose value did not move reuses its whole line; a value that moved, changed type, turned
    0.0 into -0.0, became NaN or gained a timestamp is written anew. Each scrape equals generate_latest's."""
    labels = {"rank": "0"}
    fam = Metric("m", "h", "gauge")
    enc = TextEncoder()
    for value, timestamp in ((1.0, None), (1.0, None), (2.0, None), (0.0, None), (-0.0, None), (-0.0, None),
                             (float("nan"), None), (float("nan"), None), (3, None), (3.0, None), (3.0, 1.5),
                             (3.0, 1.5), (3.0, None), (float("inf"), None)):
        fam.samples = [Sample("m", labels, value, timestamp)]
        assert enc(Fixed([fam])) == generate_latest(Fixed([fam])), (value, timestamp)


def test_negotiate_serves_it_for_text_only():
    reg = CollectorRegistry()
    Counter("c", "h", registry=reg).inc()
    encoder, content_type = negotiate("text/plain; version=0.0.4")
    assert content_type.startswith("text/plain") and encoder(reg) == generate_latest(reg)


names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}", fullmatch=True)
values = st.floats(allow_nan=False) | st.sampled_from([float("inf"), float("-inf"), 0.0, 1e6, 123456789.0])


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.sampled_from(["counter", "gauge", "histogram", "summary", "unknown"]), names,
                          st.lists(st.tuples(st.dictionaries(names, st.text(max_size=6), max_size=3), values,
                                             st.none() | st.floats(0, 2e9)), max_size=4)), max_size=4))
def test_any_families_encode_as_generate_latest_does(spec):
    families = []
    for typ, name, samples in spec:
        fam = Metric(name, "help", typ)
        fam.samples = [Sample(name + ("_created" if i == 1 else ""), labels, value, ts)
                       for i, (labels, value, ts) in enumerate(samples)]
        families.append(fam)
    enc = TextEncoder()
    assert enc(Fixed(families)) == generate_latest(Fixed(families))
    assert enc(Fixed(families)) == generate_latest(Fixed(families))  # the kept lines give the same bytes
