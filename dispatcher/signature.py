"""Validation once per call signature: a repeated call checks only what can change (its data, never its layout).

``validate`` reads every tensor's rank, shape, dtype, strides and device and the scalars; its
answer (a ``CallShape``, or an error) depends on nothing else. So a call whose tensors have the
same shapes, strides, dtypes and devices, with the same scalars, gets the same ``CallShape``:
``ValidatedCalls`` keeps it under that signature. Only successful validations are kept (a
malformed call raises every time), the scalars must be exact ``int``s and a plain number (a
``64.0`` head dim is not ``64``), anything that is not a tensor goes to ``validate`` itself,
and the cache is bounded.
"""

from __future__ import annotations

from typing import Any

from .types import CallShape
from .validate import validate

MAX_SIGNATURES = 1024


def _tensor_key(t: Any) -> Any:
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


class ValidatedCalls:
    """``validate`` memoised by call signature, for one dispatcher; each signature also gets a memo dict, which
    launches use to keep what they compute for calls of that signature (``kernels.plan``)."""

    __slots__ = ("_shapes",)

    def __init__(self) -> None:
        self._shapes: dict[tuple, tuple[CallShape, dict]] = {}

    def __call__(self, q: Any, kv: Any, indices: Any, topk_length: Any, scale: Any, head_dim: Any,
                 nope_head_dim: Any, rope_head_dim: Any, attn_sink: Any, output: Any, ragged_indices: Any = None,
                 ragged_indptr: Any = None) -> tuple[CallShape, dict | None]:
        """(the call's shape, its signature's memo); the memo is None for a call not kept (odd scalars, full)."""
        try:
            if type(head_dim) is not int or type(nope_head_dim) is not int or type(rope_head_dim) is not int:
                raise TypeError  # noqa: TRY301 - validate names what is wrong
            if type(scale) is not float and type(scale) is not int:
                raise TypeError  # noqa: TRY301
            key = (q.shape, q.stride(), q.dtype, q.device, kv.shape, kv.stride(), kv.dtype, kv.device,
                   output.shape, output.stride(), output.dtype, output.device,
                   None if indices is None else _tensor_key(indices),
                   None if topk_length is None else _tensor_key(topk_length),
                   None if attn_sink is None else _tensor_key(attn_sink),
                   None if ragged_indices is None else _tensor_key(ragged_indices),
                   None if ragged_indptr is None else _tensor_key(ragged_indptr),
                   scale, head_dim, nope_head_dim, rope_head_dim)
            hit = self._shapes.get(key)
        except (AttributeError, TypeError):  # not tensors, or odd scalars: the full check says what is wrong
            return validate(q, kv, indices, topk_length, scale, head_dim, nope_head_dim, rope_head_dim,
                            attn_sink, output, ragged_indices, ragged_indptr), None
        if hit is not None:
            return hit
        shape = validate(q, kv, indices, topk_length, scale, head_dim, nope_head_dim, rope_head_dim,
                         attn_sink, output, ragged_indices, ragged_indptr)
        if len(self._shapes) >= MAX_SIGNATURES:
            return shape, None
        entry = self._shapes[key] = (shape, {})
        return entry
