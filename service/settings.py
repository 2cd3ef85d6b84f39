"""Service settings: flags, then ROUTESCOPE_* environment, then defaults; read when built, never at import."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from dispatcher.policy import DEFAULT_GFX942_MIN_ROWS, DEFAULT_GFX950_MIN_ROWS, Policy, policy_from
from dispatcher.types import GuardMode

DEFAULT_PORT = 9475  # unassigned by IANA and clear of the usual 9090-9100 Prometheus range
DEMO_MODELS = ("DeepSeek-V4.1-Flash", "GLM-5.3-Flash")
LogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]


class ServiceSettings(BaseSettings):
    """Everything `routescope serve` can be told; one object so the app factory takes one argument."""

    model_config = SettingsConfigDict(env_prefix="ROUTESCOPE_", extra="ignore")

    host: str = Field("127.0.0.1", description="bind address; loopback unless told otherwise")
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)
    demo: bool = Field(False, description="run the embedded demo workload in this process")
    demo_glm_bug: bool = Field(False, description="the demo sends GLM decode rows through the prefill entry")
    demo_seed: int = Field(7, description="seed of the demo's traffic (the seed PR's runs used 7)")
    demo_duty: float = Field(0.25, gt=0.0, le=1.0, description="fraction of one core the demo may keep busy")
    demo_limit: int | None = Field(None, ge=1, description="stop the demo after this many calls (tests, benchmarks)")
    demo_full_scale: bool = Field(False, description="real head count, head dim and top-k even on CPU")
    demo_warm_up: bool | None = Field(
        None, description="before its traffic, one uncounted call of each kind the demo makes, so that kernels "
        "compiling at first use stay out of the latency histograms (default: on a GPU)")
    experiment: str | None = Field(
        None, description="with the demo: run this candidate as an experiment from the start (aa, gfx942_N, "
        "gfx950_N, split_below_N, decodes_split_k); its id is the candidate's name")
    experiment_fraction: float | None = Field(
        None, gt=0.0, le=0.1, description="probability that an eligible call goes to arm B (default the "
        "experiments package's, 0.01)")
    multiproc_dir: str | None = Field(None, description="PROMETHEUS_MULTIPROC_DIR for multiprocess metrics")
    rank: int = Field(0, ge=0, le=4095, description="tensor-parallel rank label")
    models: Annotated[list[str], NoDecode] = Field(default_factory=lambda: list(DEMO_MODELS), description="bounded model label set")
    gfx942_min_rows: int = Field(DEFAULT_GFX942_MIN_ROWS, ge=0)
    gfx950_min_rows: int = Field(DEFAULT_GFX950_MIN_ROWS, ge=0)
    guard: GuardMode = GuardMode.OBSERVE
    spec_tokens: int = Field(0, ge=0, le=64)
    decisions: int = Field(50, ge=1, le=1000, description="how many recent decisions /routing returns")
    flush_interval_s: float = Field(1.0, gt=0.0, le=60.0)
    head_timeout_s: float = Field(5.0, gt=0.0, le=600.0, description="a connection waiting for a request head (new, "
                                  "or after a response) is closed this long after it began to wait")
    max_connections: int = Field(1000, ge=1, le=1_000_000, description="open client connections allowed (also "
                                 "capped at the open-file limit less 64); one more closes the one waiting longest "
                                 "for a request head")
    histogram_mode: Literal["both", "native", "classic"] | None = Field(
        None, description="latency histogram forms /metrics serves (both, native, classic); default: "
        "ROUTESCOPE_TELEMETRY_HISTOGRAM_MODE, else both")
    log_level: LogLevel = "info"
    allowed_hosts: Annotated[list[str] | None, NoDecode] = Field(
        None, description="Host header names accepted (e.g. metrics.example.com,10.0.0.5; * for any); default: "
        "the loopback names when bound to loopback, else any")

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _hosts(cls, v: object) -> object:
        """"a,b" as well as a list; blanks dropped; an empty list means the default."""
        if isinstance(v, str):
            v = [p.strip() for p in v.split(",")]
        if isinstance(v, (list, tuple)):
            v = [str(p).strip().lower() for p in v if str(p).strip()] or None
        return v

    @field_validator("allowed_hosts")
    @classmethod
    def _host_patterns(cls, v: list[str] | None) -> list[str] | None:
        for p in v or ():
            if "*" in p[1:] or (p.startswith("*") and p != "*" and not p.startswith("*.")):
                raise ValueError(f"allowed host {p!r}: a wildcard must be '*' or lead like '*.example.com'")
        return v

    @field_validator("models", mode="before")
    @classmethod
    def _models(cls, v: object) -> object:
        """ROUTESCOPE_MODELS="a,b" as well as a JSON list; blanks dropped, order kept, no repeats."""
        if isinstance(v, str) and v.strip().startswith("["):
            v = json.loads(v)
        elif isinstance(v, str):
            v = [p for p in (s.strip() for s in v.split(",")) if p]
        if isinstance(v, (list, tuple)):
            seen: dict[str, None] = {}
            for name in v:
                name = str(name).strip()
                if name:
                    seen.setdefault(name, None)
            v = list(seen)
        return v

    @field_validator("models")
    @classmethod
    def _bounded(cls, v: list[str]) -> list[str]:
        if len(v) > 64:
            raise ValueError("at most 64 model names (they are metric label values)")
        return v

    @model_validator(mode="after")
    def _experiment_in_the_demo(self) -> ServiceSettings:
        if (self.experiment is not None or self.experiment_fraction is not None) and not self.demo:
            raise ValueError("--experiment runs an experiment in the demo's traffic: add --demo (for the processes "
                             "of a multiprocess directory: routescope experiment start --multiproc-dir DIR)")
        if self.experiment_fraction is not None and self.experiment is None:
            raise ValueError("--experiment-fraction needs --experiment NAME")
        return self

    def policy(self) -> Policy:
        return policy_from(self)

    def model_set(self) -> list[str]:
        """The configured models, plus the demo's when the demo runs (its traffic must not read as 'other')."""
        names = list(self.models)
        if self.demo:
            names += [m for m in DEMO_MODELS if m not in names]
        return names
