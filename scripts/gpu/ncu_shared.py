"""Which instructions move a kernel's shared-memory wavefronts, and which of them conflict (session 26).

Input: ``ncu -i REPORT --page source --csv --print-source sass`` of one kernel profiled with the
``SourceCounters`` section. Every column whose name mentions shared memory (Nsight Compute's "L1 Wavefronts
Shared", "... Ideal", "... Excessive", "L1 Conflicts Shared N-Way" and the like) is summed per opcode (the SASS
mnemonic without its modifiers' operands: ``STS.128``, ``LDSM.16.MT88.4``, ``HGMMA...``), beside the
instructions executed; then the instructions with the most excessive wavefronts are listed. Divide by the
call's tiles for per-tile figures (``--tiles``).

    python3 scripts/gpu/ncu_shared.py SOURCE.csv [--tiles 524288] [--top 12]

Runs anywhere (no GPU).
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
import sys
from pathlib import Path

EXECUTED = "Instructions Executed"


def number(text: str) -> float:
    """A CSV cell as a number (thousands separators dropped); 0 for an empty or non-numeric cell."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def opcode(source: str) -> str:
    """The SASS mnemonic of a source line, its predicate dropped: ``@!P0 STS.128 [R1], R2`` -> ``STS.128``."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0] if words else ""


def read(path: Path) -> tuple[list[str], list[dict]]:
    """(the shared-memory columns, the rows) of a source-page CSV; the header is the first line naming Source."""
    lines = path.read_text(errors="replace").splitlines()
    start = next(i for i, line in enumerate(lines) if "Source" in line and "," in line)
    rows = list(csv.DictReader(lines[start:]))
    cols = [c for c in rows[0] if c and re.search(r"shared", c, re.I)] if rows else []
    return cols, rows


def summarise(cols: list[str], rows: list[dict], tiles: int, top: int) -> str:
    per_op: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for row in rows:
        op = opcode(row.get("Source", ""))
        for c in cols + [EXECUTED]:
            if c in row:
                per_op[op][c] += number(row[c])
    shown = [c for c in cols if any(per_op[op][c] for op in per_op)]
    out = [f"columns: {', '.join(shown)}", f"per opcode, per {tiles} tiles (executed, then each column):"]
    key = next((c for c in shown if "Wavefronts" in c and "Ideal" not in c and "Excessive" not in c), None)
    ranked = sorted(per_op, key=lambda op: -per_op[op][key]) if key else sorted(per_op)
    for op in ranked:
        if not any(per_op[op][c] for c in shown):
            continue
        cells = " ".join(f"{per_op[op][c] / tiles:9.1f}" for c in [EXECUTED] + shown)
        out.append(f"  {op:28} {cells}")
    excess = next((c for c in shown if "Excessive" in c), None)
    if excess:
        out.append(f"the {top} instructions with the most '{excess}' (per tile):")
        worst = sorted(rows, key=lambda r: -number(r.get(excess, "0")))[:top]
        for r in worst:
            if number(r.get(excess, "0")) > 0:
                out.append(f"  {r.get('Address', ''):>8} {number(r[excess]) / tiles:8.2f}  {r.get('Source', '')[:90]}")
    return "\n".join(out)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", type=Path)
    ap.add_argument("--tiles", type=int, default=1)
    ap.add_argument("--top", type=int, default=12)
    opt = ap.parse_args(argv)
    cols, rows = read(opt.csv)
    if not cols:
        sys.exit(f"{opt.csv}: no shared-memory columns (profile with --section SourceCounters)")
    print(summarise(cols, rows, opt.tiles, opt.top))


if __name__ == "__main__":
    main(sys.argv[1:])
