"""`routescope advise --multiproc-dir DIR --span S` over the files real telemetry wrote for a real CPU dispatcher.

Nothing here stands in: ``telemetry.Telemetry`` with a multiprocess directory instruments a
``dispatcher.Dispatcher`` that runs the torch kernels on this CPU; calls of GLM's shapes include
pure decodes through the prefill entry (the seed's bug) and mixed batches, DeepSeek's only prefill.
After a flush the CLI reads the directory with telemetry's own readers. Calls, rows and each
entry's decode rows must be exactly the ones made (``routescope_traffic_decode_rows_total``: no
estimate), and the decode rows in the prefill kernel must cost something on the H200's table.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from typer.testing import CliRunner

from advise.report import AdviceOut
from advise.sources import MIXED_ESTIMATE, from_multiproc
from advise.traffic import bucket_bounds
from dispatcher import Dispatcher, Policy
from routescope.cli import build_app
from telemetry import Telemetry, TelemetryConfig

GLM, DSV = "GLM-5.3-Flash", "DeepSeek-V4.1-Flash"
HEADS, TOPK, POOL = 2, 2048, 2048  # the real top-k (the H200 table times 128/512/2048), two heads to keep it cheap
LAYOUTS = {GLM: (512, 0), DSV: (448, 64)}  # the models' real nope+rope: what the table is keyed by
# (model, query lens, times): each call's rows are the lens' sum; a request of one row is a decode.
CALLS = [
    (GLM, [1], 5),                 # pure decodes in the prefill entry: 5 calls of 1 row
    (GLM, [1, 1], 3),              # pure decodes, 2 rows
    (GLM, [1, 1, 18], 3),          # mixed: 2 decode rows of 20
    (GLM, [1, 1, 1, 3], 1),        # mixed: 3 decode rows of 6
    (GLM, [24], 2),                # prefill
    (DSV, [24], 3),                # DeepSeek: prefill only (its decodes use the decode entry)
]


def _class(lens: list[int]) -> str:
    decodes = sum(1 for n in lens if n == 1)
    return "pure_decode" if decodes == len(lens) else "mixed" if decodes else "prefill"


def _expected() -> dict[tuple[str, str], Counter]:
    """(model, call class) -> calls, rows, decode rows, as made."""
    out: dict[tuple[str, str], Counter] = {}
    for model, lens, times in CALLS:
        c = out.setdefault((model, _class(lens)), Counter())
        c.update(calls=times, rows=sum(lens) * times, decode_rows=sum(n for n in lens if n == 1) * times)
    return out


def _call(d, model: str, lens: list[int]) -> None:
    nope, rope = LAYOUTS[model]
    rows = sum(lens)
    q = torch.randn(rows, HEADS, nope + rope, dtype=torch.bfloat16)
    kv = torch.randn(POOL, 1, nope + rope, dtype=torch.bfloat16)
    idx = torch.randint(0, POOL, (rows, TOPK), dtype=torch.int32)
    out = torch.empty(rows, HEADS, nope, dtype=torch.bfloat16)
    d(q, kv, idx, None, (nope + rope) ** -0.5, nope + rope, nope, rope, None, out, query_lens=lens, model=model)


@pytest.fixture(scope="module")
def mpdir(tmp_path_factory):
    """A multiprocess directory with the calls above, flushed by real telemetry around a real CPU dispatcher."""
    path = tmp_path_factory.mktemp("mp")
    d = Dispatcher(policy=Policy())
    tel = Telemetry(TelemetryConfig(models=(GLM, DSV), multiproc_dir=str(path), process_id="rank0", rank="0",
                                    log_first_decode_in_prefill=False, flush_on_exit=False),
                    platform=d.platform, policy=d.policy)
    try:
        probe = tel.instrument(d)
        for model, lens, times in CALLS:
            for _ in range(times):
                _call(probe, model, lens)
        tel.flush()
        yield path
    finally:
        tel.close()


def test_the_files_give_each_entry_exactly(mpdir):
    traffic = from_multiproc(str(mpdir), span_s=1800.0)
    assert MIXED_ESTIMATE not in traffic.notes  # the traffic decode-rows counter is there: no estimate
    got: dict[tuple[str, str], Counter] = {}
    for e in traffic.entries:
        assert e.kernel == "intree.ragged_prefill" and e.topk == TOPK and (e.q_dtype, e.kv_dtype) == ("bfloat16",) * 2
        assert e.layout == "{}+{}".format(*LAYOUTS[e.model])
        lo, hi = bucket_bounds(e.rows_bucket)
        assert lo * e.calls <= e.rows <= (hi or e.rows) * e.calls  # each entry's rows inside its bucket
        got.setdefault((e.model, e.call_class), Counter()).update(calls=e.calls, rows=e.rows, decode_rows=e.decode_rows)
    assert got == _expected()
    mixed = {e.rows_bucket: (e.calls, e.decode_rows) for e in traffic.entries if e.call_class == "mixed"}
    assert mixed == {"16-31": (3, 6), "4-7": (1, 3)}  # per entry, not the pair's 9 shared out by calls (7 and 2)


def test_advise_reads_the_directory(mpdir):
    res = CliRunner().invoke(build_app(), ["advise", "--multiproc-dir", str(mpdir), "--span", "30m", "--table", "h200",
                                           "--json"])
    assert res.exit_code == 0, res.output
    out = AdviceOut.model_validate(json.loads(res.output))
    assert out.status == "ok" and out.source.kind == "multiproc" and out.source.span_s == 1800.0
    assert out.target.platform_arch == "cpu" and out.target.what_if and "priced as if on NVIDIA H200" in out.target.note
    assert MIXED_ESTIMATE not in out.notes
    want = _expected()
    models = {m.model: m for m in out.models}
    for model in (GLM, DSV):
        mine = [c for (m, _), c in want.items() if m == model]
        assert models[model].calls == sum(c["calls"] for c in mine)
        assert models[model].rows == sum(c["rows"] for c in mine)
    dip = models[GLM].decode_in_prefill
    pure, mixed = want[(GLM, "pure_decode")], want[(GLM, "mixed")]
    assert dip.calls == pure["calls"] + mixed["calls"] == 12
    assert dip.decode_rows == pure["decode_rows"] + mixed["decode_rows"] == 20
    assert dip.cost.mid > 0 and dip.cost_per_hour.mid == pytest.approx(2 * dip.cost.mid)  # 30 minutes of traffic
    assert dip.pure_decode.mid > 0  # 1-2 rows: the split-K kernel beats the prefill kernel at top-k 2048
    assert models[DSV].decode_in_prefill.calls == 0
    guard = next(c for c in models[GLM].candidates if c.name == "decodes_split_k")
    assert guard.moved_calls == pure["calls"] and guard.saving.mid > 0
