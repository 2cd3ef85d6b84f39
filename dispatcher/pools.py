"""The kv pool's size as a bounded label: powers of two of bytes, parsed and printed for people. Pure.

A call's kv pool (the ``kv`` tensor, ``[slots, 1, D]``) sits in the GPU's L2 or past it, and that moves
both kernels' times and where the gate between them belongs (docs/advise.md, "The kv pool"). Telemetry
labels each call's traffic with the pool's bucket, the sweep times its pools by size, and advise matches
the two: all three use the buckets defined here.
"""

from __future__ import annotations

import re

MIN_BUCKET = 1 << 20  # pools under 1 MiB share the 1 MiB bucket
MAX_BUCKET = 1 << 40  # and pools of 1 TiB or more the 1 TiB one: at most 21 label values
UNKNOWN = 0  # no pool seen (a call shape built by hand, an older series): "" as a label value
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30,
          "t": 1 << 40, "tib": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def pool_bucket(nbytes: int) -> int:
    """The power of two of bytes at or below ``nbytes``, clamped to [1 MiB, 1 TiB]; 0 for no pool."""
    if nbytes <= 0:
        return UNKNOWN
    return min(MAX_BUCKET, max(MIN_BUCKET, 1 << (int(nbytes).bit_length() - 1)))


def pool_bytes(slots: int, head_dim: int, itemsize: int) -> int:
    """Bytes of a ``[slots, 1, head_dim]`` pool of ``itemsize``-byte elements."""
    return slots * head_dim * itemsize


def format_bytes(nbytes: float) -> str:
    """8388608 -> '8 MiB', 4294967296 -> '4 GiB', 1536 -> '1.5 KiB'."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            value = nbytes / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.3g} {unit}"
    return f"{nbytes:.0f} B"


def parse_bytes(text: str) -> int:
    """'8MiB', '256 MiB', '4GiB', '1048576' -> bytes (K/M/G/T are powers of 1024); ValueError naming the text."""
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size: write bytes, or a number with KiB, MiB, GiB or TiB (e.g. 256MiB)")
    value = float(m.group(1)) * _UNITS[unit]
    if value < 1 or value != int(value):
        raise ValueError(f"{text!r} is not a whole, positive number of bytes")
    return int(value)
