"""How ``gluon_sm90_ws`` reads an fp8 pool (e4m3fn, e5m2): each tile's bytes land inside the q-dtype stage half
(and rope buffer) they become, and the softmax warpgroup whose tile it is converts them there, in place, exactly.

So the stages keep their size and number, and the products read q-dtype tiles as with a 16-bit pool.
``_as_blocks`` gives the byte view the loader gathers into, ``_expand_half`` and ``_expand_rope`` the
conversions, ``_kv8_mode`` the compile-time choice of ``fp8_ptx``'s PTX from the pointers' element types. An fp8
pool's prefill is slower than a bf16 pool's (8.8-9.0 ms at 16,384 rows, 512+64, against 5.3), and cannot reach
it: the conversion writes the bf16 tile a bf16 pool's gather writes, after reading the fp8 one (docs/benchmarks.md,
"fp8 kv pools").
"""

from __future__ import annotations

from .gluon_sm90_parts import HAVE_GLUON

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared

    from . import fp8_ptx
    from .gluon_sm90_parts import _fp8_to, cta_barrier

    if hasattr(gl.shared_memory_descriptor, "reinterpret"):  # Triton 3.9's name for 3.6's _reinterpret

        @gluon.jit
        def _as_blocks(buf, n: gl.constexpr):
            """A q-dtype buffer as ``n`` 4 KB blocks of [64, 64] bytes, in order (an fp8 pool's landing view)."""
            return buf.reinterpret(gl.uint8, [n, 64, 64], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    else:

        @gluon.jit
        def _as_blocks(buf, n: gl.constexpr):
            return buf._reinterpret(gl.uint8, [n, 64, 64], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))

    _TORCH_NAMES = {"fp8e4nv": "float8_e4m3fn", "fp8e5": "float8_e5m2", "bf16": "bfloat16", "fp16": "float16"}

    @gluon.constexpr_function
    def _kv8_mode(kv_ty, q_ty):
        """``fp8_ptx``'s conversion for a pool of element type ``kv_ty`` beside a ``q_ty`` q; TO for a 16-bit pool."""
        if kv_ty == q_ty:
            return fp8_ptx.TO
        return fp8_ptx.MODES_BY_NAME[(_TORCH_NAMES[str(kv_ty)], _TORCH_NAMES[str(q_ty)])]

    # An fp8 pool: a tile's bytes land inside the q-dtype stage they are converted into, so the stages keep
    # their size and number. ``kv8``/``rp8`` see the stages and rope buffers as 4 KB blocks of
    # [64 slots, 64 lanes] bytes: block 16 s + 8 h + c is bytes [4096 c, 4096 c + 4096) of stage s's half h
    # (its lanes [256 h, 256 h + 256), 32 KB: an NVMMA tile keeps each 64-lane column, 8 KB, contiguous).
    # A half's bytes land in its blocks 4-7, the upper 16 KB, and the rope lanes' in the upper 4 KB of
    # their buffer; the softmax warpgroup whose tile it is converts them where they lie (_expand_half).
    CP8 = gl.constexpr(gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0]))  # 16 bytes a thread, 64 a row

    @gluon.jit
    def _load_rows(blk, r: gl.constexpr):
        """Slots [32 r, 32 r + 32) of a [64 slots, 64 lanes] block of fp8 bytes: 4 registers a thread."""
        return blk.slice(32 * r, 32, dim=0).load(CP8)

    @gluon.jit
    def _store_rows(x, col, r: gl.constexpr, KV8: gl.constexpr):
        """``_load_rows``'s bytes converted into slots [32 r, 32 r + 32) of a 64-lane q-dtype column ``col``."""
        col.slice(32 * r, 32, dim=0).store(_fp8_to(x, KV8))

    @gluon.jit
    def _expand_half(kv8, b0, dst, KV8: gl.constexpr):
        """Half a stage's fp8 bytes (blocks b0 + 4 .. b0 + 7 of ``kv8``) into its 256 q-dtype lanes ``dst``, in place.

        Column c (lanes 64 c .. 64 c + 63) is written over bytes [8 c, 8 c + 8) KB of the half, and its bytes
        lie in block b0 + 4 + c, bytes [16 + 4 c, 20 + 4 c) KB. Columns 0 and 1 overwrite no byte; column 2
        overwrites blocks 4 and 5, column 3 blocks 6 and 7, so each waits until every thread has read those
        (a barrier of this partition's warps). 32 slots of a block at a time: the softmax warpgroups have
        few registers to spare (two whole blocks in registers spilled 248 bytes at 160 registers). The
        compiler adds a barrier between each store and the next load of the stage."""
        for c in gl.static_range(2):
            for r in gl.static_range(2):
                _store_rows(_load_rows(kv8.index(b0 + 4 + c), r), dst.slice(64 * c, 64, dim=1), r, KV8)
        x3a = _load_rows(kv8.index(b0 + 7), 0)
        x3b = _load_rows(kv8.index(b0 + 7), 1)
        cta_barrier()  # blocks 4, 5 and 7 read
        for r in gl.static_range(2):
            _store_rows(_load_rows(kv8.index(b0 + 6), r), dst.slice(128, 64, dim=1), r, KV8)
        cta_barrier()  # block 6 read
        _store_rows(x3a, dst.slice(192, 64, dim=1), 0, KV8)
        _store_rows(x3b, dst.slice(192, 64, dim=1), 1, KV8)
        fence_async_shared()
        cta_barrier()

    @gluon.jit
    def _expand_rope(src, dst, KV8: gl.constexpr):
        """A tile's 64 fp8 rope lanes (``src``, the upper 4 KB of rope buffer ``dst``) into ``dst``, in place."""
        xa = _load_rows(src, 0)
        xb = _load_rows(src, 1)
        cta_barrier()
        _store_rows(xa, dst, 0, KV8)
        _store_rows(xb, dst, 1, KV8)
        fence_async_shared()
        cta_barrier()
