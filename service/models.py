"""Response models: what each endpoint returns, typed so /openapi.json documents it.

Models that carry another package's JSON (the explain result, telemetry's snapshot) allow
extra keys: a field added there passes through unchanged instead of being silently dropped.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dispatcher.explain import ExplainRequest
from dispatcher.inputs import MAX_ROWS, MAX_TOPK

__all__ = ["MAX_ROWS", "MAX_TOPK", "ExplainQuery"]



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


ExplainQuery = ExplainRequest  # /routing/explain's query: the CLI's model, bounds and messages (dispatcher/inputs.py)


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
