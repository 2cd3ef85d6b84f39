"""Which of a table's kv pools price a call whose pool is known to a power-of-two bucket, or not at all. Pure.

A traffic entry's pool is telemetry's ``kv_pool_bytes`` label: the power of two of bytes at or below the
call's pool (``dispatcher.pools.pool_bucket``), so the pool lies in [b, 2b). A table times a few pools
(``routescope sweep --kv-pool``). The entry is priced at the table's pool inside its bucket; else at the
nearest pool below and the nearest above, the estimate between them in log bytes and the band across
both; past the table's smallest or largest pool, at that one. An entry with no pool is priced at the
table's largest pool (the nearest to a serving cache) with the band across every pool.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dispatcher.pools import format_bytes


@dataclass(frozen=True, slots=True)
class PoolChoice:
    """The pools to price at, the one the estimate leans on (``toward`` of the way from the first to the
    second, in log bytes; with more than two, the estimate is the last one's), and a note for people."""

    pools: tuple[int | None, ...]
    toward: float = 0.0
    note: str = ""


def choose(available: Sequence[int | None], bucket: int | None) -> PoolChoice:
    """The pools of ``available`` (bytes; None: a table without pools) that price an entry of pool ``bucket``."""
    known = sorted({p for p in available if p is not None})
    if not known:
        return PoolChoice((None,))
    if len(known) == 1:
        only = known[0]
        if bucket and not bucket <= only < 2 * bucket:
            return PoolChoice((only,), note=f"the table times one kv pool ({format_bytes(only)}), not this one")
        return PoolChoice((only,))
    if not bucket:
        return PoolChoice(tuple(known), note="kv pool unknown: priced at the table's largest pool, the band "
                                             f"across all of them ({', '.join(map(format_bytes, known))})")
    inside = [p for p in known if bucket <= p < 2 * bucket]
    if inside:
        centre = bucket * math.sqrt(2)
        return PoolChoice((min(inside, key=lambda p: abs(math.log(p / centre))),))
    below = [p for p in known if p < bucket]
    above = [p for p in known if p >= 2 * bucket]
    if not below or not above:
        edge = below[-1] if below else above[0]
        return PoolChoice((edge,), note=f"kv pool {format_bytes(bucket)}-{format_bytes(2 * bucket)} is past the "
                                        f"table's pools: priced at its nearest, {format_bytes(edge)}")
    lo, hi = below[-1], above[0]
    centre = bucket * math.sqrt(2)
    toward = (math.log(centre) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return PoolChoice((lo, hi), toward, f"kv pool {format_bytes(bucket)}-{format_bytes(2 * bucket)} lies between the "
                                        f"table's {format_bytes(lo)} and {format_bytes(hi)}: the band spans both")


def combine(choice: PoolChoice, values: Sequence[np.ndarray]) -> np.ndarray:
    """[interp][spread] at each chosen pool -> one: the estimate between them, low and high across all."""
    if len(values) == 1:
        return values[0]
    stack = np.stack(values)  # [pool][interp][spread]
    out = np.empty_like(stack[0])
    if len(values) == 2:
        out[:, 1] = np.exp(np.log(stack[0, :, 1]) * (1 - choice.toward) + np.log(stack[1, :, 1]) * choice.toward)
    else:
        out[:, 1] = stack[-1, :, 1]
    out[:, 0] = np.minimum(stack[:, :, 0].min(axis=0), out[:, 1])
    out[:, 2] = np.maximum(stack[:, :, 2].max(axis=0), out[:, 1])
    return out
