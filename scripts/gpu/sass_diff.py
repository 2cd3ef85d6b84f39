"""Compare two builds' SASS, variant by variant: identical, the same up to register names, or how far apart.

A refactor of a Gluon kernel (a helper pulled out, a module split) should leave its machine code
alone; this says whether it did without spending device time. Build each tree's SASS with
``gluon_check.py --sass-dir DIR`` (run from that tree), then:
``python scripts/gpu/sass_diff.py BEFORE_DIR AFTER_DIR``. Exit status 1 if any variant's
instructions differ beyond register names, or a variant is in one folder only.
"""

from __future__ import annotations

import difflib
import re
import sys
from pathlib import Path

_INSN = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
_REG = re.compile(r"\b(U?R|U?P)\d+\b")


def instructions(sass: str) -> list[str]:
    """The instruction text of a cuobjdump SASS listing, without addresses, encodings or branch offsets."""
    out = []
    for line in sass.splitlines():
        m = _INSN.search(line)
        if m:
            out.append(re.sub(r"`\(\.L_x_\d+\)|0x[0-9a-f]+", "#", m.group(1)))
    return out


def compare(a: list[str], b: list[str]) -> str:
    """'identical', 'registers renamed (N instructions)' or 'differs: N instructions changed, opcodes ...'."""
    if a == b:
        return "identical"
    ra = [_REG.sub(r"\1", x) for x in a]
    rb = [_REG.sub(r"\1", x) for x in b]
    if ra == rb:
        return f"registers renamed ({sum(x != y for x, y in zip(a, b))} instructions)"
    ops_a = [x.split()[0] for x in a]
    ops_b = [x.split()[0] for x in b]
    changed = sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in
                  difflib.SequenceMatcher(None, ra, rb, autojunk=False).get_opcodes() if tag != "equal")
    same_ops = "same opcodes in order" if ops_a == ops_b else f"{len(a)} -> {len(b)} instructions"
    return f"differs: {changed} instructions changed, {same_ops}"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[0], "\nusage: sass_diff.py BEFORE_DIR AFTER_DIR", file=sys.stderr)
        return 2
    before, after = (Path(x) for x in argv)
    names = sorted({p.name for p in before.glob("*.sass")} | {p.name for p in after.glob("*.sass")})
    if not names:
        print(f"no .sass files in {before} or {after}", file=sys.stderr)
        return 2
    bad = 0
    for name in names:
        pa, pb = before / name, after / name
        if not (pa.exists() and pb.exists()):
            print(f"{name}: only in {before if pa.exists() else after}")
            bad += 1
            continue
        verdict = compare(instructions(pa.read_text()), instructions(pb.read_text()))
        bad += verdict.startswith("differs")
        print(f"{name}: {verdict}")
    print(f"{len(names) - bad} of {len(names)} variants the same up to register names")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
