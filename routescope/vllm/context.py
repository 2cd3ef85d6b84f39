"""What vLLM knows about the current call, read from host-side values only.

The batch facts come from the forward context's attention metadata (``num_decodes``,
``num_decode_tokens``, ``num_prefills``, ``num_prefill_tokens``, ``num_actual_tokens``,
``max_query_len``): Python ints on the host. Device tensors (``query_start_loc``) are
never read, since that would be a host-device sync on every attention call.
"""

from __future__ import annotations

import logging
import numbers
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from dispatcher.types import UNKNOWN_BATCH, Batch, CallClass

log = logging.getLogger("vllm.routescope")

SCAN_LIMIT = 16  # metadata objects looked at per call before giving up


class Counts(NamedTuple):
    """Host-side batch counts of one attention metadata object (None: the object has no such field)."""

    num_decodes: int
    num_decode_tokens: int
    num_prefills: int | None = None
    num_prefill_tokens: int | None = None
    num_actual_tokens: int | None = None
    max_query_len: int | None = None

    @property
    def total(self) -> int | None:
        if self.num_actual_tokens is not None:
            return self.num_actual_tokens
        if self.num_prefill_tokens is not None:
            return self.num_decode_tokens + self.num_prefill_tokens
        return None


def _host_int(value: Any) -> int | None:
    """A Python or NumPy integer; anything else (a tensor above all) is None, never converted."""
    t = type(value)
    if t is int:
        return value
    if value is None or t is bool or not isinstance(value, numbers.Integral):
        return None
    return int(value)


def counts_of(md: Any) -> Counts | None:
    nd = _host_int(getattr(md, "num_decodes", None))
    ndt = _host_int(getattr(md, "num_decode_tokens", None))
    if nd is None or ndt is None:
        return None
    return Counts(
        nd, ndt,
        _host_int(getattr(md, "num_prefills", None)),
        _host_int(getattr(md, "num_prefill_tokens", None)),
        _host_int(getattr(md, "num_actual_tokens", None)),
        _host_int(getattr(md, "max_query_len", None)),
    )


def _first_counts(values: Iterable[Any]) -> Counts | None:
    for i, md in enumerate(values):
        if i >= SCAN_LIMIT:
            return None
        c = counts_of(md)
        if c is not None:
            return c
    return None


def find_counts(attn_metadata: Any, rows: int) -> Counts | None:
    """vLLM v1: a dict layer name -> metadata (every layer describes the same batch), or a list of
    such dicts with dual-batch overlap (the micro-batch whose token count equals ``rows`` wins)."""
    if attn_metadata is None:
        return None
    if type(attn_metadata) is dict or isinstance(attn_metadata, Mapping):
        return _first_counts(attn_metadata.values())
    if isinstance(attn_metadata, (list, tuple)):
        found = [c for d in attn_metadata if isinstance(d, Mapping) and (c := _first_counts(d.values())) is not None]
        for c in found:
            if c.total == rows:
                return c
        return found[0] if len(found) == 1 else None
    return counts_of(attn_metadata)


