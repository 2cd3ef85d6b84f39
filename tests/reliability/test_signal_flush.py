"""The SIGTERM flush cannot hang its process (issue 43).

Python runs a signal handler in the main thread, between two of its bytecodes: if that thread
held a lock the flush takes (the device stamps', the latency sink's, the directory problems',
the flush's own), a flush that waited for it would wait for itself, forever. Each is held here
by the very thread that then runs the handler's flush, which must return, skip only what that
lock guards (counted), and still write the calls to the directory. Last, a real SIGTERM lands
in a process whose main thread holds all of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dispatcher import Policy, what_if
from telemetry import Telemetry, TelemetryConfig
from telemetry.multiproc.health import Problems

from ..telemetry.cuda_double import FakeTorch, reset
from .conftest import ROOT, call, calls_in, errors, real_dispatcher


def gpu_tel(path: Path) -> Telemetry:
    """GPU timing (device stamps, sink) on CPU through the CUDA double; real calls on CPU tensors."""
    reset()
    cfg = TelemetryConfig(multiproc_dir=str(path), models=("glm",), flush_on_exit=False,
                          log_first_decode_in_prefill=False)
    return Telemetry(cfg, platform=what_if("cpu"), policy=Policy(), torch_module=FakeTorch)


def returns_while_holding(lock, fn) -> bool:
    """Run ``fn`` in a thread that holds ``lock`` already, as the thread a signal interrupted may; did it return?"""
    done = threading.Event()

    def run() -> None:
        with lock:
            fn()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done.wait(30)


LOCKS = {  # which lock the interrupted thread holds -> the stage its skip is counted in
    "stamps": (lambda tel: tel._stamps._lock, "timing"),
    "sink": (lambda tel: tel._sink._lock, "timing"),
    "problems": (lambda tel: tel._problems._lock, "flush"),
}


@pytest.mark.parametrize("which", sorted(LOCKS))
def test_the_exit_flush_skips_what_a_held_lock_guards_and_writes_the_rest(tmp_path, which):
    tel = gpu_tel(tmp_path)
    get_lock, stage = LOCKS[which]
    d = tel.instrument(real_dispatcher())
    for _ in range(3):
        call(d)
    tel._problems.report("read", str(tmp_path / "x.db"), "I/O error", "a condition: writing takes the lock to clear")
    before = errors(tel).get(stage, 0)
    assert returns_while_holding(get_lock(tel), tel._flush_for_exit), f"the exit flush waited on the {which} lock"
    try:
        assert calls_in(tmp_path) == 3  # written all the same
        assert errors(tel)[stage] > before
    finally:
        tel.close()


def test_the_exit_flush_gives_up_on_a_held_flush_lock(tmp_path):
    tel = gpu_tel(tmp_path)
    d = tel.instrument(real_dispatcher())
    call(d)
    assert returns_while_holding(tel._flush_lock, tel._flush_for_exit)
    try:
        assert errors(tel)["flush"] == 1
    finally:
        tel.close()


def test_problems_within_bounded_never_wait_for_their_own_thread():
    stages: list[str] = []
    p = Problems(stages.append)
    p.report("write", "/x/a.db", "disk full", "d")
    with p._lock, p.bounded(0.01):  # this thread holds it: a plain acquire would never return
        p.report("write", "/x/b.db", "disk full", "d")
        p.clear("write", "/x/a.db")
        p.clear_missing("write", "/x", set())
        p.quarantined("read", "/x/c.db", None, "bad")
    assert stages == ["write", "write", "flush", "flush", "flush", "read", "flush"]
    assert [c["path"] for c in p.conditions()] == ["/x/a.db"]  # the skipped bookkeeping did not happen
    p.clear("write", "/x/a.db")  # outside ``bounded``: waits as ever, and clears
    assert p.conditions() == []


CHILD = """
import os, signal, sys
from dispatcher import Policy, what_if
from telemetry import Telemetry, TelemetryConfig
from telemetry.multiproc import mpfile
from telemetry.bench.kill_worker import make_call, real_dispatcher
from tests.telemetry.cuda_double import FakeTorch

ran = []
signal.signal(signal.SIGTERM, lambda signum, frame: ran.append(signum))  # the host's handler, there first
path = sys.argv[1]
tel = Telemetry(TelemetryConfig(multiproc_dir=path, models=("glm",), log_first_decode_in_prefill=False),
                platform=what_if("cpu"), policy=Policy(), torch_module=FakeTorch)
d, call = tel.instrument(real_dispatcher()), make_call()
for _ in range(3):
    call(d)
tel._problems.report("read", os.path.join(path, "x.db"), "I/O error", "a condition: writing takes the lock")
with tel._sink._lock, tel._stamps._lock, tel._problems._lock:
    os.kill(os.getpid(), signal.SIGTERM)  # handled right here, by this thread, which holds every lock
    handled = list(ran)
entries, _ = mpfile.read(tel._writer.filename("counter"))
print("handled", handled, "calls", sum(v for _k, p, v, _t, _o in entries if p[1] == "routescope_calls_total"))
"""


def test_a_real_sigterm_while_the_main_thread_holds_every_lock(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    res = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "handled [15] calls 3.0" in res.stdout, res.stdout + res.stderr[-3000:]
