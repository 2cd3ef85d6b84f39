"""Classify a call's batch as prefill, mixed or pure decode from host-side facts only.

Reading a device tensor here would be a host-device sync on every attention call, so device
tensors are refused outright; with no metadata at all the class is ``unknown``, never a guess.
"""

from __future__ import annotations

from collections.abc import Sequence

from .types import UNKNOWN_BATCH, Batch, CallClass


def _host_ints(query_lens: object) -> Sequence[int]:
    if hasattr(query_lens, "device") and hasattr(query_lens, "tolist"):
        device = str(getattr(query_lens, "device"))
        if device != "cpu":
            raise ValueError(
                f"query_lens is a tensor on {device}: reading it would sync the device; "
                "pass a host list or vLLM's host-side counts (num_decodes, num_decode_tokens)"
            )
        return query_lens.tolist()  # type: ignore[attr-defined]
    if isinstance(query_lens, (str, bytes)) or not isinstance(query_lens, Sequence):
        raise ValueError(f"query_lens must be a sequence of ints; got {type(query_lens).__name__}")
    return query_lens


def classify_query_lens(query_lens: object, *, spec_tokens: int = 0, rows: int | None = None) -> Batch:
    """Decode requests have query length <= 1 + spec_tokens (MTP verify makes it 2-6)."""
    lens = _host_ints(query_lens)
    if len(lens) == 0:
        raise ValueError("query_lens is empty: a call carries at least one request")
    limit = 1 + spec_tokens
    decode_rows = 0
    decode_requests = 0
    total = 0
    for n in lens:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"query_lens entries must be integers >= 1; got {n!r}")
        total += n
        if n <= limit:
            decode_rows += n
            decode_requests += 1
    if rows is not None and total != rows:
        raise ValueError(f"query_lens sum to {total} but q has {rows} rows (q.shape[0])")
    if decode_requests == len(lens):
        cls = CallClass.PURE_DECODE
    elif decode_requests == 0:
        cls = CallClass.PREFILL
    else:
        cls = CallClass.MIXED
    return Batch(cls, decode_rows, decode_requests, len(lens))


def classify_counts(
    *,
    rows: int,
    num_decodes: int,
    num_decode_tokens: int,
    num_prefills: int | None = None,
) -> Batch:
    """vLLM's attention metadata puts decode rows first and counts them on the host."""
    for name, value in (("rows", rows), ("num_decodes", num_decodes), ("num_decode_tokens", num_decode_tokens)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer; got {value!r}")
    if num_decode_tokens > rows:
        raise ValueError(f"num_decode_tokens {num_decode_tokens} exceeds the call's {rows} rows")
    if num_decode_tokens < num_decodes:
        raise ValueError(f"num_decode_tokens {num_decode_tokens} < num_decodes {num_decodes}")
    if num_decodes == 0:
        cls = CallClass.PREFILL
    elif num_decode_tokens == rows or num_prefills == 0:
        cls = CallClass.PURE_DECODE
    else:
        cls = CallClass.MIXED
    requests = num_decodes + (num_prefills or 0)
    return Batch(cls, num_decode_tokens, num_decodes, requests)


def classify(
    *,
    rows: int,
    query_lens: object | None = None,
    num_decodes: int | None = None,
    num_decode_tokens: int | None = None,
    num_prefills: int | None = None,
    spec_tokens: int = 0,
) -> Batch:
    """Whichever host-side facts are given; none at all means ``unknown``."""
    if query_lens is not None:
        return classify_query_lens(query_lens, spec_tokens=spec_tokens, rows=rows)
    if num_decodes is not None and num_decode_tokens is not None:
        return classify_counts(
            rows=rows, num_decodes=num_decodes, num_decode_tokens=num_decode_tokens, num_prefills=num_prefills
        )
    if num_decodes is not None or num_decode_tokens is not None:
        raise ValueError("num_decodes and num_decode_tokens come together")
    return UNKNOWN_BATCH


MAX_COUNTS = 4096


class CountsCache:
    """``classify`` for calls that carry vLLM's host-side counts, memoised by (rows, num_decodes,
    num_decode_tokens, num_prefills): a serving loop repeats a few such tuples, and a ``Batch`` is immutable.
    Only answers are kept (counts that contradict the rows raise every time), only plain ``int`` counts are keys
    (anything else, and ``query_lens``, is classified afresh, and so checked), and past ``MAX_COUNTS`` tuples the
    cache stops storing. One per dispatcher."""

    __slots__ = ("_batches",)

    def __init__(self) -> None:
        self._batches: dict[tuple, Batch] = {}

    def __call__(self, *, rows: int, query_lens: object | None, num_decodes: int | None,
                 num_decode_tokens: int | None, num_prefills: int | None, spec_tokens: int) -> Batch:
        if (query_lens is None and type(num_decodes) is int and type(num_decode_tokens) is int
                and (num_prefills is None or type(num_prefills) is int)):  # plain ints: a key means one answer
            key = (rows, num_decodes, num_decode_tokens, num_prefills)
            batch = self._batches.get(key)
            if batch is None:
                batch = classify_counts(rows=rows, num_decodes=num_decodes, num_decode_tokens=num_decode_tokens,
                                        num_prefills=num_prefills)
                if len(self._batches) < MAX_COUNTS:
                    self._batches[key] = batch
            return batch
        return classify(rows=rows, query_lens=query_lens, num_decodes=num_decodes,
                        num_decode_tokens=num_decode_tokens, num_prefills=num_prefills, spec_tokens=spec_tokens)

    def __len__(self) -> int:
        return len(self._batches)
