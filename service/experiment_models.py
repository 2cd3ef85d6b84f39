"""The `GET /experiments` contract as typed models, so /openapi.json documents it and a client can check it.

The experiment's JSON comes from the experiments package; these models allow extra keys, so a
field added there (a prediction, a history) passes through unchanged instead of being dropped.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

STATES = ("running", "stopped", "finished")
State = Literal["running", "stopped", "finished"]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Prediction(_Open):
    """advise's predicted B/A for the cell from a latency table, never measured on this traffic, with advise's band."""

    ratio: float | None = Field(None, description="predicted time under B / under A; null where no table prices it")
    ratio_low: float | None = Field(None, description="low end of advise's band: interpolants, the table's spread, "
                                                      "the bucket reading, kv pools (docs/advise.md, The band)")
    ratio_high: float | None = Field(None, description="high end of that band")
    reason: str | None = Field(None, description="why there is no prediction; null when there is one")
    tables: list[str] = Field([], description="the latency tables it rests on")
    notes: list[str] = Field([], description="how it was priced, where a reader should know (kv pools, wide gaps)")


class ClockBound(_Open):
    """The most each arm's mean reading may lie off its kernels' time, by the clock that read it (seconds)."""

    a: float = Field(0.0, ge=0.0)
    b: float = Field(0.0, ge=0.0)


class ExperimentCell(_Open):
    """One cell (model x rows bucket, and the call's shape): both arms' counts and B/A of mean kernel time."""

    model: str
    rows_bucket: str
    kernel_a: str
    kernel_b: str
    calls_a: int = Field(ge=0)
    calls_b: int = Field(ge=0)
    timed_a: int = Field(ge=0)
    timed_b: int = Field(ge=0)
    ratio: float | None = Field(None, description="mean kernel time of B / mean of A; null until both arms are timed")
    ratio_low: float | None = Field(None, description="low end of the 95% band of ratio: the anytime-valid band "
                                    "widened by each arm's clock bound (docs/experiments.md, The clock)")
    ratio_high: float | None = Field(None, description="high end of that band")
    ratio_low_stat: float | None = Field(None, description="low end of the anytime-valid band alone")
    ratio_high_stat: float | None = Field(None, description="high end of the anytime-valid band alone")
    clock_bound_s: ClockBound | None = None
    prediction: Prediction | None = None


class Saving(_Open):
    """Kernel seconds B would have saved over the observed traffic (negative: it costs), with its band."""

    seconds: float | None = None
    low: float | None = None
    high: float | None = None


class Acknowledged(_Open):
    """A person acknowledged the stop (`routescope experiment ack`, `POST /experiments/{id}/ack`)."""

    at: float | None = Field(None, description="when, in Unix seconds")
    by: str | None = None


class ExperimentOut(_Open):
    """One experiment: arm A is the active policy, arm B the candidate, on a fraction of the eligible calls."""

    id: str
    candidate: str
    fraction: float = Field(ge=0.0, le=1.0)
    state: State
    stop_reason: str | None = Field(None, description="why it stopped (by itself or by a person); null unless stopped")
    cells: list[ExperimentCell] = []
    saving: Saving = Field(default_factory=Saving)
    acknowledged: Acknowledged | None = Field(None, description="set once a person acknowledged the stop; the stop "
                                                                "alert fires until then")


class ExperimentsOut(BaseModel):
    """`GET /experiments`: every experiment this service knows of (every process's, in multiprocess mode)."""

    experiments: list[ExperimentOut]


class ControlError(BaseModel):
    """The body of a refused experiment request: one line that says what to change."""

    message: str
