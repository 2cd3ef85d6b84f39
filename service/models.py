"""Response models: what each endpoint returns, typed so /openapi.json documents it.

Models that carry another package's JSON (the explain result, telemetry's snapshot) allow
extra keys: a field added there passes through unchanged instead of being silently dropped.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dispatcher.explain import ExplainRequest
from dispatcher.platform import KNOWN_ARCHS
from dispatcher.policy import DEFAULT_GFX942_MIN_ROWS, DEFAULT_GFX950_MIN_ROWS

MAX_ROWS = 2**31 - 1  # rows, thresholds and query lengths: int32's max, so int32 row offsets hold their sum
MAX_TOPK = 2**20


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class GateOut(BaseModel):
    name: str
    passed: bool
    detail: str


class PlatformOut(_Open):
    """Where calls run, and whether AITER could be imported here (with the reason when not)."""

    vendor: str
    arch: str
    device_name: str = ""
    what_if: bool = False
    aiter_enabled: bool
    aiter_mla_enabled: bool
    aiter_importable: bool | None = None
    aiter_reason: str = ""
    aiter_version: str | None = None


class PolicyOut(_Open):
    name: str = "active"
    gfx942_min_rows: int
    gfx950_min_rows: int
    guard: str
    spec_tokens: int = 0


class ExplainResponse(_Open):
    """Exactly `routescope explain --json`: the decision, its gate trace, and what was assumed."""

    kernel: str
    reason: str
    reason_code: str
    branch: str
    gates: list[GateOut]
    call_class: str
    decode_rows: int
    decode_in_prefill: bool
    rerouted_from: str | None = None
    refused: bool = False
    rows: int
    decode_requests: int
    requests: int
    platform: PlatformOut
    policy: PolicyOut
    request: ExplainRequest


class ValidationErrorItem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str
    parameter: str | None = Field(None, description="the query parameter at fault, when one is")


class ValidationErrorOut(BaseModel):
    """422: `message` names each bad parameter on one line; `detail` is FastAPI's usual list."""

    message: str
    detail: list[ValidationErrorItem]


class HealthOut(BaseModel):
    status: Literal["ok"] = "ok"


class ReadyCheck(BaseModel):
    name: str
    ok: bool
    detail: str


class ReadyOut(BaseModel):
    """Ready when telemetry is flushing and, with --demo, the workload is running."""

    ready: bool
    checks: list[ReadyCheck]


class ExplainQuery(ExplainRequest):
    """/routing/explain's query: ExplainRequest with bounds on every number (422 past them) and known arches only."""

    rows: int | None = Field(None, ge=1, le=MAX_ROWS, description=f"q.shape[0], 1..{MAX_ROWS}; defaults to the sum "
                                                                 "of query_lens")
    topk: int = Field(2048, ge=1, le=MAX_TOPK)
    query_lens: list[Annotated[int, Field(ge=1, le=MAX_ROWS)]] | None = Field(
        None, description="per-request query lengths, e.g. 1,1,8000 (at most 65536 requests, summing to "
                          f"at most {MAX_ROWS})")
    gfx942_min_rows: int = Field(DEFAULT_GFX942_MIN_ROWS, ge=0, le=MAX_ROWS)
    gfx950_min_rows: int = Field(DEFAULT_GFX950_MIN_ROWS, ge=0, le=MAX_ROWS)
    allow_unknown_arch: bool = Field(
        False, description=f"decide for an arch outside {', '.join(KNOWN_ARCHS)} (a what-if platform with no gate "
                           "of its own); without it such an arch is a 422")

    @model_validator(mode="after")
    def _bounded(self) -> ExplainQuery:
        if self.rows is not None and self.rows > MAX_ROWS:
            raise ValueError(f"rows (the sum of query_lens) must be <= {MAX_ROWS}; got {self.rows}")
        if self.arch not in KNOWN_ARCHS and not self.allow_unknown_arch:
            raise ValueError(f"arch {self.arch!r} is not one of {', '.join(KNOWN_ARCHS)}; "
                             "add allow_unknown_arch=true to decide for it anyway")
        return self

    def request(self) -> ExplainRequest:
        """The shared ExplainRequest (what the CLI takes), so the JSON stays the CLI's."""
        return ExplainRequest.model_validate(self.model_dump(exclude={"allow_unknown_arch"}))


class HealthProblem(BaseModel):
    """A multiprocess directory problem: an active condition, or a corrupt file that was quarantined."""

    model_config = ConfigDict(extra="allow")

    stage: str = Field(description="write (this process's files), read (the directory), compact")
    path: str
    problem: str = Field(description='e.g. "disk full", "missing", "permission denied", "corrupt file", '
                                     '"unreadable file"')
    detail: str
    blocking: bool = Field(False, description="makes /readyz answer 503 while it lasts")
    active: bool = Field(False, description="an ongoing condition (cleared when the operation succeeds again)")
    quarantined_as: str | None = Field(None, description="where a corrupt or unreadable file was renamed (null: it "
                                                         "could not be)")
