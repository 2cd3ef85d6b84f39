"""Memory stays flat: a million calls (no-op kernel) allocate nothing that stays, with the flush thread running."""

from __future__ import annotations

import gc
import sys

import pytest

from telemetry import TelemetryConfig
from telemetry.bench.workload import MIX, make_calls

from .conftest import dispatcher


@pytest.mark.slow
def test_memory_flat_after_a_million_calls(make_tel):
    tel = make_tel(TelemetryConfig(models=("glm", "dsv4"), decisions_maxlen=64, log_first_decode_in_prefill=False))
    d = tel.instrument(dispatcher())
    calls = make_calls(100 * len(MIX))
    tel.start(flush_interval_s=0.2)

    def run(n: int) -> None:
        for _ in range(n // len(calls)):
            for args, kw in calls:
                d(*args, **kw)

    run(100_000)  # every slot made, sampling past its first calls, the decisions deque full
    agg = tel.aggregates

    def state() -> tuple[int, ...]:
        return (agg.n_slots, len(agg.index.tables), len(agg.index.model_index), len(agg.counters.impl_extra),
                len(agg.kernel_errors.counts))

    state0 = state()
    gc.collect()
    blocks0 = sys.getallocatedblocks()
    run(1_000_000)
    tel.flush()
    gc.collect()
    grown = sys.getallocatedblocks() - blocks0
    assert grown < 2_000, f"{grown} memory blocks still allocated after 1,000,000 calls"
    assert state() == state0
    assert sum(tel.totals.calls.values()) == 1_100_000
    assert len(tel.recent_decisions) == 64
