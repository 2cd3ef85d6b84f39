"""Which arm a call goes to: a pure function of (seed, position), the same in every process and on every rank.

A position is the call's place in the traffic: the vLLM plugin passes (step, call in step); the Dispatcher counts
calls per cell. Both are the same on every tensor-parallel rank, so every rank gives one step one arm. The hash is
SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014): cheap in Python,
with no per-process salt (Python's ``hash`` of a string is salted per process, so it is never used here).
"""

from __future__ import annotations

import zlib
from enum import Enum

_MASK = (1 << 64) - 1
_TWO64 = float(1 << 64)
STREAM_ARM = 0x9E3779B97F4A7C15  # which arm
STREAM_TIMED_A = 0xD1B54A32D192ED03  # whether an A call is timed (an equal sample of A)


class Arm(str, Enum):
    """Arm A: the active policy; arm B: the candidate."""

    A = "a"
    B = "b"

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


def uniform(seed: int, stream: int, key: int, index: int) -> float:
    """A number in [0, 1) fixed by (seed, stream, key, index)."""
    return mix64(mix64(mix64(seed ^ stream) ^ key) ^ index) / _TWO64


def assign(seed: int, fraction: float, key: int, index: int) -> Arm:
    """The arm of the ``index``-th call at ``key`` (a cell or a step): B with probability ``fraction``."""
    return Arm.B if uniform(seed, STREAM_ARM, key, index) < fraction else Arm.A


def time_a(seed: int, fraction: float, key: int, index: int) -> bool:
    """Is this A call timed? Probability f / (1 - f), so timed A calls match B calls in number, in expectation."""
    return uniform(seed, STREAM_TIMED_A, key, index) < fraction / (1.0 - fraction)
