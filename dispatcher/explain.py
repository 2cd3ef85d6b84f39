"""A dry run of the routing decision for any platform and call: shared by the CLI and HTTP."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from .classify import classify_query_lens
from .inputs import MAX_REQUESTS, MAX_ROWS, DtypeName, QueryLen, Rows, Threshold, TopK, check_arch, parse_query_lens
from .platform import KNOWN_ARCHS, what_if
from .policy import DEFAULT_GFX942_MIN_ROWS, DEFAULT_GFX950_MIN_ROWS, Policy, decide, policy_from
from .types import UNKNOWN_BATCH, CallShape, GuardMode

Layout = Literal["dsv4", "glm"]  # 448+64 (DeepSeek-V4.x) or 512+0 (GLM-5.3)
LAYOUTS = {"dsv4": (448, 64), "glm": (512, 0)}
__all__ = ["DtypeName", "ExplainRequest", "explain", "parse_query_lens"]


class ExplainRequest(BaseModel):
    """One what-if call: the CLI's options and /routing/explain's query parameters, field for field.

    Every bound is dispatcher/inputs.py's, so `routescope explain` and GET /routing/explain refuse
    the same inputs with the same message.
    """

    model_config = ConfigDict(extra="forbid")

    allow_unknown_arch: bool = Field(
        False, description=f"decide for an arch outside {', '.join(KNOWN_ARCHS)} (a what-if platform with no gate "
                           "of its own); without it such an arch is refused")
    arch: str = Field("gfx942", description=f"gcnArchName or sm arch: {', '.join(KNOWN_ARCHS)}")
    rows: Rows | None = Field(None, description=f"q.shape[0], 1..{MAX_ROWS}; defaults to the sum of query_lens")
    q_dtype: DtypeName = "bfloat16"
    kv_dtype: DtypeName | None = Field(None, description="defaults to q_dtype")
    out_dtype: DtypeName | None = Field(None, description="defaults to q_dtype")
    aiter: bool = Field(True, description="VLLM_ROCM_USE_AITER")
    aiter_mla: bool = Field(True, description="VLLM_ROCM_USE_AITER_MLA")
    sink: bool = Field(False, description="an attention sink [H] fp32 is passed")
    layout: Layout = Field("dsv4", description="dsv4 (448+64) or glm (512+0)")
    heads: int = Field(16, ge=1, le=1024)
    topk: TopK = 2048
    query_lens: list[QueryLen] | None = Field(
        None, description=f"per-request query lengths, e.g. 1,1,8000 (at most {MAX_REQUESTS} requests, each and "
                          f"their sum at most {MAX_ROWS})")
    spec_tokens: int = Field(0, ge=0, le=64, description="a request of <= 1+spec_tokens rows is a decode")
    gfx942_min_rows: Threshold = DEFAULT_GFX942_MIN_ROWS
    gfx950_min_rows: Threshold = DEFAULT_GFX950_MIN_ROWS
    guard: GuardMode = GuardMode.OBSERVE

    @field_validator("arch")
    @classmethod
    def _arch(cls, v: str, info: ValidationInfo) -> str:
        return check_arch(v, allow_unknown=bool(info.data.get("allow_unknown_arch")))

    @field_validator("query_lens", mode="before")
    @classmethod
    def _query_lens(cls, v: object) -> object:
        if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str):
            v = v[0]  # a query string arrives as ["1,1,8000"]
        return parse_query_lens(v) if isinstance(v, str) else v  # a list: pydantic names an entry not an integer

    @field_validator("query_lens")
    @classmethod
    def _query_lens_bounded(cls, v: list[int] | None) -> list[int] | None:
        return parse_query_lens(v)

    @model_validator(mode="after")
    def _rows(self) -> ExplainRequest:
        lens = self.query_lens
        if lens is not None:
            if self.rows is None:
                self.rows = sum(lens)
            elif self.rows != sum(lens):
                raise ValueError(f"rows {self.rows} != sum(query_lens) {sum(lens)}")
        if self.rows is None:
            raise ValueError("give rows or query_lens")
        return self

    def shape(self) -> CallShape:
        nope, rope = LAYOUTS[self.layout]
        return CallShape(
            rows=self.rows or 0,
            heads=self.heads,
            head_dim=nope + rope,
            nope_head_dim=nope,
            rope_head_dim=rope,
            q_dtype=self.q_dtype,
            kv_dtype=self.kv_dtype or self.q_dtype,
            out_dtype=self.out_dtype or self.q_dtype,
            out_lanes=nope + rope,
            topk=self.topk,
            has_sink=self.sink,
            sink_ok=self.sink,
        )

    def policy(self) -> Policy:
        return policy_from(self)


def explain(req: ExplainRequest) -> dict:
    """The decision as JSON: kernel, reason, gates, call_class, decode_rows, and what was assumed."""
    platform = what_if(req.arch, aiter=req.aiter, aiter_mla=req.aiter_mla)
    policy = req.policy()
    batch = (
        classify_query_lens(req.query_lens, spec_tokens=req.spec_tokens, rows=req.rows)
        if req.query_lens
        else UNKNOWN_BATCH
    )
    decision = decide(req.shape(), platform, policy, batch)
    out = decision.to_dict(batch)
    out.update(
        rows=req.rows,
        decode_requests=batch.decode_requests,
        requests=batch.requests,
        platform=platform.to_dict(),
        policy=policy.to_dict(),
        request=req.model_dump(mode="json"),
    )
    return out
