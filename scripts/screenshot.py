"""Regenerate the README's picture of the page: `python scripts/screenshot.py` (writes docs/screenshot.png).

It starts `routescope serve --demo --demo-glm-bug` on a free loopback port, waits until the page has
something to show (calls of both demo models, GLM's decode-in-prefill, timed latency, two flushes of
rates and the advice), captures the page with headless chromium, and stops the server. Give --url to
capture a server that is already running instead. About 40 s on a 2-core CPU machine.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from dispatcher.outputs import OutputPathError, check_file, keep_aside  # noqa: E402

OUT = ROOT / "docs" / "screenshot.png"
WIDTH, HEIGHT = 1400, 1500
LISTENING = re.compile(r"listening on (\S+):(\d+)")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars"]


SETTLE_S = 40.0  # seconds of rates before the picture: the demo has reached most rows buckets by then


def ready(doc: dict, settle_s: float = SETTLE_S) -> bool:
    """The page has its whole picture: both models' calls, GLM's decode-in-prefill, latency, ``settle_s`` of
    rates and the advice."""
    models = {r["model"] for r in doc.get("counts", [])}
    rates = (doc.get("history") or {}).get("rates") or []
    advice = doc.get("advice") or {}
    return (len(models) >= 2 and doc["decode_in_prefill"]["calls"] > 0 and bool(doc.get("latency"))
            and sum(r["dt_s"] for r in rates) >= settle_s and advice.get("status") == "ok")


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def capture(url: str, out: Path, *, chromium: str, width: int = WIDTH, height: int = HEIGHT,
            profile: Path | None = None, timeout: float = 120.0) -> Path:
    """The page at ``url`` as a PNG at ``out`` (the first paint: the page carries its data)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="routescope-chromium-") as tmp:
        shot = Path(tmp) / "shot.png"
        r = subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile or Path(tmp) / 'profile'}",
                            f"--window-size={width},{height}", "--virtual-time-budget=1500", f"--screenshot={shot}",
                            url], capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0 or not shot.exists():
            raise RuntimeError(f"chromium failed ({r.returncode}): {r.stderr.strip()[-500:]}")
        data = shot.read_bytes()
    try:
        out.write_bytes(data)
    except OSError as exc:
        kept = keep_aside(data, out.name)
        raise RuntimeError(f"--out {out}: the write failed ({exc.strerror}); the picture is in {kept}") from None
    return out


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def serve_and_wait(log: Path, timeout: float, progress, settle_s: float = SETTLE_S) -> tuple[subprocess.Popen, str]:
    """`routescope serve --demo --demo-glm-bug --port 0`, until ``ready`` (its base URL)."""
    cmd = [sys.executable, "-c", "from routescope.cli import main; main()", "serve", "--demo", "--demo-glm-bug",
           "--port", "0"]
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline, base, said = time.monotonic() + timeout, "", 0.0
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"routescope serve exited {proc.returncode}: {log.read_text(errors='replace')[-800:]}")
        if not base:
            m = LISTENING.search(log.read_text(errors="replace"))
            base = f"http://127.0.0.1:{m.group(2)}" if m else ""
        if base:
            try:
                if ready(_get(base + "/routing"), settle_s):
                    return proc, base
            except (OSError, ValueError, KeyError):
                pass
        if time.monotonic() - said > 10:
            progress(f"waiting for the demo's traffic ({timeout - (deadline - time.monotonic()):.0f} s)")
            said = time.monotonic()
        time.sleep(0.5)
    stop(proc)
    raise RuntimeError(f"the demo had not shown everything within {timeout:.0f} s (log: {log})")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/screenshot.py", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT, help="the PNG to write (default: %(default)s)")
    ap.add_argument("--url", help="capture this running server's page instead of starting the demo")
    ap.add_argument("--width", type=int, default=WIDTH)
    ap.add_argument("--height", type=int, default=HEIGHT)
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for the demo (default: %(default)s)")
    ap.add_argument("--settle", type=float, default=SETTLE_S,
                    help="seconds of the demo's traffic before the picture (default: %(default)s)")
    a = ap.parse_args(argv)
    try:
        out = check_file(a.out, "--out")
    except OutputPathError as exc:
        ap.exit(2, f"{ap.prog}: {exc}\n")
    if not 320 <= a.width <= 4000 or not 240 <= a.height <= 8000:
        ap.exit(2, f"{ap.prog}: --width must be 320..4000 and --height 240..8000\n")
    if not 0 <= a.settle < a.timeout:
        ap.exit(2, f"{ap.prog}: --settle must be 0 or more and under --timeout ({a.timeout:g})\n")
    chromium = find_chromium()
    if chromium is None:
        ap.exit(2, f"{ap.prog}: chromium is not installed (apt-get install chromium)\n")
    if a.url is not None:  # a page that will not load is said now, in one line, not as chromium's log
        try:
            _get(a.url.rstrip("/") + "/routing")
        except (OSError, ValueError) as exc:
            ap.exit(2, f"{ap.prog}: --url {a.url}: no routescope page there ({exc})\n")
    say = lambda text: print(f"screenshot: {text}", file=sys.stderr)  # noqa: E731
    import tempfile

    proc = None
    try:
        with tempfile.TemporaryDirectory(prefix="routescope-screenshot-") as tmp:
            url = a.url
            if url is None:
                say("starting routescope serve --demo --demo-glm-bug")
                proc, url = serve_and_wait(Path(tmp) / "serve.log", a.timeout, say, a.settle)
            capture(url.rstrip("/") + "/", out, chromium=chromium, width=a.width, height=a.height)
    except RuntimeError as exc:
        print(f"{ap.prog}: {exc}", file=sys.stderr)
        return 1
    finally:
        if proc is not None:
            stop(proc)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
