"""A worker for the kill tests and ``routescope bench multiproc``: real Dispatcher + Telemetry, calling until stopped.

Before each call it counts the call in a file it shares with the test (a mapped file survives
a kill -9): ``started`` at offset 0, and every 10 ms a (monotonic time, started) checkpoint in
a ring, so the test can tell how many calls were made in the last second before the kill.
``--host`` sets what the host does with SIGTERM before telemetry starts: nothing (default), a
handler of its own that exits 3, or ignoring it.
"""

from __future__ import annotations

import argparse
import mmap
import os
import signal
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

RING = 1024
SLOT_BYTES = 8 + RING * 16


def open_slot(path: str, create: bool) -> mmap.mmap:
    if create:
        with open(path, "wb") as f:
            f.write(bytes(SLOT_BYTES))
    with open(path, "r+b") as f:
        return mmap.mmap(f.fileno(), SLOT_BYTES)


def read_slot(path: str) -> tuple[int, list[tuple[float, int]]]:
    """(calls started, checkpoints (time, started) oldest first)."""
    with open(path, "rb") as f:
        data = f.read()
    started = struct.unpack_from("q", data, 0)[0]
    ring = [struct.unpack_from("dd", data, 8 + 16 * i) for i in range(RING)]
    return started, sorted((t, int(n)) for t, n in ring if t > 0)


def real_dispatcher() -> Any:
    """The real dispatcher and torch kernels (CPU), as a what-if cpu platform."""
    from dispatcher import Dispatcher, Policy, what_if
    from dispatcher.kernels import default_registry

    return Dispatcher(platform=what_if("cpu"), policy=Policy(), registry=default_registry(triton=False))


def make_tel(path: str | None, **cfg: Any) -> Any:
    from dispatcher import Policy, what_if
    from telemetry import Telemetry, TelemetryConfig

    cfg.setdefault("models", ("glm",))
    cfg.setdefault("log_first_decode_in_prefill", False)
    return Telemetry(TelemetryConfig(multiproc_dir=path, **cfg), platform=what_if("cpu"), policy=Policy())


def make_call() -> Callable[..., None]:
    """``call(dispatcher, model="glm")``: one real 3-row mixed call (1 decode row, a 2-row prefill)."""
    import torch

    g = torch.Generator().manual_seed(3)
    q, kv = torch.randn(3, 2, 64, generator=g), torch.randn(20, 1, 64, generator=g)
    idx = torch.randint(-1, 20, (3, 8), generator=g, dtype=torch.int32)

    def call(d: Any, model: str | None = "glm") -> None:
        out = torch.empty(3, 2, 48)
        d(q, kv, idx, None, 0.3, 64, 48, 16, None, out, model=model, query_lens=[1, 2])

    return call


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--slot", required=True)
    ap.add_argument("--rank", default="0")
    ap.add_argument("--host", choices=("none", "handler", "ignore"), default="none")
    ap.add_argument("--calls", type=int, default=0, help="stop (normal exit, no close()) after N calls; 0: never")
    a = ap.parse_args()
    if a.host == "handler":
        def host_handler(signum, frame):
            sys.stderr.write("host handler ran\n")
            sys.exit(3)
        signal.signal(signal.SIGTERM, host_handler)
    elif a.host == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    import torch

    torch.set_num_threads(1)  # several workers share two cores

    slot = open_slot(a.slot, create=True)
    tel = make_tel(a.dir, rank=a.rank)  # the defaults: flush every 1 s, flush at exit and on SIGTERM
    d = tel.instrument(real_dispatcher())
    call = make_call()
    tel.start()
    print("ready", flush=True)
    started, last_mark = 0, 0
    while a.calls == 0 or started < a.calls:
        started += 1
        slot[0:8] = struct.pack("q", started)
        now = time.monotonic()
        mark = int(now * 100)
        if mark != last_mark:
            off = 8 + 16 * (mark % RING)
            slot[off:off + 16] = struct.pack("dd", now, started)
            last_mark = mark
        call(d)
    os._exit(0) if a.calls < 0 else None  # never: a normal exit runs the atexit flush


if __name__ == "__main__":
    main()
