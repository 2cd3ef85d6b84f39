"""advise's latency tables as the experiment sees them: a per-call covariate for CUPED, and the predicted ratio.

The prediction carries advise's own band (``advise.scan.ratio_band`` over ``LatencyModel.price``'s arrays):
the interpolants between timed rows (flat to proportional across a gap over 2x), each kernel's timings at the
table's low, middle or high value, the bucket reading, and the kv pools a call is priced between. It is the
band advise puts on a saving, taken on the ratio; what it does not hold is advise's too (a table older than the
kernels, another device of the arch, other heads).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from advise.latency import LatencyModel, Miss, Shape
from advise.scan import price_notes, ratio_band
from advise.tables import LatencyTable, load_table
from dispatcher.platform import Platform
from dispatcher.types import CallShape, Kernel


class Predictor:
    """Prices calls by one latency model: time under A (the covariate) and B/A for a cell (the prediction)."""

    def __init__(self, tables: list[LatencyTable]) -> None:
        self.model = LatencyModel(tables)

    def for_cell(self, kernel_a: Kernel, kernel_b: Kernel, shape: CallShape, lo: int,
                 hi: int | None) -> tuple[Callable[[int], float | None] | None, dict]:
        """(rows -> predicted seconds under A, or None) and the cell's prediction: ``{ratio, ratio_low, ratio_high,
        reason, tables, notes}`` (``reason`` None when priced; otherwise why not, and no ratio)."""
        key = Shape(shape.topk, f"{shape.nope_head_dim}+{shape.rope_head_dim}", shape.q_dtype, shape.kv_dtype,
                    kv_pool_bytes=shape.kv_pool_bytes or None)  # the call's pool: the table's matching one
        found = self.model.curve_at(kernel_a.value, key)
        covariate = None
        if found is not None:
            at = found[0]
            if at(max(lo, 1))[0] is not None and (hi is None or at(hi - 1)[0] is not None):
                seen: dict[int, float | None] = {}  # per rows: the call path pays a dict lookup, not numpy

                def covariate(rows: int, _at: Any = at, _seen: dict = seen) -> float | None:
                    value = _seen.get(rows, _seen)
                    if value is _seen:
                        priced = _at(rows)[0]
                        value = None if priced is None else float(priced[0, 1])
                        if len(_seen) < 65536:
                            _seen[rows] = value
                    return value  # type: ignore[return-value]
        mean = (max(lo, 1) + (hi - 1 if hi is not None else 2 * max(lo, 1))) / 2
        a = self.model.price(kernel_a.value, key, max(lo, 1), mean, hi)
        b = self.model.price(kernel_b.value, key, max(lo, 1), mean, hi)
        if isinstance(a, Miss) or isinstance(b, Miss):
            why = (a if isinstance(a, Miss) else b).reason  # type: ignore[union-attr]
            return covariate, {"ratio": None, "ratio_low": None, "ratio_high": None, "reason": why}
        band = ratio_band(b.seconds, a.seconds)  # loglog, mid, at the mean rows; the band over advise's choices
        tables = list(dict.fromkeys(a.tables + b.tables))
        notes = price_notes(kernel_a.value, a) + price_notes(kernel_b.value, b)
        notes += [f"{m.name}: {m.noise}" for m in self.model.metas if m.name in tables and m.noise]
        return covariate, {"ratio": band.mid, "ratio_low": band.low, "ratio_high": band.high, "reason": None,
                           "tables": tables, "notes": list(dict.fromkeys(notes))}


def predictor_for(platform: Platform) -> Predictor | None:
    """The shipped table for this platform's arch (gfx942: the seed's published MI325X figures; an H200: the CUPTI
    sweep), or None where none applies."""
    name = "gfx942" if platform.is_gfx942 else "h200" if "h200" in platform.device_name.lower() else None
    if name is None:
        return None
    return Predictor([load_table(name)])
