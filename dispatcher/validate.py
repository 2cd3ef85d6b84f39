"""Check a call's tensors and build its CallShape; every error names the argument and the shapes seen."""

from __future__ import annotations

import math

import torch

from .pools import pool_bucket
from .types import CallShape

FLOAT_DTYPES = frozenset(
    {torch.float16, torch.bfloat16, torch.float32}
    | {getattr(torch, n) for n in ("float8_e4m3fnuz", "float8_e4m3fn", "float8_e5m2", "float8_e5m2fnuz") if hasattr(torch, n)}
)
Q_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32})
INDEX_DTYPES = frozenset({torch.int32, torch.int64})

_DTYPE_NAMES: dict[torch.dtype, str] = {}


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bfloat16" (cached: str(dtype) allocates)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def ragged_width(positions: int, rows: int) -> int:
    """A ragged call's index width class: its mean positions a row, up to a power of two (from shapes alone).

    Dense indices give top-k; ragged ones have no width without reading the device, and the row
    widths of one call differ. The class keeps latency tables usable (they are timed at top-k
    128, 512, 2048) and the number of distinct call shapes small.
    """
    if positions <= 0 or rows <= 0:
        return 0
    mean = -(-positions // rows)
    return 1 << (mean - 1).bit_length()


def _shape(t: torch.Tensor) -> str:
    return str(list(t.shape))


def _is_tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    return t  # type: ignore[return-value]


def validate(
    q: object,
    kv: object,
    indices: object,
    topk_length: object,
    scale: object,
    head_dim: object,
    nope_head_dim: object,
    rope_head_dim: object,
    attn_sink: object,
    output: object,
    ragged_indices: object = None,
    ragged_indptr: object = None,
) -> CallShape:
    """Raise ValueError on anything a kernel would choke on; return the facts the policy reads.

    Rejected, naming the argument: a non-tensor, a wrong shape or dtype, an empty kv pool
    (``kv`` of shape [0, 1, D]: no slot to attend to), a tensor on the ``meta`` device (no data:
    nothing would be computed), tensors on different devices. Index values are not checked (that
    would read device memory on every call); their contract is vLLM's
    ``build_ragged_indices_from_dense``: positions at or past ``topk_length[i]`` (or, when it is
    None, past the count of entries >= 0 in row i) are ignored, and entries inside a row's length
    that are negative or >= skv are skipped; a row with no valid slot outputs 0. NaN in ``q``
    is not checked either: it propagates to that row's output as NaN, as in the float64 reference.
    """
    q = _is_tensor("q", q)
    kv = _is_tensor("kv", kv)
    output = _is_tensor("output", output)
    if q.device.type == "meta":
        raise ValueError("q is on meta: the meta device holds no data, so no kernel can compute on it")
    for name, v in (("head_dim", head_dim), ("nope_head_dim", nope_head_dim), ("rope_head_dim", rope_head_dim)):
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
            raise ValueError(f"{name} must be a non-negative int; got {v!r}")
    if not (nope_head_dim > 0):
        raise ValueError(f"nope_head_dim must be > 0; got {nope_head_dim}")
    if not (head_dim == nope_head_dim + rope_head_dim):
        raise ValueError(f"head_dim {head_dim} != nope_head_dim {nope_head_dim} + rope_head_dim {rope_head_dim}")
    if not (isinstance(scale, (int, float)) and not isinstance(scale, bool) and math.isfinite(scale)):
        raise ValueError(f"scale must be a finite number; got {scale!r}")
    if not (q.dim() == 3):
        raise ValueError(f"q must be [sq, H, D]; got shape {_shape(q)}")
    rows, heads, qd = q.shape
    if not (qd == head_dim):
        raise ValueError(f"q's last dim {qd} != head_dim {head_dim} (q shape {_shape(q)})")
    if not (q.dtype in Q_DTYPES):
        raise ValueError(f"q dtype must be float16, bfloat16 or float32; got {q.dtype}")
    if not (kv.dim() == 3 and kv.shape[1] == 1):
        raise ValueError(f"kv must be [skv, 1, D]; got shape {_shape(kv)}")
    if not (kv.shape[2] == head_dim):
        raise ValueError(f"kv's last dim {kv.shape[2]} != head_dim {head_dim} (kv shape {_shape(kv)})")
    if not (kv.shape[0] > 0):
        raise ValueError(f"kv is an empty pool (shape {_shape(kv)}): at least one slot is needed")
    if not (kv.dtype in FLOAT_DTYPES):
        raise ValueError(f"kv dtype must be a float type; got {kv.dtype}")
    if not (output.dim() == 3):
        raise ValueError(f"output must be [sq, H, nope] or [sq, H, D]; got shape {_shape(output)}")
    if not (output.shape[0] == rows and output.shape[1] == heads and output.shape[2] in (nope_head_dim, head_dim)):
        raise ValueError(f"output must be [{rows}, {heads}, {nope_head_dim}] or [{rows}, {heads}, {head_dim}]; got {_shape(output)}")
    if not (output.dtype in Q_DTYPES):
        raise ValueError(f"output dtype must be float16, bfloat16 or float32; got {output.dtype}")

    ragged = ragged_indptr is not None or ragged_indices is not None
    topk = 0
    if ragged:
        if not (ragged_indptr is not None and ragged_indices is not None):
            raise ValueError("ragged_indices and ragged_indptr come together; got only "
            + ("ragged_indices" if ragged_indices is not None else "ragged_indptr"))
        ri = _is_tensor("ragged_indices", ragged_indices)
        rp = _is_tensor("ragged_indptr", ragged_indptr)
        if not (ri.dim() == 1 and ri.dtype in INDEX_DTYPES):
            raise ValueError(f"ragged_indices must be 1-D int32/int64; got {_shape(ri)} {ri.dtype}")
        if not (rp.dim() == 1 and rp.shape[0] == rows + 1 and rp.dtype in INDEX_DTYPES):
            raise ValueError(f"ragged_indptr must be [{rows + 1}] int32/int64; got {_shape(rp)} {rp.dtype}")
        topk = ragged_width(int(ri.shape[0]), rows)
    if indices is not None:
        idx = _is_tensor("indices", indices)
        if not (idx.dim() == 2 and idx.shape[0] == rows):
            raise ValueError(f"indices must be [{rows}, topk]; got {_shape(idx)}")
        if not (idx.dtype in INDEX_DTYPES):
            raise ValueError(f"indices dtype must be int32 or int64; got {idx.dtype}")
        topk = int(idx.shape[1])
    else:
        if not (ragged):
            raise ValueError("indices is None and no ragged_indices/ragged_indptr were given")
    if topk_length is not None:
        tl = _is_tensor("topk_length", topk_length)
        if not (tl.dim() == 1 and tl.shape[0] == rows and tl.dtype in INDEX_DTYPES):
            raise ValueError(f"topk_length must be [{rows}] int32/int64; got {_shape(tl)} {tl.dtype}")

    sink_ok = False
    if attn_sink is not None:
        sink = _is_tensor("attn_sink", attn_sink)
        if not (sink.dim() == 1 and sink.shape[0] == heads):
            raise ValueError(f"attn_sink must be [{heads}]; got {_shape(sink)}")
        sink_ok = sink.dtype == torch.float32

    device = q.device
    others = [("kv", kv), ("output", output), ("indices", indices), ("topk_length", topk_length),
              ("attn_sink", attn_sink), ("ragged_indices", ragged_indices), ("ragged_indptr", ragged_indptr)]
    for name, t in others:
        if t is not None and t.device != device:  # type: ignore[union-attr]
            why = " (the meta device holds no data)" if t.device.type == "meta" else ""  # type: ignore[union-attr]
            raise ValueError(f"{name} is on {t.device} but q is on {device}{why}")  # type: ignore[union-attr]

    return CallShape(
        rows,
        heads,
        head_dim,
        nope_head_dim,
        rope_head_dim,
        dtype_name(q.dtype),
        dtype_name(kv.dtype),
        dtype_name(output.dtype),
        int(output.shape[2]),
        topk,
        attn_sink is not None,
        sink_ok,
        True,
        q.stride(-1) == 1 and kv.stride(-1) == 1 and output.stride(-1) == 1,
        output.stride() == q.stride(),
        ragged,
        pool_bucket(kv.nbytes),  # kv is [skv, 1, D]: its bytes are the pool's
    )
