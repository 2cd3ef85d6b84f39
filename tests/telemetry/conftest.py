"""Shared helpers: small CPU calls, no-op kernels, a telemetry factory that closes what it made, a scrape parser."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dispatcher import Dispatcher, Policy, what_if
from dispatcher.kernels import KernelImpl, KernelRegistry
from dispatcher.types import Kernel
from telemetry import Telemetry, TelemetryConfig
from telemetry.exposition import classic_only

H, NOPE, ROPE = 2, 48, 16
D = NOPE + ROPE
IMPL = "torch"  # the label the no-op kernels report (a no-op stands in for the torch kernels)


def _noop(args: Any) -> None:
    pass


def noop_registry(fail: dict[Kernel, BaseException] | None = None) -> KernelRegistry:
    """Every kernel resolves to a launch that does nothing (or raises the given exception)."""
    reg = KernelRegistry()
    for k in Kernel:
        exc = (fail or {}).get(k)
        if exc is None:
            reg.register(KernelImpl(k, IMPL, _noop))
        else:
            def boom(args: Any, _e: BaseException = exc) -> None:
                raise _e
            reg.register(KernelImpl(k, IMPL, boom))
    return reg


_TENSORS: dict[tuple, tuple] = {}


def args_for(rows: int, *, dtype: torch.dtype = torch.float16, topk: int = 4, sink: bool = False,
             full_out: bool = False) -> list:
    """Positional arguments of one call with ``rows`` query rows (cached: tests make many calls)."""
    key = (rows, dtype, topk, sink, full_out)
    hit = _TENSORS.get(key)
    if hit is None:
        q = torch.zeros(rows, H, D, dtype=dtype)
        kv = torch.zeros(8, 1, D, dtype=dtype)
        idx = torch.zeros(rows, topk, dtype=torch.int32)
        out = torch.zeros(rows, H, D if full_out else NOPE, dtype=dtype)
        s = torch.zeros(H, dtype=torch.float32) if sink else None
        hit = _TENSORS[key] = (q, kv, idx, None, 0.125, D, NOPE, ROPE, s, out)
    return list(hit)


def dispatcher(platform: Any = None, policy: Policy | None = None, registry: KernelRegistry | None = None) -> Dispatcher:
    return Dispatcher(platform=platform if platform is not None else what_if("gfx942"),
                      policy=policy if policy is not None else Policy(),
                      registry=registry if registry is not None else noop_registry())


@pytest.fixture
def make_tel() -> Iterator[Callable[..., Telemetry]]:
    """Telemetry(config, platform, policy) built fresh per test (its own registry), closed at teardown."""
    made: list[Telemetry] = []

    def make(config: TelemetryConfig | None = None, *, platform: Any = None, policy: Policy | None = None,
             **kw: Any) -> Telemetry:
        tel = Telemetry(config or TelemetryConfig(models=("glm", "dsv4")),
                        platform=platform if platform is not None else what_if("gfx942"),
                        policy=policy if policy is not None else Policy(), **kw)
        made.append(tel)
        return tel

    yield make
    for tel in made:
        tel.close()


def scrape(registry: Any) -> dict[tuple[str, frozenset], float]:
    """{(sample name, labels): value} from a real text exposition of ``registry``."""
    text = generate_latest(classic_only(registry)).decode()  # native samples are for protobuf/OM 2.0 only
    out: dict[tuple[str, frozenset], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def series(samples: dict, name: str, **match: str) -> dict[frozenset, float]:
    """Samples of one name whose labels include ``match``; zero-valued ones dropped."""
    return {labels: v for (n, labels), v in samples.items()
            if n == name and v and all((k, val) in labels for k, val in match.items())}


def total(samples: dict, name: str, **match: str) -> float:
    return sum(series(samples, name, **match).values())


def L(**labels: str) -> frozenset:
    return frozenset(labels.items())
