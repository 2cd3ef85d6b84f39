"""A negative result, kept so docs/benchmarks.md's figure can be reproduced: the head-dim chunks as one 3-D dot.

The idea: make the four 128-lane chunks of the 512-lane head block the batch dimension of a
batched tl.dot, so Triton lays warps over chunks and each warp keeps only its own q chunk in
registers (shared-memory traffic per tile would drop by about a quarter). Triton 3.6 does lay
warps over the batch (mma warpsPerCTA [4, 1, 2] at 8 warps), but the broadcast P operand and the
cross-warp sum of the partial scores made it 2.1-4.3x slower than the 2-D chunks on an H200.
Run on the device machine from the repository root: python3 scripts/gpu/exp_batched.py
"""
import triton
import triton.language as tl
from dispatcher.kernels.triton_prefill import finish_scale, mm, row_bounds, softmax_step


@triton.jit
def _prefill3(q_ptr, kv_ptr, idx_ptr, len_ptr, indptr_ptr, sink_ptr, out_ptr,
              skv, width, H, sm_scale2, ragged, has_len, has_sink, lanes,
              q_s0, q_s1, q_s2, kv_s0, kv_s2, idx_s0, idx_s1, len_s0, sink_s0, o_s0, o_s1, o_s2,
              D: tl.constexpr, CH: tl.constexpr, NCH: tl.constexpr, BLOCK_B: tl.constexpr,
              HAS_B: tl.constexpr, V_B: tl.constexpr, BLOCK_N: tl.constexpr, HB: tl.constexpr,
              IEEE: tl.constexpr, CNT_BLOCK: tl.constexpr):
    row = tl.program_id(0)
    h0 = tl.program_id(1) * HB
    base, n = row_bounds(idx_ptr, idx_s0, idx_s1, width, len_ptr, len_s0, indptr_ptr, row, ragged, has_len,
                         CNT_BLOCK)
    offs_h = h0 + tl.arange(0, HB)
    hmask = offs_h < H
    dim3 = tl.arange(0, NCH)[:, None, None] * CH + tl.arange(0, CH)[None, None, :]  # [NCH, 1, CH]
    offs_b = NCH * CH + tl.arange(0, BLOCK_B)
    bmask = offs_b < D
    q_row = q_ptr + row.to(tl.int64) * q_s0
    q3 = tl.load(q_row + offs_h[None, :, None] * q_s1 + dim3 * q_s2, mask=hmask[None, :, None], other=0.0)
    qb = tl.zeros([HB, BLOCK_B], q3.dtype)
    if HAS_B:
        qb = tl.load(q_row + offs_h[:, None] * q_s1 + offs_b[None, :] * q_s2, mask=hmask[:, None] & bmask[None, :],
                     other=0.0)
    m = tl.full([HB], float("-inf"), tl.float32)
    l = tl.zeros([HB], tl.float32)
    acc3 = tl.zeros([NCH, HB, CH], tl.float32)
    acc_b = tl.zeros([HB, BLOCK_B], tl.float32)
    for j0 in range(0, n, BLOCK_N):
        offs_n = j0 + tl.arange(0, BLOCK_N)
        in_row = offs_n < n
        slot = tl.load(idx_ptr + base + offs_n.to(tl.int64) * idx_s1, mask=in_row, other=-1).to(tl.int64)
        valid = in_row & (slot >= 0) & (slot < skv)
        krow = kv_ptr + tl.where(valid, slot, 0) * kv_s0
        k3 = tl.load(krow[None, :, None] + dim3 * kv_s2, mask=valid[None, :, None], other=0.0)  # [NCH, BN, CH]
        s = tl.sum(tl.dot(q3, tl.permute(k3, (0, 2, 1))), axis=0)
        kb = tl.zeros([BLOCK_N, BLOCK_B], k3.dtype)
        if HAS_B:
            kb = tl.load(krow[:, None] + offs_b[None, :] * kv_s2, mask=valid[:, None] & bmask[None, :], other=0.0)
            s += mm(qb, tl.trans(kb), IEEE)
        m_new, alpha, p, l = softmax_step(s, valid, m, l, sm_scale2)
        pv = p.to(k3.dtype)
        p3 = tl.broadcast_to(pv[None, :, :], (NCH, HB, BLOCK_N))
        acc3 = acc3 * alpha[None, :, None] + tl.dot(p3, k3)
        if V_B:
            acc_b = acc_b * alpha[:, None] + mm(pv, kb, IEEE)
        m = m_new
    scale = finish_scale(m, l, sink_ptr, offs_h, hmask, sink_s0, has_sink)
    ty = out_ptr.dtype.element_ty
    o_row = out_ptr + row.to(tl.int64) * o_s0
    tl.store(o_row + offs_h[None, :, None] * o_s1 + dim3 * o_s2, (acc3 * scale[None, :, None]).to(ty),
             mask=hmask[None, :, None] & (dim3 < lanes))
    if V_B:
        tl.store(o_row + offs_h[:, None] * o_s1 + offs_b[None, :] * o_s2, (acc_b * scale[:, None]).to(ty),
                 mask=hmask[:, None] & (offs_b[None, :] < lanes))


