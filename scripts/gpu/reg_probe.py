"""Speed-of-light probe: a prefill whose kv tiles never pass through shared memory.

Every production Hopper prefill gathers a 64-slot kv tile into shared memory (cp.async) and
lets wgmma read it twice (scores, then P·V): about 2,060 shared-memory wavefronts per tile, the
bound at 512+64 (docs/benchmarks.md, session 5). This probe asks what the other data path costs:
each warp loads its kv rows from global memory straight into mma.sync's B-operand registers
(16-byte loads; ``k_width`` = 8 lets a thread hold 8 consecutive lanes, the mma's k order being
permuted the same way for q), computes the scores with ``mma_v2``, turns the same registers
into P·V's B operand, and runs P·V.

A row's four warps split the lanes, not the slots: warp w holds kv lanes 128w..128w+127 and
rope lanes 512+16w..512+16w+15, so its P·V needs no data from another warp. Its scores are
then a partial sum over its lanes. The probe runs each warp as its own one-warp program (grid
rows x 4). MODE (``--variants MODE:T[p]``, T slots a tile, p: the next tile's loads issued first):

- 1: the compiler transposes the tile for P·V (through shared memory), no exchange;
- 2: as 1, plus a stand-in for the partial scores' exchange (one shared-memory store, four reads);
- 3: the transpose in registers (``movmatrix``, ``_transposed``), no exchange;
- 4: as 3, plus the exchange stand-in.

Timings are real. Outputs are each warp's attention over its own lanes' partial scores, not the
row's attention: ``check`` compares MODE 1 with torch computing that, and every other variant
with MODE 1 or 2. On an H200 (S10-4) the best variant took 7.24 ms at 16,384 rows, 512+64,
against 5.47 ms for the production prefill, and 5.95 ms with no gathers at all: the path is out.

    python3 scripts/gpu/reg_probe.py            # on the GPU: times the probe beside the production prefill
    python3 scripts/gpu/reg_probe.py --compile  # here, under Triton 3.6: registers, spills, SASS mix
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


@gluon.jit
def _transposed(kb, T: gl.constexpr):
    """kb [128 lanes, T slots] in mma_v2's B layout (k_width 8) as P·V's B operand [T, 128 lanes'].

    Each 32-bit register pair goes through ``movmatrix.trans`` (an 8x8 transpose across the
    warp), which the compiler sees as elementwise; the reshape/permute that follows relabels
    the tensor so its labels say what the registers now hold. Its layout is then P·V's B
    layout (k_width 2) up to register order, and the lane index comes out permuted: lane'
    bits (1, 2) are lane bits (3, 4) and the other way round (the caller un-permutes at its
    store)."""
    pairs = gl.permute(gl.reshape(kb, [64, 2, T]), [0, 2, 1])
    lo, hi = gl.split(pairs)
    lo, hi = gl.inline_asm_elementwise(
        "{ .reg .b32 a, b; mov.b32 a, {$2, $3}; movmatrix.sync.aligned.m8n8.trans.b16 b, a; mov.b32 {$0, $1}, b; }",
        "=h,=h,h,h", [lo, hi], dtype=(lo.dtype, lo.dtype), is_pure=True, pack=1)
    y = gl.reshape(gl.permute(gl.join(lo, hi), [0, 2, 1]), [2, 2, 2, 2, 2, 2, 2, T // 8, 2, 2, 2])
    return gl.reshape(gl.permute(y, [7, 2, 3, 6, 0, 1, 4, 5, 8, 9, 10]), [T, 128])


@gluon.jit
def _tile(kv_ptr, idx_row, skv, t, width, w, n, nr, kk, kr):
    """One tile's kv lanes (128) and rope lanes (16) of this warp, straight into B-operand registers.

    The rope lanes take k_width 2: with k_width 8 a single k-step of 16 lanes is a layout with
    broadcast registers, and mma_v2 over it gave wrong scores (S10-1, S10-2: 3.6e-2 off)."""
    pos = t + n
    slot = gl.load(idx_row + pos, mask=pos < width, other=-1)
    base = kv_ptr + slot.to(gl.int64)[None, :] * skv
    kb = gl.load(base + (w * 128 + kk)[:, None], mask=(slot >= 0)[None, :], other=0.0)
    slot_r = gl.load(idx_row + t + nr, mask=t + nr < width, other=-1)
    rb = gl.load(kv_ptr + slot_r.to(gl.int64)[None, :] * skv + (512 + w * 16 + kr)[:, None],
                 mask=(slot_r >= 0)[None, :], other=0.0)
    return kb, rb


@gluon.jit
def _probe(q_ptr, kv_ptr, idx_ptr, out_ptr, skv, width, q_s0, idx_s0, o_s0, sm_scale2,
           MODE: gl.constexpr, T: gl.constexpr, PF: gl.constexpr):
    r = gl.program_id(0)
    w = gl.program_id(1)
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    qa_l: gl.constexpr = gl.DotOperandLayout(0, mma, 8)
    kb_l: gl.constexpr = gl.DotOperandLayout(1, mma, 8)
    pa_l: gl.constexpr = gl.DotOperandLayout(0, mma, 2)
    vb_l: gl.constexpr = gl.DotOperandLayout(1, mma, 2)
    dt: gl.constexpr = kv_ptr.dtype.element_ty

    # q: this warp's 128 + 16 lanes of the row's 16 heads, resident in registers
    h = gl.arange(0, 16, layout=gl.SliceLayout(1, qa_l))
    qk = gl.arange(0, 128, layout=gl.SliceLayout(0, qa_l))
    qr = gl.arange(0, 16, layout=gl.SliceLayout(0, pa_l))
    q_base = q_ptr + r.to(gl.int64) * q_s0
    qa = gl.load(q_base + h[:, None] * 576 + (w * 128 + qk)[None, :])
    hb = gl.arange(0, 16, layout=gl.SliceLayout(1, pa_l))  # the rope lanes: one k-step, so k_width 2 (see _tile)
    qb = gl.load(q_base + hb[:, None] * 576 + (512 + w * 16 + qr)[None, :])

    kk = gl.arange(0, 128, layout=gl.SliceLayout(1, kb_l))
    kr = gl.arange(0, 16, layout=gl.SliceLayout(1, vb_l))
    n = gl.arange(0, T, layout=gl.SliceLayout(0, kb_l))
    nr = gl.arange(0, T, layout=gl.SliceLayout(0, vb_l))
    s_l: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    s_smem = gl.allocate_shared_memory(gl.float32, [4, 16, T], s_l)
    for i in gl.static_range(4):
        s_smem.index(i).store(gl.zeros([16, T], gl.float32, mma))

    m = gl.full([16], -1.0e30, gl.float32, gl.SliceLayout(1, mma))
    lsum = gl.zeros([16], gl.float32, gl.SliceLayout(1, mma))
    acc = gl.zeros([16, 128], gl.float32, mma)
    idx_row = idx_ptr + r.to(gl.int64) * idx_s0
    kb, rb = _tile(kv_ptr, idx_row, skv, 0, width, w, n, nr, kk, kr)
    for t in range(0, width, T):
        if PF:  # the next tile's loads issued before this tile's products (registers for two tiles)
            kb_next, rb_next = _tile(kv_ptr, idx_row, skv, t + T, width, w, n, nr, kk, kr)
        else:
            kb, rb = _tile(kv_ptr, idx_row, skv, t, width, w, n, nr, kk, kr)
            kb_next, rb_next = kb, rb
        s = mma_v2(qa, kb, gl.zeros([16, T], gl.float32, mma))
        s = mma_v2(qb, rb, s)
        if MODE % 2 == 0:  # the partial scores' exchange: one store, four buffers read back
            gl.thread_barrier()
            s_smem.index(0).store(s)
            gl.thread_barrier()
            s = (s_smem.index(0).load(mma) + s_smem.index(1).load(mma)
                 + s_smem.index(2).load(mma) + s_smem.index(3).load(mma))
        ns = t + gl.arange(0, T, layout=gl.SliceLayout(0, mma))  # -1 slots out of the softmax
        s = gl.where((gl.load(idx_row + ns) >= 0)[None, :], s * sm_scale2, float("-inf"))
        m_new = gl.maximum(m, gl.max(s, 1))
        alpha = gl.exp2(m - m_new)
        p = gl.exp2(s - m_new[:, None])
        lsum = lsum * alpha + gl.sum(p, 1)
        m = m_new
        acc = acc * alpha[:, None]
        pa = gl.convert_layout(p.to(dt), pa_l)
        if MODE >= 3:  # the transpose in registers: movmatrix, then a relabelling the compiler does for free
            vb = gl.convert_layout(_transposed(kb, T), vb_l)
        else:  # the compiler's transpose (through shared memory)
            vb = gl.convert_layout(gl.permute(kb, [1, 0]), vb_l)
        acc = mma_v2(pa, vb, acc)
        kb, rb = kb_next, rb_next
    o = acc / lsum[:, None]
    od = gl.arange(0, 128, layout=gl.SliceLayout(0, mma))
    if MODE >= 3:  # P·V's columns come out in _transposed's order: lane bits 1-2 and 3-4 swapped
        od = (od & 97) | ((od >> 3) & 3) << 1 | ((od >> 1) & 3) << 3
    oh = gl.arange(0, 16, layout=gl.SliceLayout(1, mma))
    gl.store(out_ptr + r.to(gl.int64) * o_s0 + oh[:, None] * 512 + (w * 128 + od)[None, :], o.to(dt))


def launch(a, mode: int, tile: int, pf: bool = False) -> None:
    rows = a.q.shape[0]
    idx = a.index.indices
    _probe[(rows, 4)](a.q, a.kv, idx, a.output, a.kv.stride(0), idx.shape[1], a.q.stride(0), idx.stride(0),
                      a.output.stride(0), a.scale * 1.4426950408889634, MODE=mode, T=tile, PF=pf, num_warps=1)


def compile_report(mode: int, tile: int, pf: bool) -> dict:
    """gluon_check's compile for sm_90a (no GPU needed), plus the probe's own instruction counts."""
    from gluon_check import compile_one

    got = compile_one(_probe, {"MODE": mode, "T": tile, "PF": pf}, num_warps=1)
    sass = Path("/tmp/_gluon__probe.sass").read_text()
    return {**got, "hmma": sass.count("HMMA"), "movm": sass.count("MOVM"), "ldg128": sass.count("LDG.E.128")}


def parse(spec: str) -> list[tuple[int, int, bool]]:
    """``MODE:T[p],...`` (p: prefetch the next tile) into (mode, tile, prefetch)."""
    out = []
    for item in spec.split(","):
        mode, tile = item.split(":")
        out.append((int(mode), int(tile.rstrip("p")), tile.endswith("p")))
    return out


def check(a, variants, log) -> None:
    """MODE 1 against a torch reference of what it computes (each warp's softmax over its own lanes' partial
    scores), on the first rows; every other variant against MODE 1 of its exchange kind, which computes the
    same thing a different way (MODE 3 and 4 transpose in registers; 2 and 4 add three zero buffers)."""
    import torch

    n = a.q.shape[0]
    pick = torch.tensor([0, 1, 7, 1500, n - 2, n - 1], device=a.q.device)  # short rows (-1 slots) and full ones
    rows = len(pick)
    q, kv, idx = a.q[pick].float(), a.kv[:, 0].float(), a.index.indices[pick].long()
    ref = torch.empty(rows, 16, 512, device=q.device)
    for w in range(4):
        lanes = torch.cat([torch.arange(128 * w, 128 * w + 128), torch.arange(512 + 16 * w, 528 + 16 * w)]).to(q.device)
        k = kv[idx.clamp(min=0)][:, :, lanes]  # rows, topk, 144
        s = torch.einsum("rhd,rtd->rht", q[:, :, lanes], k) * a.scale
        s = s.masked_fill((idx < 0)[:, None, :], float("-inf"))
        v = kv[idx.clamp(min=0)][:, :, 128 * w:128 * w + 128]
        ref[:, :, 128 * w:128 * w + 128] = torch.einsum("rht,rtd->rhd", s.softmax(-1), v)
    outs = {}
    for mode, tile, pf in sorted(set(variants) | {(1, 16, False), (2, 16, False)}):
        a.output.zero_()
        launch(a, mode, tile, pf)
        outs[(mode, tile, pf)] = a.output[pick].float().clone()
    base = outs[(1, 16, False)]
    log(f"check: MODE 1 T=16 against torch: max abs err {(base - ref).abs().max().item():.3e} "
        f"(outputs up to {ref.abs().max().item():.3e})")
    for key, o in outs.items():
        other = outs[(2 - key[0] % 2, 16, False)]
        log(f"check: MODE {key[0]} T={key[1]}{' prefetch' * key[2]} against MODE {2 - key[0] % 2} T=16: "
            f"max abs diff {(o - other).abs().max().item():.3e}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--variants", default="1:16,2:16,3:16,4:16,3:32,4:32,3:16p,4:16p")
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--patterns", default="random",
                    help="index patterns (ws_probe.py's): random, invalid (no gather traffic), hot64 (L2 hits)")
    opt = ap.parse_args()
    variants = parse(opt.variants)
    if opt.compile:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        for mode, tile, pf in variants:
            print(f"MODE={mode} T={tile} PF={pf}", compile_report(mode, tile, pf), flush=True)
        return

    import torch
    import triton

    from dispatcher.kernels import gluon_sm90
    from dispatcher.sweep.grid import Layout, default_kv_len
    from dispatcher.sweep.inputs import make_sets
    from dispatcher.sweep.timing import GpuTimer

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from kernel_lab import lab_output, save_results, warm_clocks

    dev = torch.device("cuda")
    out, log = lab_output()
    rec = []
    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    warm_clocks(dev, 2.0)
    lay = Layout(512, 64)
    sets = make_sets(opt.rows, 2048, 16, lay, default_kv_len(opt.rows, 2048), dtype=torch.bfloat16, device=dev)
    try:
        check(sets[0], variants, log)
    except Exception as e:  # keep timing: the check is what tells a wrong variant, the log says it failed
        log(f"check failed: {type(e).__name__}: {str(e)[:400]}")
    from ws_probe import patterned

    runs = [("production prefill", gluon_sm90.launch_prefill)]
    runs += [(f"probe MODE={mo} T={ti}{' prefetch' * pf}", lambda a, mo=mo, ti=ti, pf=pf: launch(a, mo, ti, pf))
             for mo, ti, pf in variants]
    for pattern in opt.patterns.split(","):
        psets = patterned(sets, pattern)
        for _ in range(2):  # twice through, interleaved, so drift shows
            for name, fn in runs:
                try:
                    fn(psets[0])
                    torch.cuda.synchronize()
                except Exception as e:  # a variant that does not build is reported, the rest still run
                    log(f"{name}: {type(e).__name__}: {str(e)[:300]}")
                    continue
                t = GpuTimer(dev).time(fn, psets, warmup=2, repeats=10)
                rec.append(dict(layout="512+64", rows=opt.rows, pattern=pattern, name=name, median_us=t.median_us,
                                p20_us=t.p20_us, p80_us=t.p80_us))
                log(f"512+64 {opt.rows} {pattern:8} {name:34} {t.median_us:9.1f} us (p20 {t.p20_us:.1f}, "
                    f"p80 {t.p80_us:.1f})")
    save_results(out, "reg_probe", results=rec)
    log("done")


if __name__ == "__main__":
    main()
