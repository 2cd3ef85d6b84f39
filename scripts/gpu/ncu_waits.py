"""What each partition of a warp-specialised kernel waits for, from Nsight Compute's source page (session 16).

Input: ``ncu -i REPORT --page source --csv --print-source sass`` of one kernel profiled with the
``SourceCounters`` and ``WarpStateStats`` sections (``scripts/gpu/profile.py ws-prefill`` under
ncu; docs/benchmarks.md, S16-2). Gluon's ``warp_specialize`` lays each partition's code out after a
``USETMAXREG`` that gives it its registers, so the SASS is split at those markers: a stretch of at
least ``min_len`` instructions after a marker is one partition, named by its register count (two
partitions with the same count are told apart by order); shorter stretches are the hand-offs
between them. An mbarrier wait shows as a predicated branch into its retry loop at the end of the
function, whose ``SYNCS.PHASECHK...TRYWAIT`` names the barrier's shared-memory address; the wait's
first, inline ``TRYWAIT`` names it too. The samples on both are that partition's time waiting on
that barrier.

    python3 scripts/gpu/ncu_waits.py SOURCE.csv [--top 8] [--names 0x38ae0=p_ready,0x38af0=buf_empty ...]

Prints, per partition, its share of the samples, its main stall reasons, its barrier waits and its
busiest instructions. Runs anywhere (no GPU).
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"
MARKER = re.compile(r"USETMAXREG\.\S+\s+(?:UP\d+,\s*)?(0x[0-9a-f]+)")
TRYWAIT = re.compile(r"SYNCS\.PHASECHK\.\S*TRYWAIT\s+\S+\s+\[([^\]]+)\]")
BRANCH = re.compile(r"^@!?U?P\d+\s+BRA\s+(0x[0-9a-f]+)")


@dataclass
class Insn:
    address: int
    source: str
    samples: float
    stalls: dict[str, float] = field(default_factory=dict)


@dataclass
class Partition:
    name: str
    lo: int  # first instruction (index)
    hi: int  # one past the last


def _num(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def parse(lines) -> list[Insn]:
    """The instructions of one kernel's source-page CSV (a "Kernel Name" line, then the header, then rows)."""
    rows = list(csv.reader(lines))
    start = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if start is None:
        raise ValueError("no 'Address' header: export with --page source --csv --print-source sass")
    hdr = rows[start]
    if SAMPLES not in hdr:
        raise ValueError(f"no '{SAMPLES}' column: profile with --section SourceCounters --section WarpStateStats")
    ix = {h: i for i, h in enumerate(hdr)}
    stall_cols = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    out = []
    for r in rows[start + 1:]:
        if len(r) < len(hdr) or not r[ix["Address"]].startswith("0x"):
            continue
        out.append(Insn(int(r[ix["Address"]], 16), r[ix["Source"]].strip(), _num(r[ix[SAMPLES]]),
                        {h[len("stall_"):]: _num(r[ix[h]]) for h in stall_cols}))
    return out


def partitions(insns: list[Insn], min_len: int = 20) -> list[Partition]:
    """The stretches after each ``USETMAXREG`` of at least ``min_len`` instructions, named by register count."""
    marks = [i for i, x in enumerate(insns) if MARKER.search(x.source)]
    bounds = marks + [len(insns)]
    seen: collections.Counter = collections.Counter()
    out = []
    for a, b in zip(bounds, bounds[1:]):
        if b - a < min_len:
            continue
        regs = int(MARKER.search(insns[a].source).group(1), 16)
        seen[regs] += 1
        out.append(Partition(f"regs {regs} #{seen[regs]}", a, b))
    return out


def _barrier(source: str) -> str | None:
    """The address offset a ``TRYWAIT`` waits on (``0x38a80`` of ``[R29+URZ+0x38a80]``), else None."""
    w = TRYWAIT.search(source)
    return re.sub(r"^.*\+(0x[0-9a-f]+)$", r"\1", w.group(1)) if w else None


def barrier_waits(insns: list[Insn], part: Partition) -> dict[str, float]:
    """Samples of ``part`` waiting on each barrier: its inline ``TRYWAIT`` (the first, suspending try) and the
    branch into the barrier's retry loop (waiting for that try's answer), by the barrier's address."""
    where = {x.address: i for i, x in enumerate(insns)}
    waits: collections.Counter = collections.Counter()
    for x in insns[part.lo:part.hi]:
        bar = _barrier(x.source)
        m = BRANCH.match(x.source)
        if bar is None and m and int(m.group(1), 16) in where:
            j = where[int(m.group(1), 16)]
            bar = next((b for b in map(_barrier, (y.source for y in insns[j:j + 4])) if b), None)
        if bar is not None and x.samples > 0:
            waits[bar] += x.samples
    return dict(waits)


def report(insns: list[Insn], names: dict[str, str] | None = None, top: int = 8, min_len: int = 20) -> str:
    names = names or {}
    total = sum(x.samples for x in insns) or 1.0
    out = [f"{len(insns)} instructions, {total:.0f} samples"]
    for p in partitions(insns, min_len):
        seg = insns[p.lo:p.hi]
        own = sum(x.samples for x in seg) or 1.0
        reasons: collections.Counter = collections.Counter()
        for x in seg:
            reasons.update(x.stalls)
        why = ", ".join(f"{k} {v / own:.0%}" for k, v in reasons.most_common(5) if v > 0)
        out.append(f"\n== {p.name} (instructions {p.lo}-{p.hi - 1}): {own / total:.1%} of the samples; {why}")
        for addr, n in sorted(barrier_waits(insns, p).items(), key=lambda kv: -kv[1]):
            out.append(f"   waits on {names.get(addr, addr):14} {n:9.0f}  {n / own:6.1%}")
        for x in sorted(seg, key=lambda x: -x.samples)[:top]:
            out.append(f"   {x.samples:9.0f}  {x.samples / own:6.1%}  {x.source[:80]}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--top", type=int, default=8, help="busiest instructions shown per partition")
    ap.add_argument("--min-len", type=int, default=20, help="shorter stretches between markers are hand-offs")
    ap.add_argument("--names", nargs="*", default=[], help="barrier names, ADDRESS=NAME (e.g. 0x38ae0=p_ready)")
    opt = ap.parse_args(argv)
    names = dict(n.split("=", 1) for n in opt.names)
    with opt.csv.open(newline="") as fh:
        print(report(parse(fh), names, opt.top, opt.min_len))


if __name__ == "__main__":
    main(sys.argv[1:])
