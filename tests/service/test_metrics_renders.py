"""/metrics renders one at a time: concurrent scrapes queue for the render instead of sharing the GIL with it."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor


class _Slow:
    """A collector on the service's registry that takes 50 ms and notes how many renders are inside at once."""

    def __init__(self) -> None:
        self.inside, self.most, self.lock = 0, 0, threading.Lock()

    def collect(self):
        with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
        time.sleep(0.05)
        with self.lock:
            self.inside -= 1
        return iter(())


def test_concurrent_scrapes_render_one_at_a_time_and_all_answer(client):
    slow = _Slow()
    client.app.state.routescope.http_registry.register(slow)
    with ThreadPoolExecutor(6) as pool:
        statuses = list(pool.map(lambda _: client.get("/metrics").status_code, range(6)))
    assert statuses == [200] * 6
    assert slow.most == 1
    assert client.get("/routing").status_code == 200  # the limit is /metrics' alone
