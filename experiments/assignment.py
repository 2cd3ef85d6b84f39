"""Which arm a call goes to: a pure function of (seed, position), the same in every process and on every rank.

A position is (group, index): the vLLM plugin passes (step, call in step); the Dispatcher uses (its cell, the count
of the cell's calls so far). Both are the same on every tensor-parallel rank, so every rank gives one step one arm.
One draw u in [0, 1) per call decides both things: B when u < f, and a timed A call when f <= u < 2f, so timed A
calls are a random sample of the A calls as many as the B calls in expectation. The hash is SplitMix64's finaliser
(Steele, Lea and Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014): cheap in Python, with no
per-process salt (Python's ``hash`` of a string is salted per process, so it is never used here).
"""

from __future__ import annotations

import zlib
from enum import Enum

_MASK = (1 << 64) - 1
_TWO64 = float(1 << 64)
STREAM = 0x9E3779B97F4A7C15  # the assignment's stream, mixed with the seed
STREAM_ARM = STREAM  # its earlier name: ``uniform(seed, STREAM_ARM, group, index) == draw(seed, group, index)``


class Arm(str, Enum):
    """Arm A: the active policy; arm B: the candidate; TIMED_A: arm A, timed as B's counterpart."""

    A = "a"
    B = "b"
    TIMED_A = "timed_a"

    def __str__(self) -> str:
        return self.value


def mix64(value: int) -> int:
    """SplitMix64's finaliser: a bijection of 64-bit integers whose output bits all depend on every input bit."""
    z = (value + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def stable_key(text: str) -> int:
    """A cell's name as a 32-bit number that every process computes alike (CRC-32)."""
    return zlib.crc32(text.encode())


def group_base(seed: int, group: int) -> int:
    """The part of the draw fixed by (seed, group): the call path keeps it per cell and mixes in the index only."""
    return mix64(mix64((seed ^ STREAM) & _MASK) ^ (group & _MASK))


def uniform(seed: int, stream: int, key: int, index: int) -> float:
    """A number in [0, 1) fixed by (seed, stream, key, index); ``draw`` is this on the assignment's stream."""
    return mix64(mix64(mix64((seed ^ stream) & _MASK) ^ (key & _MASK)) ^ (index & _MASK)) / _TWO64


def draw(seed: int, group: int, index: int) -> float:
    """The call's number in [0, 1), fixed by (seed, group, index)."""
    return mix64(group_base(seed, group) ^ (index & _MASK)) / _TWO64


def assign(seed: int, fraction: float, group: int, index: int) -> Arm:
    """The arm of call ``index`` of ``group``: B with probability ``fraction``, a timed A call with the same."""
    u = draw(seed, group, index)
    return Arm.B if u < fraction else Arm.TIMED_A if u < 2.0 * fraction else Arm.A
