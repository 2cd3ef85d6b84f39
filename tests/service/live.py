"""A real `routescope serve` subprocess on a free loopback port (--port 0), started and stopped by a test."""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
LISTENING = re.compile(r"listening on (\S+):(\d+)")


def routescope_exe() -> list[str]:
    exe = Path(sys.executable).with_name("routescope")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("routescope")
    return [found] if found else [sys.executable, "-c", "from routescope.cli import main; main()"]


class Served:
    """``routescope serve --port 0 ARGS``; the port is read from the banner it prints."""

    def __init__(self, *args: str, log: Path, env: dict[str, str] | None = None,
                 nofile: tuple[int, int] | None = None) -> None:
        """``nofile``: the (soft, hard) open-file limit the server starts with."""
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("ROUTESCOPE_", "OTEL_", "PROMETHEUS_MULTIPROC"))}
        clean.update(env or {})
        self.cmd = routescope_exe() + ["serve", "--port", "0", *args]
        self.log = log

        def limits() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, nofile)

        with log.open("wb") as out:
            self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=clean, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, preexec_fn=limits if nofile else None)
        self.port = 0
        self.base = ""

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def _alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"{' '.join(self.cmd)} exited {self.proc.returncode}:\n{self.text()[-4000:]}")

    def wait_ready(self, timeout: float = 90.0) -> Served:
        deadline = time.monotonic() + timeout
        while not self.port:
            self._alive()
            m = LISTENING.search(self.text())
            if m:
                self.port = int(m.group(2))
                self.base = f"http://127.0.0.1:{self.port}"
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"no 'listening on' line within {timeout} s:\n{self.text()}")
            time.sleep(0.1)
        while True:
            self._alive()
            try:
                if httpx.get(self.base + "/readyz", timeout=5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"/readyz not 200 within {timeout} s:\n{self.text()[-4000:]}")
            time.sleep(0.2)

    def get(self, path: str, **kw) -> httpx.Response:
        return httpx.get(self.base + path, timeout=30, **kw)

    def wait_for(self, pred, timeout: float = 60.0, what: str = "condition") -> dict:
        """Poll /routing until ``pred(routing)`` holds; returns that /routing."""
        deadline = time.monotonic() + timeout
        while True:
            self._alive()
            body = self.get("/routing").json()
            if pred(body):
                return body
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not reached within {timeout} s; last /routing demo: {body.get('demo')}")
            time.sleep(0.3)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Signal our own child by pid; SIGKILL only if it ignores us past ``timeout``."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def stopped_cleanly(self, sig: int = signal.SIGTERM, *, info_logged: bool = True) -> None:
        """Stop and check the lifespan's shutdown ran to the end (demo joined, telemetry flushed).

        uvicorn re-raises the signal after a graceful shutdown, so the exit status is the
        signal's (-15 for SIGTERM, 130 for Ctrl+C), as for any well-behaved server.
        """
        rc = self.stop(sig)
        log = self.text()
        assert rc in (0, -sig, 128 + sig), f"exit {rc}:\n{log[-3000:]}"
        assert "did not stop" not in log, log[-3000:]
        if info_logged:
            assert "Application shutdown complete" in log and "telemetry flushed and closed" in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
