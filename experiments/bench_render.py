"""What `routescope bench experiment` prints: per fraction, its cells and rows buckets measured beside the CUPTI
truth, then the throughput cost. Pure over the bench's result (``experiments.bench.run``).

A figure the run could not produce is shown as unknown: a dash in a table and a reason in a sentence, never a
Python ``None``, ``True`` or a zero standing in for it. Cells and buckets are listed by model, then rows.
"""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .throughput import describe

UNKNOWN = "–"
TRUTH_CLOCKS = {"cupti": "CUPTI", "host": "the host clock"}
WIDE = 100.0  # a band edge beyond this is shown as "> 100": the band says nothing there yet


def _known(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def ratio_text(x: Any) -> str:
    if not _known(x):
        return UNKNOWN
    return f"> {WIDE:.0f}" if x > WIDE else f"{x:.3f}"


def band_text(low: Any, high: Any) -> str:
    """``[low, high]``, each edge as a ratio; unknown while the band has no edges."""
    if not (_known(low) and _known(high)):
        return UNKNOWN
    return f"[{ratio_text(low)}, {ratio_text(high)}]"


def off_text(off: Any) -> str:
    """A relative error as a signed percentage."""
    return f"{off * 100:+.1f}%" if _known(off) else UNKNOWN


def yes_no(v: Any) -> str:
    return UNKNOWN if v is None else ("yes" if v else "no")


def bucket_order(label: str) -> int:
    """A rows bucket label's lower edge ("2-3" -> 2, "1024+" -> 1024); labels without one sort last."""
    head = str(label).split("-")[0].rstrip("+")
    return int(head) if head.isdigit() else 1 << 62


def crossover_text(rows: Any, *, measured: bool) -> str:
    """A split_below_N crossover: the rows below which B is no worse, or why there is none."""
    if rows is not None:
        return f"{rows} rows"
    if measured:
        return "none shown (the smallest moved rows bucket's band reaches above 1)"
    return "none (B is slower in the smallest rows bucket)"


def saving_text(s: dict | None) -> str:
    s = s or {}
    mid, low, high = s.get("seconds"), s.get("low"), s.get("high")
    if not _known(mid):
        return "saving unknown (no cell has timed calls in both arms)"
    band = f" [{low:+.4g}, {high:+.4g}]" if _known(low) and _known(high) else " (no band yet)"
    return f"saving {mid:+.4g} s{band}"


def state_text(e: dict) -> str:
    state = str(e.get("state") or UNKNOWN)
    return f"{state} ({e['stop_reason']})" if state == "stopped" and e.get("stop_reason") else state


def _table(title: str, header: list[str], left: set[int]) -> Table:
    """Columns ``left`` (labels, words) left-aligned, the numbers right-aligned; nothing wraps."""
    t = Table(title=Text(title), title_justify="left")  # Text: a title's brackets are not markup
    for i, h in enumerate(header):
        t.add_column(h, justify="left" if i in left else "right", no_wrap=True)
    return t


def cells_table(cells: list[dict], truth: str = "CUPTI") -> Table:
    t = _table(f"cells: B time / A time measured, its band (statistics and the clock's bound), against {truth}",
               ["model", "rows", "class", "timed A", "timed B", "ratio", "band", "truth", "off", "inside"],
               left={0, 1, 2})
    for c in sorted(cells, key=lambda c: (c["model"], bucket_order(c["rows_bucket"]), c["call_class"])):
        t.add_row(c["model"], c["rows_bucket"], c["call_class"], f"{c['timed_a']:,}", f"{c['timed_b']:,}",
                  ratio_text(c["ratio"]), band_text(c["ratio_low"], c["ratio_high"]), ratio_text(c["truth"]),
                  off_text(c["off"]), yes_no(c["inside"]))
    return t


def buckets_table(buckets: list[dict], truth: str = "CUPTI") -> Table:
    t = _table(f"rows buckets: the moved cells pooled, against {truth} over the cells the band covers",
               ["rows", "calls", "covered", "ratio", "band", "truth", "off", "inside", "verdict"], left={0, 8})
    for b in sorted(buckets, key=lambda b: bucket_order(b["rows_bucket"])):
        verdict = str(b.get("verdict") or UNKNOWN).replace("_", " ")
        if b.get("calls_needed"):
            verdict += f" (needs about {b['calls_needed']:,} calls)"
        t.add_row(b["rows_bucket"], f"{b['calls']:,}", f"{b['covered'] * 100:.0f}%", ratio_text(b["ratio"]),
                  band_text(b["ratio_low"], b["ratio_high"]), ratio_text(b["truth"]), off_text(b["off"]),
                  yes_no(b["inside"]), verdict)
    return t


def calibration_lines(cal: dict | None) -> list[str]:
    """The experiment clock's offsets: per device (kernels that write no stamp), per cell arm (in place)."""
    cal = cal or {}
    out = []
    for device, dev in (cal.get("devices") or {}).items():
        floor = dev.get("empty_p10_ns")
        pairs = f"{dev.get('pairs', 0)} empty pairs" + (f", floor {floor:,} ns" if floor is not None else "")
        offset = dev.get("offset_ns")
        off = f"{offset:,} ns" if offset is not None else "unknown (no empty pair read)"
        out.append(f"  clock on {device}: {off} off gated readings of kernels that write no stamp ({pairs}), "
                   f"bound {dev.get('bound_ns', 0):,} ns")
    offsets = [k["offset_ns"] for k in (cal.get("kernels") or {}).values() if k.get("offset_ns") is not None]
    if offsets:
        out.append(f"  calibrated in place: {len(offsets)} cell arms, {min(offsets):,} to {max(offsets):,} ns off "
                   f"each gated reading ({cal.get('calibrating_calls', 0):,} stamped calls, not samples)")
    return out


def undecided_line(detail: dict | None) -> str | None:
    thin = (detail or {}).get("undecided")
    if not thin:
        return None
    need = thin.get("calls_needed")
    why = f"about {need:,} of its calls would decide it" if need is not None else thin.get("needed_because") or ""
    return f"  undecided: the {thin['rows_bucket']} bucket ({thin['calls']:,} calls) is too thin; {why}".rstrip("; ")


def render(result: dict, console: Console | None = None) -> None:
    """A header, then per fraction its sentence, calibration, cells and buckets; then the throughput cost."""
    console = console or Console(width=max(Console().width, 160))  # piped: wide enough for the tables
    say = lambda text: console.print(Text(text), soft_wrap=True)  # noqa: E731 - as written: no markup, no wrap
    truth = TRUTH_CLOCKS.get(result.get("truth_clock"), "the ground truth")
    say(f"{result['device']} ({result['arch']}): {result['calls']:,} prefill-entry calls, "
        f"split_below_{result['threshold']}; ground-truth crossover "
        f"{crossover_text(result['ground_truth_crossover'], measured=False)}")
    for f, e in result["experiments"].items():
        say("")
        say(f"fraction {f}: measured crossover {crossover_text(e['crossover'], measured=True)}; "
            f"{saving_text(e['saving'])}; {state_text(e)}")
        for line in filter(None, [undecided_line(e.get("crossover_detail")), *calibration_lines(
                e.get("clock_calibration"))]):
            say(line)
        console.print(cells_table(e["cells"], truth))
        console.print(buckets_table(e["buckets"], truth))
    if result.get("throughput"):
        say(describe(result["throughput"]))
