"""Flush at interpreter exit and on SIGTERM, so a host that stops normally loses no calls.

One ``atexit`` hook and at most one SIGTERM handler per process, whatever the number of
Telemetry objects (kept in a weak set). The handler is installed only from the main thread
(Python allows no other), only over a default or Python handler (a host that ignores SIGTERM,
or handles it in C, is left alone), and keeps the host's behaviour: after the flush it calls
the handler it replaced, or, where that was the default, restores the default and sends the
signal again, so the process still dies of SIGTERM. A kill -9 runs nothing: what it loses is
the calls since the last flush (docs/telemetry.md).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import weakref
from typing import Any

log = logging.getLogger("routescope.telemetry")

_lock = threading.Lock()
_live: weakref.WeakSet[Any] = weakref.WeakSet()
_installed = {"atexit": False, "sigterm": False}
_previous: list[Any] = []  # the SIGTERM handler ours replaced


def register(tel: Any) -> None:
    """Flush (and close) ``tel`` at exit and flush it on SIGTERM; idempotent, never raises."""
    try:
        with _lock:
            _live.add(tel)
            if not _installed["atexit"]:
                atexit.register(_at_exit)
                _installed["atexit"] = True
            if not _installed["sigterm"] and threading.current_thread() is threading.main_thread():
                _installed["sigterm"] = _install_sigterm()
    except Exception:  # noqa: BLE001 - a host without signals still gets telemetry
        log.debug("routescope telemetry: exit hooks not installed", exc_info=True)


def unregister(tel: Any) -> None:
    _live.discard(tel)


def _install_sigterm() -> bool:
    prev = signal.getsignal(signal.SIGTERM)
    if prev is signal.SIG_IGN or prev is None:
        return True  # ignored on purpose, or a handler outside Python we could not call: leave it alone
    _previous[:] = [prev]
    signal.signal(signal.SIGTERM, _on_sigterm)
    return True


def _on_sigterm(signum: int, frame: Any) -> None:
    for tel in list(_live):
        try:
            tel._flush_for_exit()
        except Exception:  # noqa: BLE001
            pass
    prev = _previous[0] if _previous else signal.SIG_DFL
    if callable(prev):
        prev(signum, frame)
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the default: die of SIGTERM, as without us
    os.kill(os.getpid(), signal.SIGTERM)


def _at_exit() -> None:
    for tel in list(_live):
        try:
            tel.close()
        except Exception:  # noqa: BLE001
            pass
