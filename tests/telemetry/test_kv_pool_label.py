"""The traffic series' kv_pool_bytes label: each call's pool as a power-of-two bucket of bytes, from a real dispatcher
through real telemetry to the exposition, /routing's snapshot and advise's traffic."""

from __future__ import annotations

import torch

from advise.traffic import entries_from

from .conftest import D, H, NOPE, ROPE, dispatcher, scrape, series


def _call(rows: int, slots: int) -> list:
    q = torch.zeros(rows, H, D, dtype=torch.float16)
    kv = torch.zeros(slots, 1, D, dtype=torch.float16)
    idx = torch.zeros(rows, 4, dtype=torch.int32)
    out = torch.zeros(rows, H, NOPE, dtype=torch.float16)
    return [q, kv, idx, None, 0.125, D, NOPE, ROPE, None, out]


def test_each_pool_size_bucket_is_its_own_traffic_series(make_tel):
    tel = make_tel()
    d = tel.instrument(dispatcher())
    small, mid, mid_bigger = 1024, 1 << 16, (1 << 16) + 5000  # 128 KiB (the 1 MiB floor), 8 MiB, 8.6 MiB
    for slots, calls in ((small, 3), (mid, 5), (mid_bigger, 2)):
        for _ in range(calls):
            d(*_call(16, slots), model="glm")
    tel.flush()
    snap = tel.snapshot()
    by_pool = {}
    for e in snap["traffic"]:
        by_pool[e["kv_pool_bytes"]] = by_pool.get(e["kv_pool_bytes"], 0) + e["calls"]
    assert by_pool == {1 << 20: 3, 8 << 20: 7}  # 8 MiB and 8.6 MiB share a bucket; 128 KiB counts as 1 MiB
    got = {dict(labels)["kv_pool_bytes"]: v for labels, v in
           series(scrape(tel.registry), "routescope_traffic_calls_total").items()}
    assert got == {"1048576": 3.0, "8388608": 7.0}
    entries = entries_from(snap["traffic"])  # what advise reads from /routing
    assert sorted((e.kv_pool_bytes, e.calls) for e in entries) == [(1 << 20, 3), (8 << 20, 7)]


def test_a_shape_without_a_pool_exports_an_empty_label(make_tel):
    from dispatcher.types import Batch, CallShape

    tel = make_tel()
    d = tel.instrument(dispatcher())
    shape = CallShape(rows=4, heads=H, head_dim=D, nope_head_dim=NOPE, rope_head_dim=ROPE, q_dtype="float16",
                      kv_dtype="float16", topk=4)  # built by hand: kv_pool_bytes 0
    token = d.probe.start(d.decide(shape, Batch()), shape, Batch(), "glm", torch.zeros(1), None, "torch")
    d.probe.stop(token, "torch")
    tel.flush()
    (entry,) = tel.snapshot()["traffic"]
    assert entry["kv_pool_bytes"] is None
    labels = series(scrape(tel.registry), "routescope_traffic_calls_total")
    assert {dict(k)["kv_pool_bytes"] for k in labels} == {""} and sum(labels.values()) == 1
