"""The demo's traffic, as data: a deterministic stream of attention calls from a seed, no torch, no clock.

It simulates what a vLLM v1 scheduler hands the sparse-MLA attention of one model: a client
at fixed concurrency sends prompts; each step runs every decoding request's row first, then
fills the rest of the token budget with prefill chunks (chunked prefill). Row counts are the
real ones (2-16 decode rows, prefill chunks up to 16384 rows), so the gates at 512/1024 rows
see the sizes a server sees; only the per-row work is scaled down elsewhere (``scale.py``).

Which entry a step's rows reach follows the seed discussion: DeepSeek-V4.1 decode rows go to
the decode entry (``rocm_sparse_attn_decode``); GLM-5.3 with the bug sends the whole batch,
decode rows included, through the prefill entry; GLM after the fix behaves like DeepSeek.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

Entry = Literal["prefill", "decode"]
Kind = Literal["prefill", "mixed", "pure_decode"]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A served model's attention shape as deployed (TP4: 16 query heads per rank, top-k 2048)."""

    name: str
    nope_head_dim: int
    rope_head_dim: int
    heads: int = 16
    topk: int = 2048
    decode_in_prefill_bug: bool = False  # its backend may send decode rows through prefill (GLM)

    @property
    def head_dim(self) -> int:
        return self.nope_head_dim + self.rope_head_dim


DSV4_FLASH = ModelSpec("DeepSeek-V4.1-Flash", 448, 64)
GLM_FLASH = ModelSpec("GLM-5.3-Flash", 512, 0, decode_in_prefill_bug=True)
DEMO_MODELS = (DSV4_FLASH, GLM_FLASH)


@dataclass(frozen=True, slots=True)
class Scenario:
    """One benchmark point: prompts of ``prompt_tokens`` and outputs (both ± ``jitter``), ``concurrency`` in flight."""

    prompt_tokens: int
    output_tokens: int
    concurrency: int
    prompts: int
    token_budget: int  # max_num_batched_tokens: the most rows one step may carry
    jitter: float = 0.1  # vLLM bench's --random-range-ratio


# The seed PR's sweep (8K/20K/64K/256K in, concurrency 2-8), the reviewer's 131K at
# concurrency 2-16, and follow-up turns whose long prefix is already cached (only a few
# hundred new rows prefill: the calls around the 512/1024 gates). Several chunk budgets so
# prompt tails land in every rows bucket. Output lengths are cut so a cycle spends its time
# on prefill chunks, as TTFT runs do; one cycle is about 2.5M prefill rows per model.
DEFAULT_SCENARIOS: tuple[Scenario, ...] = (
    Scenario(8192, 16, 2, 4, 2048),
    Scenario(640, 8, 8, 24, 8192, jitter=0.6),
    Scenario(8192, 16, 8, 8, 8192),
    Scenario(20480, 16, 2, 2, 4096),
    Scenario(640, 8, 16, 32, 16384, jitter=0.6),
    Scenario(65536, 16, 2, 2, 16384),
    Scenario(131072, 64, 16, 8, 16384),
    Scenario(900, 8, 4, 16, 1024, jitter=0.5),
    Scenario(262144, 64, 2, 2, 16384),
    Scenario(262144, 64, 4, 4, 16384),
)


@dataclass(frozen=True, slots=True)
class CallSpec:
    """One attention call: which model, which entry, the per-request query lengths (decode rows first)."""

    seq: int
    model: str
    entry: Entry
    query_lens: tuple[int, ...]
    decode_requests: int  # how many leading entries of query_lens are decode requests
    scenario: int  # index into the scenario table, for people reading /routing

    @property
    def rows(self) -> int:
        return sum(self.query_lens)

    @property
    def decode_rows(self) -> int:
        return sum(self.query_lens[: self.decode_requests])

    @property
    def kind(self) -> Kind:
        if self.decode_requests == 0:
            return "prefill"
        return "pure_decode" if self.decode_requests == len(self.query_lens) else "mixed"


@dataclass(slots=True)
class _Request:
    prompt_left: int
    output_left: int


