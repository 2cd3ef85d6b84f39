"""A rank process for the multiprocess tests: N calls, flush, say "ready", then exit on a line on stdin (or be killed)."""

from __future__ import annotations

import argparse
import sys

from dispatcher import Policy, what_if
from telemetry import Telemetry, TelemetryConfig
from telemetry.bench.workload import make_calls

from .conftest import dispatcher


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--rank", default="0")
    ap.add_argument("--calls", type=int, default=10_000)
    ap.add_argument("--process-id", default=None)
    a = ap.parse_args()
    cfg = TelemetryConfig(models=("glm", "dsv4"), multiproc_dir=a.dir, rank=a.rank, process_id=a.process_id,
                          log_first_decode_in_prefill=False)
    tel = Telemetry(cfg, platform=what_if("gfx942"), policy=Policy())
    d = tel.instrument(dispatcher())
    for args, kw in make_calls(a.calls):
        d(*args, **kw)
    tel.flush()
    print("ready", flush=True)
    sys.stdin.readline()
    tel.close()
    try:
        print("closed", flush=True)
    except BrokenPipeError:  # the test stopped listening
        pass


if __name__ == "__main__":
    main()
