"""The Hopper split-K decode as one cooperative launch (``gluon_sm90._split_decode_kernel``) on a real sm_90 GPU
(marker gpu): against the two-launch decode of the same plan for every edge case, layout and pool it takes; its
counters back at zero after every call (repeated calls, grids that change, two streams at once); a graph capture
taking the two launches instead; stamped; and the grids that fill every multiprocessor launched cooperatively."""

from __future__ import annotations

import pytest
import torch

from dispatcher.kernels import triton_decode
from dispatcher.kernels.scratch import scratch
from dispatcher.kernels.stamps import DeviceStamp
from dispatcher.sweep.correctness import build, check
from dispatcher.sweep.grid import Layout

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
V32 = Layout(512, 64)
EDGES = {
    "plain": {},
    "interleaved -1, bad slots, no sink": dict(interleave=True, sink=False),
    "topk_length wild": dict(topk_length="wild"),
    "topk_length short, int64": dict(topk_length="short", index_dtype=torch.int64),
    "ragged": dict(ragged=True),
    "ragged + topk_length": dict(ragged=True, topk_length="wild"),
}


@pytest.fixture()
def g():
    from dispatcher.kernels import gluon_sm90

    if not torch.cuda.is_available() or not gluon_sm90.HAVE_GLUON or not gluon_sm90._on_hopper(
            torch.empty(0, device="cuda")):
        pytest.skip("needs an sm_90 GPU and a Triton with Gluon")
    return gluon_sm90


def both(g, args):
    """(one launch, two launches) of the decode's default plan for ``args``, on fresh outputs."""
    plan = g._decode_plan(args)
    assert g.split_reduce_fits(args, plan.grid, g.decode_config(args)), plan.grid
    one = args._replace(output=torch.full_like(args.output, float("nan")))
    two = args._replace(output=torch.full_like(args.output, float("nan")))
    g.split_reduce_recipe(args, plan)(one)
    triton_decode.split_k_run(g._partial_kernel, plan, CUDA, "gluon")(two)
    torch.cuda.synchronize()
    return one.output, two.output


def same_but_rounding(one: torch.Tensor, two: torch.Tensor) -> None:
    """The two reduces sum the same fp32 terms in different orders: equal, or one step of the output's dtype apart."""
    assert not one.isnan().any() and not two.isnan().any()
    step = torch.finfo(one.dtype).eps
    a, b = one.double(), two.double()
    assert bool((a - b).abs().le(step * b.abs().clamp_min(1e-3)).all()), float((a - b).abs().max())


# (q, pool, which shapes): every edge case on bf16; the decode shapes of every layout on fp16 and an e4m3 pool; an
# e5m2 pool at one shape (each pair compiles its own kernels)
POOLS = [(torch.bfloat16, None, "all"), (torch.float16, None, "layouts"),
         (torch.bfloat16, torch.float8_e4m3fn, "layouts"), (torch.float16, torch.float8_e5m2, "plain")]


@pytest.mark.parametrize("dtype,kv_dtype,which", POOLS, ids=["bf16", "fp16", "bf16-e4m3", "fp16-e5m2"])
def test_one_launch_matches_two_launches_and_the_reference(g, dtype, kv_dtype, which):
    shapes = [("plain", 8, V32, {})]
    if which == "all":
        shapes = [(name, 8, V32, kw) for name, kw in EDGES.items()]
        shapes += [("128 heads (8 head blocks)", 1, V32, dict(heads=128, topk=512)),
                   ("every multiprocessor (66 rows x 2 splits)", 66, V32, {})]
    if which != "plain":
        shapes += [(f"{lay} decode", rows, lay, dict(pad=False, bad_slots=False))
                   for lay in (V32, Layout(448, 64), Layout(512, 0)) for rows in (1, 2, 16)]
    bad = []
    for name, rows, lay, kw in shapes:
        args = build(rows, layout=lay, dtype=dtype, device=CUDA, seed=7, kv_dtype=kv_dtype, **kw)
        one, two = both(g, args)
        try:
            same_but_rounding(one, two)
        except AssertionError as exc:
            bad.append(f"{name}: {exc}")
        res = check(name, "one launch", lambda a: g.split_reduce_recipe(a, g._decode_plan(a))(a),
                    args._replace(output=torch.full_like(args.output, float("nan"))))
        if not res.ok:
            bad.append(str(res))
    assert not bad, "\n".join(bad)


