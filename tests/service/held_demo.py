"""A demo runner whose warm-up can be held or made to fail, for the tests of the warm-up's state and readiness."""

from __future__ import annotations

import threading

from service.demo.runner import DemoRunner


class HeldWarmUp(DemoRunner):
    """Its warm-up calls wait for ``go`` (or fail, with ``fail``); its traffic runs as usual."""

    def __init__(self, *a, fail: bool = False, **kw):
        super().__init__(*a, **kw)
        self.go, self.fail = threading.Event(), fail

    def _launch(self, spec, dispatcher):
        if dispatcher is not self.dispatcher:  # a warm-up call: the runner's quiet dispatcher
            if self.fail:
                raise RuntimeError("compiler crashed")
            self.go.wait(30)
        return super()._launch(spec, dispatcher)
