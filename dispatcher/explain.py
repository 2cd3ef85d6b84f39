"""A dry run of the routing decision for any platform and call: shared by the CLI and HTTP."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .classify import classify_query_lens
from .platform import what_if
from .policy import DEFAULT_GFX942_MIN_ROWS, DEFAULT_GFX950_MIN_ROWS, Policy, decide, policy_from
from .types import UNKNOWN_BATCH, CallShape, GuardMode

DtypeName = Literal["bfloat16", "float16", "float32", "float8_e4m3fnuz", "float8_e4m3fn", "float8_e5m2", "float8_e5m2fnuz"]
Layout = Literal["dsv4", "glm"]  # 448+64 (DeepSeek-V4.x) or 512+0 (GLM-5.3)
LAYOUTS = {"dsv4": (448, 64), "glm": (512, 0)}


def parse_query_lens(value: str | list[int] | None) -> list[int] | None:
    """"1,1,8000" -> [1, 1, 8000]; blanks ignored; anything else is a clear error."""
    if value is None or isinstance(value, list):
        return value
    parts = [p.strip() for p in str(value).split(",") if p.strip()]
    if not parts:
        return None
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"query_lens must be comma-separated integers like 1,1,8000; got {value!r}") from None


class ExplainRequest(BaseModel):
    """One what-if call: the CLI's options and /routing/explain's query parameters, field for field."""

    model_config = ConfigDict(extra="forbid")

    arch: str = Field("gfx942", description="gcnArchName or sm arch: gfx942, gfx950, gfx90a, sm90, cpu")
    rows: int | None = Field(None, ge=0, description="q.shape[0]; defaults to the sum of query_lens")
    q_dtype: DtypeName = "bfloat16"
    kv_dtype: DtypeName | None = Field(None, description="defaults to q_dtype")
    out_dtype: DtypeName | None = Field(None, description="defaults to q_dtype")
    aiter: bool = Field(True, description="VLLM_ROCM_USE_AITER")
    aiter_mla: bool = Field(True, description="VLLM_ROCM_USE_AITER_MLA")
    sink: bool = Field(False, description="an attention sink [H] fp32 is passed")
    layout: Layout = Field("dsv4", description="dsv4 (448+64) or glm (512+0)")
    heads: int = Field(16, ge=1, le=1024)
    topk: int = Field(2048, ge=1)
    query_lens: list[int] | None = Field(None, description="per-request query lengths, e.g. 1,1,8000")
    spec_tokens: int = Field(0, ge=0, le=64, description="a request of <= 1+spec_tokens rows is a decode")
    gfx942_min_rows: int = Field(DEFAULT_GFX942_MIN_ROWS, ge=0)
    gfx950_min_rows: int = Field(DEFAULT_GFX950_MIN_ROWS, ge=0)
    guard: GuardMode = GuardMode.OBSERVE

    @field_validator("arch")
    @classmethod
    def _arch(cls, v: str) -> str:
        v = v.strip().lower()
        if not v or not v.replace("_", "").isalnum() or len(v) > 32:
            raise ValueError(f"arch must look like gfx942, gfx950 or sm90; got {v!r}")
        return v

    @field_validator("query_lens", mode="before")
    @classmethod
    def _query_lens(cls, v: object) -> object:
        if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str):
            v = v[0]  # a query string arrives as ["1,1,8000"]
        return parse_query_lens(v) if isinstance(v, str) else v

    @model_validator(mode="after")
    def _rows(self) -> ExplainRequest:
        lens = self.query_lens
        if lens is not None:
            if not lens or any(n < 1 for n in lens):
                raise ValueError("query_lens entries must be integers >= 1")
            if len(lens) > 65536:
                raise ValueError("query_lens has more than 65536 requests")
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
