"""An experiment's settings: one pydantic model, the same in-process and in a multiprocess directory's config file."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_FRACTION = 0.1
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_CANDIDATE = re.compile(r"^(aa|decodes_split_k|(gfx942|gfx950|split_below)_\d+)$")


class CellName(BaseModel):
    """One cell an ``aa`` experiment runs in: a model (None: any) and a rows bucket label (``512-1023``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = None
    rows_bucket: str


class ExperimentConfig(BaseModel):
    """What to try, on what share of eligible calls, and when to stop by itself."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(description="names the experiment in every output; letters, digits, _ . -")
    candidate: str = Field(description="arm B: gfx942_N, gfx950_N, split_below_N, decodes_split_k, or aa")
    fraction: float = Field(0.01, gt=0, le=MAX_FRACTION, description="probability that an eligible call goes to B")
    seed: int = Field(0, ge=0, lt=2**63, description="the assignment's seed: one seed, one assignment everywhere")
    harm_bound: float = Field(0.05, gt=0, le=1, description="stop when a cell's band shows B slower by more")
    budget: float = Field(0.005, gt=0, le=1, description="stop when B's extra kernel time passes this share of the "
                          "eligible calls' kernel time over the window")
    window_s: float = Field(3600.0, gt=0, description="the window the budget is a share of (seconds)")
    numerics_every: int = Field(64, ge=1, description="one B call in this many per cell is a numerics sample")
    max_calls: int | None = Field(None, ge=1, description="finish after this many calls assigned to B")
    max_seconds: float | None = Field(None, gt=0, description="finish after this long running")
    allow_decode_on_prefill: bool = Field(False, description="let B send decode rows onto a prefill kernel that A "
                                          "does not use (the seed's 9x harm)")
    cells: tuple[CellName, ...] = Field((), description="aa only: the cells it runs in (none given: every "
                                        "prefill-kernel call)")
    min_samples: int = Field(30, ge=2, description="timed calls of each arm a cell needs before its band may stop it")
    clock: Literal["stamp", "gated"] = Field("gated", description="GPU clock of timed calls: gated event pairs "
                                             "(the kernels unstamped), or device stamps where the kernels write "
                                             "them (gated pairs for the rest)")
    tolerance: float | None = Field(None, gt=0, description="numerics bound on relative error (None: the sweep's, "
                                    "by dtype)")

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not _ID.match(value):
            raise ValueError(f"experiment id {value!r}: use 1-64 letters, digits, '_', '.' or '-', starting with a "
                             "letter or digit")
        return value

    @field_validator("candidate")
    @classmethod
    def _candidate(cls, value: str) -> str:
        if not _CANDIDATE.match(value):
            raise ValueError(f"candidate {value!r}: expected gfx942_N, gfx950_N, split_below_N (N rows), "
                             "decodes_split_k or aa")
        return value

    @model_validator(mode="after")
    def _cells_for_aa(self) -> ExperimentConfig:
        if self.cells and self.candidate != "aa":
            raise ValueError(f"cells name the cells of an aa experiment; candidate {self.candidate!r} has its own "
                             "(the calls the two arms route differently)")
        return self

    @property
    def threshold(self) -> int | None:
        """The rows threshold a gate or split candidate names (None for aa and decodes_split_k)."""
        tail = self.candidate.rpartition("_")[2]
        return int(tail) if tail.isdigit() else None
