"""Run `routescope serve --demo` on a GPU machine for a while and report what /routing and /metrics show.

On the GPU machine, from the repository root, with the demo's wheels installed (docs/benchmarks.md,
"Machines and setup" and "The demo on a GPU"):

    python3 scripts/gpu/demo_check.py --seconds 25 --out "$OUT" [--glm-bug]

Prints the counts per kernel x rows bucket x model with implementation, and the latency quantiles, and
writes routing.json, metrics.txt and the server's log under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read()


READY_S = 120  # the demo's warm-up compiles every kernel its traffic uses first: tens of seconds on a GPU


def ready(base: str) -> bool:
    try:
        return bool(get(base + "/readyz"))
    except Exception:  # noqa: BLE001 - not up yet
        return False


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--glm-bug", action="store_true")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = [sys.executable, "-c", "from routescope.cli import main; main()", "serve", "--demo", "--port", str(port)]
    if a.glm_bug:
        cmd.append("--demo-glm-bug")
    log_path = a.out / f"serve{'-glm-bug' if a.glm_bug else ''}.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, process_group=0)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + READY_S
        while not ready(base):
            if proc.poll() is not None or time.time() > deadline:
                log.flush()
                why = f"exited with {proc.returncode}" if proc.poll() is not None else f"not ready in {READY_S} s"
                tail = log_path.read_text()[-3000:]
                print(f"demo_check: the server {why}; the end of its log ({log_path}):\n{tail}", file=sys.stderr)
                return 1
            time.sleep(0.5)
        t_ready = time.time()
        time.sleep(a.seconds)
        routing = json.loads(get(base + "/routing"))
        metrics = get(base + "/metrics").decode()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    suffix = "-glm-bug" if a.glm_bug else ""
    (a.out / f"routing{suffix}.json").write_text(json.dumps(routing, indent=1))
    (a.out / f"metrics{suffix}.txt").write_text(metrics)
    print(f"platform {routing['platform']['arch']} timing {routing.get('timing')} after {a.seconds:.0f}s "
          f"(ready {t_ready - (deadline - READY_S):.1f}s after start); glm bug {a.glm_bug}; "
          f"warm-up {routing['demo'].get('warm_up')}")
    for c in sorted(routing["counts"], key=lambda c: (c["model"], c["kernel"], c["rows_bucket"])):
        print(f"  {c['model']:>16} {c['kernel']:<24} {c['impl']:<7} {c['rows_bucket']:>11} {c['call_class']:<12} "
              f"calls {c['calls']:>5}")
    for row in routing["latency"]:
        if row["samples"]:
            print(f"  latency {row['model']:>16} {row['kernel']:<24} {row['rows_bucket']:>11} n={row['samples']:>4} "
                  f"p50 {row['p50_s'] * 1e6:9.1f} us  p99 {row['p99_s'] * 1e6:9.1f} us")
    dip = routing.get("decode_in_prefill", {})
    print("decode_in_prefill:", json.dumps(dip)[:600])
    print("health:", json.dumps(routing.get("health", {}))[:400])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
