"""A process on a full filesystem, for test_disk_full: calls, flushes and scrapes; prints what it saw; exits 0.

``mmap`` as the first argument instead: prometheus_client's own MmapedDict writes one value
there, which is what routescope's writer did before it stopped mapping files (a SIGBUS on a
full tmpfs).
"""

from __future__ import annotations

import json
import sys

from prometheus_client import generate_latest


def main() -> None:
    path = sys.argv[2]
    if sys.argv[1] == "mmap":
        from prometheus_client.mmap_dict import MmapedDict

        d = MmapedDict(f"{path}/counter_mmap.db")
        d.write_value('["a", "a_total", {}, "h"]', 1.0, 0.0)
        print("wrote", flush=True)
        return
    from tests.reliability.conftest import call, make_tel, real_dispatcher

    tel = make_tel(path, flush_on_exit=False)
    d = tel.instrument(real_dispatcher())
    for _ in range(20):
        call(d)
    tel.flush()
    generate_latest(tel.collect_registry())
    problems = [p["problem"] for p in tel.health_problems() if p.get("blocking")]
    print(json.dumps({"phase": "full", "problems": problems}), flush=True)
    sys.stdin.readline()  # the test frees space
    for _ in range(5):
        call(d)
    tel.flush()
    problems = [p["problem"] for p in tel.health_problems() if p.get("blocking")]
    print(json.dumps({"phase": "freed", "problems": problems}), flush=True)
    tel.close()


if __name__ == "__main__":
    main()
