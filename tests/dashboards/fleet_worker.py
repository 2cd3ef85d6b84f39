"""A rank for test_fleet_e2e: waves of real calls into a node's multiprocess directory, on cue from the test.

Each wave is the quantiles workload (real torch kernels, rows at random inside each rows bucket, both models) at
shapes a latency table prices (top-k 128, the models' real layouts, bf16); with ``--glm-decodes N`` the rank also
sends N GLM pure decodes through the prefill entry (the seed's bug). Every call is timed and kept. After a wave the
rank flushes its files, writes the wave's raw samples to ``OUT-wave<k>.json``
(``{"kernel|rows_bucket|model|clock": [seconds, ...]}``) and prints ``ready <k>``; a line on stdin starts the next
wave, end of input (or ``stop``) closes telemetry and exits.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from dispatcher import Dispatcher, Policy, detect
from telemetry import Telemetry, TelemetryConfig
from telemetry.bench.quantiles import MODELS, workload

KEY = ("kernel", "rows_bucket", "model", "clock")
GLM = "GLM-5.3-Flash"


def calls_for(*, calls: int, max_rows: int, seed: int, glm_decodes: int) -> list:
    """One wave: the workload, then (shuffled in) GLM pure decodes of 1-2 rows through the prefill entry."""
    out = workload(calls=calls, max_rows=max_rows, heads=2, topk=128, kv_len=256, scale_down=1,
                   dtype=torch.bfloat16, device=torch.device("cpu"), seed=seed)
    glm_small = [(args, meta) for args, meta in out if meta["model"] == GLM and args[0].shape[0] <= 2]
    decode_meta = {"num_prefills": 0, "model": GLM}
    for i in range(glm_decodes):
        args, _meta = glm_small[i % len(glm_small)]
        rows = args[0].shape[0]
        out.append((args, {**decode_meta, "num_decodes": rows, "num_decode_tokens": rows}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--rank", default="0")
    ap.add_argument("--calls", type=int, required=True, help="per model and rows bucket, per wave")
    ap.add_argument("--max-rows", type=int, required=True)
    ap.add_argument("--glm-decodes", type=int, default=0, help="GLM pure decodes through the prefill entry, per wave")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="prefix of the per-wave sample files")
    a = ap.parse_args()
    platform, policy = detect(), Policy()
    cfg = TelemetryConfig(models=tuple(m for m, _ in MODELS), multiproc_dir=a.dir, rank=a.rank, timing="host",
                          sample_first=1 << 30, sample_every=1, keep_samples=True, decisions_maxlen=0,
                          log_first_decode_in_prefill=False)
    tel = Telemetry(cfg, platform=platform, policy=policy)
    d = tel.instrument(Dispatcher(platform=platform, policy=policy))
    wave = 0
    while True:
        wave += 1
        for args, kw in calls_for(calls=a.calls, max_rows=a.max_rows, seed=1000 * wave + a.seed,
                                  glm_decodes=a.glm_decodes):
            d(*args, **kw)
        samples: dict[str, list[float]] = {}
        for s in tel.drain_samples():
            samples.setdefault("|".join(s[k] for k in KEY), []).append(s["seconds"])
        tel.flush()
        with open(f"{a.out}-wave{wave}.json", "w") as f:
            json.dump(samples, f)
        print(f"ready {wave}", flush=True)
        line = sys.stdin.readline()
        if not line or line.strip() == "stop":
            break
    tel.close()


if __name__ == "__main__":
    main()