def test_the_default_decode_is_one_cooperative_launch_where_it_fits(g):
    """At 2 and 16 rows the registry's decode runs ``_split_decode_kernel`` alone; its compiled handle is
    cooperative and fits one program per multiprocessor (the driver would refuse the launch otherwise)."""
    from dispatcher.kernels import launcher

    for rows in (2, 16):
        args = build(rows, layout=V32, dtype=torch.bfloat16, device=CUDA, seed=1)
        g.launch_decode(args)
        torch.cuda.synchronize()
        assert not args.output.isnan().any()
    kept = [h for (fn, _), (h, _) in launcher._HANDLES.items() if fn is g._split_decode_kernel]
    assert kept and all(h.metadata.launch_cooperative_grid for h in kept)
    props = torch.cuda.get_device_properties(CUDA)
    per_block = props.shared_memory_per_block_optin if hasattr(props, "shared_memory_per_block_optin") else 232448
    assert all(h.metadata.shared <= per_block for h in kept)


def test_the_counters_are_zero_after_every_call(g):
    """Calls of different grids one after another, repeated, on one stream: each equals its two-launch decode, and
    the counters read zero after each."""
    stream = torch.cuda.current_stream().cuda_stream
    for rows, seed in ((2, 1), (16, 2), (2, 3), (8, 4), (33, 5), (2, 6)):
        args = build(rows, layout=V32, dtype=torch.bfloat16, device=CUDA, seed=seed, pad=False)
        for _ in range(3):
            one, two = both(g, args)
            same_but_rounding(one, two)
        arrivals = scratch().get("decode_arrivals", 1, torch.int32, CUDA, stream, zeroed=True)
        assert int(arrivals.abs().sum()) == 0, (rows, arrivals[:64].tolist())


def test_two_streams_at_once_keep_their_own_counters(g):
    calls = [build(r, layout=V32, dtype=torch.bfloat16, device=CUDA, seed=10 + r) for r in (2, 16)]
    want = [both(g, a)[0] for a in calls]
    streams = [torch.cuda.Stream() for _ in calls]
    outs = [a._replace(output=torch.full_like(a.output, float("nan"))) for a in calls]
    for _ in range(20):
        for s, a in zip(streams, outs):
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                g.launch_decode(a)
    torch.cuda.synchronize()
    for got, w in zip(outs, want):
        assert torch.equal(got.output, w)


def test_a_capture_takes_the_two_launches(g):
    """Launched now, the default decode runs the one launch; being captured into a CUDA graph, the partials and the
    reduce (faster on the GPU, where a replay has no host cost to save)."""
    seen = []
    run = g.eager_or_captured(lambda a: seen.append("one launch"), lambda a: seen.append("two launches"), CUDA)
    run(None)
    x = torch.zeros(1, device=CUDA)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x.add_(1)
        run(None)
    assert seen == ["one launch", "two launches"]


def test_captured_and_replayed_with_new_operands(g):
    """The graph holds the two-launch decode: each replay, on the operands copied in, equals that pair launched
    eagerly bit for bit, and the eager default (one launch) but for rounding."""
    args = build(2, layout=V32, dtype=torch.bfloat16, device=CUDA, seed=20)
    fresh = build(2, layout=V32, dtype=torch.bfloat16, device=CUDA, seed=21)
    pairs, ones = [], []
    for a in (args, fresh):
        one, two = both(g, a)
        ones.append(one)
        pairs.append(two)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        g.launch_decode(args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g.launch_decode(args)
    for src, k in ((None, 0), (fresh, 1), (None, 1)):
        if src is not None:
            args.q.copy_(src.q)
            args.kv.copy_(src.kv)
            args.index.indices.copy_(src.index.indices)
            args.attn_sink.copy_(src.attn_sink)
        args.output.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(args.output, pairs[k])
        same_but_rounding(ones[k], args.output)


def test_a_stamped_call_gets_both_stamps_from_the_one_kernel(g):
    times = torch.zeros(4, 2, dtype=torch.int64, device=CUDA)
    counts = torch.zeros(4, dtype=torch.int32, device=CUDA)
    args = build(16, layout=V32, dtype=torch.bfloat16, device=CUDA, seed=30)
    stamped = args._replace(stamp=DeviceStamp(times, counts, 2))
    g.launch_decode(stamped)
    torch.cuda.synchronize()
    start, end = times[2].tolist()
    assert stamped.stamp.armed and 0 < start < end and end - start < 1_000_000  # ns: under a millisecond
    assert int(counts.abs().sum()) == 0