@dataclass(slots=True)
class _ModelStream:
    """One model's simulated server: client at fixed concurrency + chunked-prefill scheduler."""

    model: ModelSpec
    rng: random.Random
    scenarios: Sequence[Scenario]
    glm_bug: bool
    index: int = 0
    sent: int = 0
    running: list[_Request] = field(default_factory=list)

    def _scenario(self) -> Scenario:
        return self.scenarios[self.index % len(self.scenarios)]

    def _admit(self) -> None:
        sc = self._scenario()
        while len(self.running) < sc.concurrency and self.sent < sc.prompts:
            spread = int(sc.prompt_tokens * sc.jitter)
            prompt = max(2, sc.prompt_tokens + self.rng.randint(-spread, spread))
            spread = int(sc.output_tokens * sc.jitter)  # uneven outputs stagger the next arrivals
            output = max(1, sc.output_tokens + self.rng.randint(-spread, spread))
            self.running.append(_Request(prompt, output))
            self.sent += 1

    def step(self) -> tuple[list[int], list[int]]:
        """Advance one scheduler step: (decode query lens, prefill chunk lens); every chunk has >= 2 rows."""
        self._admit()
        if not self.running:  # scenario finished: move on to the next one
            self.index += 1
            self.sent = 0
            self._admit()
        sc = self._scenario()
        decodes = [r for r in self.running if r.prompt_left == 0]
        budget = sc.token_budget - len(decodes)
        chunks: list[int] = []
        for r in self.running:
            if r.prompt_left > 0 and budget > 1:
                take = min(r.prompt_left, budget)
                if r.prompt_left - take == 1:
                    take -= 1  # never leave a 1-token chunk: it would read as a decode row
                if take < 2:
                    continue
                r.prompt_left -= take
                budget -= take
                chunks.append(take)
        for r in decodes:
            r.output_left -= 1
        self.running = [r for r in self.running if r.output_left > 0]
        return [1] * len(decodes), chunks

    def calls(self, seq: int) -> list[CallSpec]:
        decode, chunks = self.step()
        name, sc = self.model.name, self.index % len(self.scenarios)
        bug = self.glm_bug and self.model.decode_in_prefill_bug
        if bug and decode:  # the GLM bug: the whole batch, decode rows first, enters prefill
            return [CallSpec(seq, name, "prefill", tuple(decode + chunks), len(decode), sc)]
        out = []
        if decode:
            out.append(CallSpec(seq, name, "decode", tuple(decode), len(decode), sc))
        if chunks:
            out.append(CallSpec(seq + len(out), name, "prefill", tuple(chunks), 0, sc))
        return out


def traffic(
    seed: int = 7,
    *,
    models: Sequence[ModelSpec] = DEMO_MODELS,
    scenarios: Sequence[Scenario] = DEFAULT_SCENARIOS,
    glm_bug: bool = False,
) -> Iterator[CallSpec]:
    """An endless, deterministic stream of calls: one scheduler step of each model in turn."""
    if not models or not scenarios:
        raise ValueError("traffic needs at least one model and one scenario")
    for sc in scenarios:
        if not 0.0 <= sc.jitter < 1.0 or min(sc.prompt_tokens, sc.concurrency, sc.prompts, sc.token_budget) < 1:
            raise ValueError(f"bad scenario {sc}: counts must be >= 1 and jitter in [0, 1)")
        if sc.output_tokens < 1:
            raise ValueError(f"bad scenario {sc}: output_tokens must be >= 1")
    streams = [
        _ModelStream(m, random.Random(f"{seed}:{m.name}"), scenarios, glm_bug) for m in models
    ]
    seq = 0
    while True:
        for s in streams:
            for call in s.calls(seq):
                yield call
                seq += 1


def warm_up_calls(calls: Iterable[CallSpec], decode_rows: int) -> list[CallSpec]:
    """The calls a warm-up should make so that the traffic in ``calls`` meets no kernel compiling at first use.

    One call per class (model, entry, kind, rows class), in first-seen order. Up to ``decode_rows``
    every row count is its own class: decode kernels choose their split count by rows, and with
    it their compiled variant. Above it one call per power-of-two rows bucket serves. Every model
    and entry that carries pure-decode batches in ``calls`` also gets each row count from 1 to
    ``decode_rows``, whether ``calls`` holds it or not. Pure: the runner launches them.
    """
    if decode_rows < 1:
        raise ValueError(f"decode_rows must be >= 1; got {decode_rows}")
    picked: dict[tuple, CallSpec] = {}
    decode_entries: dict[tuple[str, Entry], int] = {}  # (model, entry) with pure-decode batches -> its scenario
    for c in calls:
        rows = c.rows
        rows_class = rows if rows <= decode_rows else -(rows.bit_length())  # -k: rows in [2^(k-1), 2^k)
        picked.setdefault((c.model, c.entry, c.kind, rows_class), c)
        if c.kind == "pure_decode":
            decode_entries.setdefault((c.model, c.entry), c.scenario)
    for (model, entry), scenario in decode_entries.items():
        for rows in range(1, decode_rows + 1):
            picked.setdefault((model, entry, "pure_decode", rows),
                              CallSpec(-1, model, entry, (1,) * rows, rows, scenario))
    return list(picked.values())