def launch3(args, bn=64, warps=4, stages=2):
    """Launch the 3-D variant like triton_prefill.launch (no dtype fallback: an experiment only)."""
    from dispatcher.kernels.triton_prefill import HEAD_BLOCK, count_block, pack
    q, kv, out = args.q, args.kv, args.output
    rows, heads, head_dim = q.shape
    p = pack(args)
    _prefill3[(rows, triton.cdiv(heads, HEAD_BLOCK))](
        q, kv, p.idx, p.length, p.indptr, p.sink, out,
        p.skv, p.width, heads, p.sm_scale2, p.ragged, p.has_len, p.has_sink, p.lanes,
        q.stride(0), q.stride(1), q.stride(2), kv.stride(0), kv.stride(2), p.idx_s0, p.idx_s1, p.len_s0,
        p.sink.stride(0) if p.has_sink else 0, out.stride(0), out.stride(1), out.stride(2),
        D=head_dim, CH=p.block_a // 4, NCH=4, BLOCK_B=p.block_b, HAS_B=p.has_b, V_B=p.v_b, BLOCK_N=bn,
        HB=HEAD_BLOCK, IEEE=p.ieee, CNT_BLOCK=count_block(p.width), num_warps=warps, num_stages=stages)


if __name__ == "__main__":
    import sys
    from pathlib import Path
    import torch
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from dispatcher.kernels import triton_prefill
    from dispatcher.kernels.torch_ref import ragged_prefill as torch_ref
    from dispatcher.sweep.grid import Layout, default_kv_len
    from dispatcher.sweep.inputs import make_sets
    from dispatcher.sweep.timing import GpuTimer
    dev = torch.device("cuda")
    timer = GpuTimer(dev)
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    for _ in range(100):
        x @ x
    for rows in (16384, 2):
        sets = make_sets(rows, 2048, 16, Layout(512, 64), default_kv_len(rows, 2048), dtype=torch.bfloat16, device=dev)
        ref = sets[0]._replace(output=torch.empty(sets[0].output.shape, dtype=torch.float32, device=dev))
        torch_ref(ref)
        cands = [("chosen 2-D chunks", triton_prefill.launch)] + [
            (f"3-D ({bn},{w},{st})", (lambda a, bn=bn, w=w, st=st: launch3(a, bn, w, st)))
            for bn, w, st in ((64, 4, 2), (32, 4, 2), (64, 8, 2), (32, 8, 2), (32, 8, 3), (64, 8, 1), (16, 4, 2))]
        for name, fn in cands:
            try:
                a = sets[0]._replace(output=torch.full_like(sets[0].output, float("nan")))
                fn(a)
                err = float((a.output.float() - ref.output).norm() / ref.output.norm())
                t = timer.time(fn, sets, warmup=2, repeats=10 if rows > 4096 else 50)
                print(f"{rows:6} rows {name:20} {t.median_us:9.1f} us  err {err:.1e}", flush=True)
            except Exception as exc:  # noqa: BLE001
                print(f"{rows:6} rows {name:20} FAILED {exc.__class__.__name__}: {str(exc)[:200]}", flush=True)
