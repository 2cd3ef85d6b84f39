"""A rank for test_native_e2e's multiprocess case: the quantiles workload into a multiprocess directory, then exit.

Every call is timed and kept; at the end telemetry closes (its last flush writes the files) and the raw samples go
to ``--out`` as JSON, ``{"kernel|rows_bucket|model|clock": [seconds, ...]}``: the exact side of the comparison.
"""

from __future__ import annotations

import argparse
import json

import torch

from dispatcher import Dispatcher, Policy, detect
from telemetry import Telemetry, TelemetryConfig
from telemetry.bench.quantiles import MODELS, workload

KEY = ("kernel", "rows_bucket", "model", "clock")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--rank", default="0")
    ap.add_argument("--calls", type=int, required=True)
    ap.add_argument("--max-rows", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    platform, policy = detect(), Policy()
    cfg = TelemetryConfig(models=tuple(m for m, _ in MODELS), multiproc_dir=a.dir, rank=a.rank, timing="host",
                          sample_first=1 << 30, sample_every=1, keep_samples=True, decisions_maxlen=0,
                          log_first_decode_in_prefill=False)
    tel = Telemetry(cfg, platform=platform, policy=policy)
    d = tel.instrument(Dispatcher(platform=platform, policy=policy))
    for args, kw in workload(calls=a.calls, max_rows=a.max_rows, heads=2, topk=32, kv_len=256, scale_down=8,
                             dtype=torch.float32, device=torch.device("cpu"), seed=a.seed):
        d(*args, **kw)
    samples: dict[str, list[float]] = {}
    for s in tel.drain_samples():
        samples.setdefault("|".join(s[k] for k in KEY), []).append(s["seconds"])
    tel.close()
    with open(a.out, "w") as f:
        json.dump(samples, f)


if __name__ == "__main__":
    main()
