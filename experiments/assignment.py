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
from collections.abc import Callable
from enum import Enum

import numpy as np

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


# -- the call path's form: the same draws, found a batch at a time -----------------------------------------------

B, TIMED_A = 1, 2  # what ``picks`` and ``Schedule.take`` answer for a picked index (0: not picked)
CHUNK = 4096  # indices per batch of a group's draws: ~50 µs of numpy, once per 4,096 calls of a cell


def _mix64_array(z: np.ndarray) -> np.ndarray:
    """``mix64`` over an array of uint64 (numpy's unsigned arithmetic wraps modulo 2**64, as ``_MASK`` does)."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _kinds(z: np.ndarray, fraction: float, exact: Callable[[int], int]) -> tuple[list, list]:
    """(positions, kinds) of the picks among the draws ``z``, ascending. u = float(z) / 2**64 exactly, so u < f is
    float(z) < f * 2**64: numpy's conversion decides, and the rare draw within 2**-40 of a bound is drawn again in
    Python by ``exact(position)`` (``draw``'s own arithmetic)."""
    bound_b, bound_a = fraction * _TWO64, 2.0 * fraction * _TWO64
    zf = z.astype(np.float64)
    near = np.flatnonzero(zf < bound_a * (1.0 + 2.0**-40))
    if not near.size:
        return [], []
    kinds = np.where(zf[near] < bound_b, B, np.where(zf[near] < bound_a, TIMED_A, 0))
    edge = near[(np.abs(zf[near] - bound_b) <= bound_b * 2.0**-40) | (np.abs(zf[near] - bound_a) <= bound_a * 2.0**-40)]
    if edge.size:
        at = {p: k for k, p in enumerate(near.tolist())}
        for p in edge.tolist():
            kinds[at[p]] = exact(p)
    keep = kinds != 0
    return near[keep].tolist(), kinds[keep].tolist()


def _kind(base: int, index: int, fraction: float) -> int:
    u = mix64(base ^ (index & _MASK)) / _TWO64  # exactly ``draw``: the decision is the per-call one
    return B if u < fraction else TIMED_A if u < 2.0 * fraction else 0


def picks(base: int, fraction: float, start: int, count: int) -> tuple[list[int], list[int]]:
    """The picked indices in [start, start + count) of the group whose ``group_base`` is ``base``, ascending, and
    each one's ``B`` or ``TIMED_A``: what ``assign`` answers index by index, computed in one vectorised batch."""
    idx = np.arange(start, start + count, dtype=np.uint64)
    at, kinds = _kinds(_mix64_array(idx ^ np.uint64(base)), fraction, lambda p: _kind(base, start + p, fraction))
    return [start + p for p in at], kinds


class Schedule:
    """One group's picks, a chunk at a time: the caller keeps ``next`` (the next index that needs a look) and
    counts indices; only at ``next`` does it call ``take``. So an unpicked call costs an increment and a compare."""

    __slots__ = ("base", "fraction", "chunk", "end", "indices", "kinds", "at", "next")

    def __init__(self, base: int, fraction: float, chunk: int = CHUNK) -> None:
        self.base, self.fraction, self.chunk = base, fraction, chunk
        self.end = 0
        self.indices: list[int] = []
        self.kinds: list[int] = []
        self.at = 0
        self.next = 0
        self._fill(0)

    def _fill(self, start: int) -> None:
        self.indices, self.kinds = picks(self.base, self.fraction, start, self.chunk)
        self.at = 0
        self.end = start + self.chunk
        self.next = self.indices[0] if self.indices else self.end

    def take(self, index: int) -> int:
        """``B``, ``TIMED_A`` or 0 for ``index`` (== ``next``: the chunk's end, or a pick); moves ``next`` on."""
        if index == self.end:
            self._fill(index)
            if self.next != index:
                return 0
        at = self.at
        kind = self.kinds[at]
        self.at = at = at + 1
        self.next = self.indices[at] if at < len(self.indices) else self.end
        return kind


class GroupPicks:
    """Picks by (group, index) for positions that name their group (the vLLM plugin's (step, call in step)): the
    draws of ``span`` groups from the one asked for, over the first ``width`` indices, in one batch; an index past
    ``width`` is drawn on its own (and the next batch is wider)."""

    __slots__ = ("seed", "fraction", "span", "width", "first", "kinds", "wider")

    def __init__(self, seed: int, fraction: float, *, span: int = 64, width: int = 128) -> None:
        self.seed, self.fraction, self.span, self.width = seed, fraction, span, width
        self.first = -1
        self.kinds: list[dict[int, int]] = []
        self.wider = width

    def group(self, group: int) -> dict[int, int]:
        """{index: B or TIMED_A} for the picked indices of ``group`` below ``width`` (``kind`` for the rest)."""
        offset = group - self.first
        if self.first < 0 or not 0 <= offset < len(self.kinds) or self.wider != self.width:
            self._fill(group)
            offset = 0
        return self.kinds[offset]

    def kind(self, group: int, index: int) -> int:
        """An index past the batch's width, drawn alone; the next batch covers it."""
        self.wider = max(self.wider, 1 << (index + 1).bit_length())
        return _kind(group_base(self.seed, group), index, self.fraction)

    def _fill(self, first: int) -> None:
        self.width = self.wider
        groups = np.arange(first, first + self.span, dtype=np.uint64)
        bases = _mix64_array(np.uint64(mix64((self.seed ^ STREAM) & _MASK)) ^ groups)  # group_base, vectorised
        width = self.width
        index = np.arange(width, dtype=np.uint64)
        z = _mix64_array(bases[:, None] ^ index[None, :]).ravel()
        kinds: list[dict[int, int]] = [{} for _ in range(self.span)]
        at, picked = _kinds(z, self.fraction, lambda p: _kind(int(bases[p // width]), p % width, self.fraction))
        for flat, kind in zip(at, picked):
            g, i = divmod(flat, width)
            kinds[g][i] = kind
        self.first, self.kinds = first, kinds
