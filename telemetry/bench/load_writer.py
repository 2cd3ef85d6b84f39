"""A real writer process for `routescope bench serve --writers N`: a Telemetry on the directory, calling and flushing.

It makes ``--calls`` calls of ``WIDE_MIX`` (two models, 11 row counts from 1 to 16,384, pure-decode, prefill and
mixed batches: about 1.1 MB of text and 0.5 MB of protobuf per scrape of eight such processes, the size of the
directory the audit measured) through a real Dispatcher (no-op kernels) and its real Telemetry, starts the
background flush (every ``--flush-s``), prints ``ready``, then goes on calling at ``--rate`` calls a second until
it is terminated. Each flush rewrites its values in place and, as latencies land
in new native buckets, appends series: what a vLLM rank's files do, which one process writing eight file sets
does not.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time


def wide_mix() -> tuple:
    """(rows, batch metadata, model) for ``workload.make_calls``: every row count with a prefill and a mixed batch,
    the short ones also as pure decodes, for both models."""
    mix = []
    for rows in (1, 2, 4, 16, 64, 300, 600, 1024, 2048, 8192, 16384):
        for model in ("glm", "dsv4"):
            if rows <= 64:
                mix.append((rows, {"num_decodes": rows, "num_decode_tokens": rows, "num_prefills": 0}, model))
            mix.append((rows, {"num_decodes": 0, "num_decode_tokens": 0, "num_prefills": 1}, model))
            mix.append((rows, {"num_decodes": 1, "num_decode_tokens": 1, "num_prefills": 1} if rows > 1 else {},
                        model))
    return tuple(mix)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--rank", default="0")
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--rate", type=float, default=200.0, help="calls a second after the first --calls")
    ap.add_argument("--flush-s", type=float, default=1.0)
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    import torch

    torch.set_num_threads(1)
    from dispatcher import Dispatcher, Policy, what_if
    from telemetry import Telemetry, TelemetryConfig

    from .workload import make_calls, noop_registry

    tel = Telemetry(TelemetryConfig(models=("glm", "dsv4"), multiproc_dir=a.dir, rank=a.rank, flush_on_exit=False,
                                    log_first_decode_in_prefill=False, flush_interval_s=a.flush_s),
                    platform=what_if("gfx942"), policy=Policy())
    d = tel.instrument(Dispatcher(platform=what_if("gfx942"), policy=Policy(), registry=noop_registry()))
    calls = make_calls(max(a.calls, 1), mix=wide_mix())
    for args, kw in calls:
        d(*args, **kw)
    tel.flush()
    tel.start(flush_interval_s=a.flush_s)
    print("ready", flush=True)
    period = 1.0 / a.rate if a.rate > 0 else None
    i, due = 0, time.monotonic()
    try:
        while True:
            if period is None:
                time.sleep(3600)
                continue
            args, kw = calls[i % len(calls)]
            d(*args, **kw)
            i += 1
            due += period
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
    finally:
        tel.close()


if __name__ == "__main__":
    main()