def batch_from_counts(rows: int, c: Counts) -> Batch:
    """Classify the rows this call got against the step's batch; ``unknown`` when they cannot be placed.

    vLLM orders decode rows first. A backend passes the whole batch (GLM: decode rows
    included: rows >= all tokens), or splits the decode rows off and passes prefill rows,
    possibly in chunks (vLLM's DeepSeek-V4 ROCm backend: ``q[num_decode_tokens:]`` in chunks
    of 4 requests: rows <= prefill tokens). Rows between the two cannot be placed: ``unknown``.
    """
    nd, ndt = c.num_decodes, c.num_decode_tokens
    if nd < 0 or ndt < nd or rows < 0:
        return UNKNOWN_BATCH
    prefill_tokens = c.num_prefill_tokens
    total = c.total
    if prefill_tokens is None and total is not None:
        prefill_tokens = total - ndt
    if c.num_prefills is not None:
        has_prefill: bool | None = c.num_prefills > 0
    elif prefill_tokens is not None:
        has_prefill = prefill_tokens > 0
    elif c.max_query_len is not None and nd > 0:
        has_prefill = c.max_query_len > -(-ndt // nd)  # longer than the decode query length
    else:
        has_prefill = None
    prefills = c.num_prefills or 0
    if nd == 0 or ndt == 0:
        return UNKNOWN_BATCH if has_prefill is False else Batch(CallClass.PREFILL, 0, 0, prefills)
    if has_prefill is False:
        return Batch(CallClass.PURE_DECODE, min(rows, ndt), nd, nd)
    if has_prefill is None:
        return UNKNOWN_BATCH
    if total is not None:
        if rows >= total:  # the whole batch (rows beyond it are padding)
            return Batch(CallClass.MIXED, ndt, nd, nd + prefills)
        if prefill_tokens is not None and rows <= prefill_tokens:  # decode rows split off (maybe chunked)
            return Batch(CallClass.PREFILL, 0, 0, prefills)
        return UNKNOWN_BATCH
    if rows > ndt:  # no token totals: as the dispatcher does, the call carries the batch
        return Batch(CallClass.MIXED, ndt, nd, nd + prefills)
    return UNKNOWN_BATCH


class ForwardBatch:
    """Reads the current forward context; any failure reads as ``unknown`` (counted by the caller)."""

    def __init__(self, get_context: Callable[[], Any] | None, is_available: Callable[[], bool] | None) -> None:
        self.get_context = get_context
        self.is_available = is_available
        # (metadata container, rows, batch) of the last call: every layer of a step shares one container.
        # Holding it keeps its id from being reused; it is released at the next step's first call.
        self._last: tuple[Any, int, Batch] | None = None
        # the call's position for an experiment's assignment: (step, call in step). A step is one forward
        # context's metadata container; every tensor-parallel rank runs the same steps and layers in the same
        # order, so every rank numbers a call alike. Calls outside a forward context count on in the last step.
        self.step = 0
        self.index = -1
        self._step_md: Any = None

    @property
    def position(self) -> tuple[int, int]:
        """(step, call in step) of the call just read."""
        return self.step, self.index

    def __call__(self, rows: int) -> Batch:
        if self.get_context is None:
            self.index += 1
            return UNKNOWN_BATCH
        if self.is_available is not None and not self.is_available():
            self.index += 1
            return UNKNOWN_BATCH
        try:
            ctx = self.get_context()
        except AssertionError:  # vLLM asserts when no forward context is set (outside a forward pass)
            self.index += 1
            return UNKNOWN_BATCH
        md = getattr(ctx, "attn_metadata", None)
        if md is not None and md is not self._step_md:  # a new step: counted always, so every rank counts alike
            self._step_md = md
            self.step += 1
            self.index = 0
        else:
            self.index += 1
        last = self._last
        if last is not None and last[0] is md and last[1] == rows:
            return last[2]
        c = find_counts(md, rows)
        batch = UNKNOWN_BATCH if c is None else batch_from_counts(rows, c)
        self._last = (md, rows, batch) if md is not None else None
        return batch


def served_model_name(config: Any) -> str | None:
    """vLLM resolves ``served_model_name`` to one string (the first of a list, else the model path)."""
    model_config = getattr(config, "model_config", None)
    name = getattr(model_config, "served_model_name", None)
    if isinstance(name, (list, tuple)):
        name = name[0] if name else None
    if not name:
        name = getattr(model_config, "model", None)
    return str(name) if name else None


class ModelName:
    """The served model name, looked up until found (vLLM sets its config only in some phases)."""

    def __init__(
        self, getter: Callable[[], Any] | None, *, override: str | None = None, max_attempts: int | None = 8
    ) -> None:
        self.getter = getter
        self.value: str | None = override or None
        self.attempts = 0
        self.max_attempts = max_attempts  # None: unlimited (the _or_none getter is silent and cheap)

    def get(self) -> str | None:
        if self.value is not None or self.getter is None:
            return self.value
        if self.max_attempts is not None and self.attempts >= self.max_attempts:
            return self.value
        self.attempts += 1
        try:
            self.value = served_model_name(self.getter())
        except Exception:  # noqa: BLE001 - unset config raises AssertionError in newer vLLM
            self.value = None
        return self.value


def resolve_rank(getters: Iterable[Callable[[], Any]], env: Mapping[str, str] | None = None) -> str:
    """Tensor-parallel rank: vLLM's, else torch.distributed's, else RANK/LOCAL_RANK, else "0"."""
    for getter in getters:
        try:
            value = _host_int(getter())
        except Exception:  # noqa: BLE001 - not initialised yet
            continue
        if value is not None:
            return str(value)
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return str(dist.get_rank())
    except Exception:  # noqa: BLE001
        pass
    env = os.environ if env is None else env
    for name in ("RANK", "LOCAL_RANK"):
        value = env.get(name, "").strip()
        if value.isdigit():
            return value
    return "0"
