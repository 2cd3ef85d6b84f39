"""A real writer process for test_native_validity: real dispatcher calls, every one timed, flushed to a directory.

``exit N``: N calls, then a normal exit (telemetry's exit flush writes them). ``hang N``: N calls, a flush, ``flushed``
printed, then it waits to be killed. ``every MS``: calls without pause, a flush every MS milliseconds, until killed;
``ready`` printed after the first flush.
"""

from __future__ import annotations

import sys
import time


def main() -> None:
    path, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    import torch

    torch.set_num_threads(1)
    from tests.reliability.conftest import call, make_tel, real_dispatcher

    tel = make_tel(path, sample_first=1 << 30)  # every call timed: the classic and native counts are the calls
    d = tel.instrument(real_dispatcher())
    if mode == "every":
        period = n / 1000.0
        call(d)
        tel.flush()
        print("ready", flush=True)
        next_flush = time.monotonic() + period
        while True:
            call(d)
            if time.monotonic() >= next_flush:
                tel.flush()
                next_flush += period
    for _ in range(n):
        call(d)
    if mode == "hang":
        tel.flush()
        print("flushed", flush=True)
        time.sleep(3600)


if __name__ == "__main__":
    main()
