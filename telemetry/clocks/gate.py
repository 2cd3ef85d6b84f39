"""The stream gate: hold a sampled call's stream until its kernels are queued, so its event pair times the GPU alone.

An event pair around a launch brackets whatever the stream does between the two records. When the host launches
slower than the GPU runs (every decode-sized call: an 8 µs kernel behind a 15-250 µs host path), the GPU reaches
the start event long before the kernels are queued and the pair times the host. The gate closes the stream first:
a one-program kernel polls a host-mapped word until the host writes this call's ticket into it. The host writes it
after the launch has returned, so by the time the stream moves on to the start event, the call's kernels and the
end event are all queued, and the pair brackets GPU work only. What remains is a constant of the GPU model (the
pair's own records and the step from the wait to the start event), taken out like the device clock's frame
(``telemetry.clocks.frame``).

One form for both vendors:
- the wait is a Triton kernel, compiled for CUDA or HIP alike (Triton is what vLLM's ROCm attention kernels are
  written in, so it is there wherever the plugin runs);
- the words are torch's pinned memory, host-mapped under unified addressing (``cudaHostAlloc``, ``hipHostMalloc``),
  one word per event pair, so two calls in flight never release each other;
- the pair is ``torch.cuda.Event``, a HIP event on ROCm.

Why not ``cuStreamWaitValue32`` / ``hipStreamWaitValue32`` (the vendors' stream memory operations): they wait with no
bound. A launch that synchronises inside (an allocator freeing cached blocks, a ``.item()``) would wait for a stream
that waits for it, while holding the GIL: a hang no Python watchdog could end. The kernel's wait is bounded
(``max_polls`` reads of the word); a wait that runs out lets the call through, and its sample is dropped
(``routescope_telemetry_dropped_total{reason="timing_gate_timeout"}``), never reported.

Only sampled eager calls are gated (one in ``sample_every``); graph captures are never gated. The kernel is compiled
off the call path (``GateFactory.prepare``, from the flush thread): until it is ready, a device's sampled calls are
not timed (``timing_clock_pending``), so a series never starts on plain pairs and then turns gated.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("routescope.telemetry")

MAX_TICKET = 2**31 - 1
DEFAULT_MAX_POLLS = 512  # a poll is one read of host memory over the bus: about 4 µs on an H200, so ~2 ms at most
PENDING, RELEASED, TIMED_OUT = -1, 0, 1  # what the wait wrote in its result word

# (words, results, index, ticket, max_polls, stream handle) -> None: enqueue the wait on that stream
WaitLauncher = Callable[[Any, Any, int, int, int, int], None]


class StreamGate:
    """One device's gate words (one per event pair of the pool) and its wait kernel."""

    def __init__(self, torch_mod: Any, device: Any, size: int, *, max_polls: int, launch: WaitLauncher) -> None:
        self.words = torch_mod.zeros(size, dtype=torch_mod.int32, pin_memory=True)
        self.results = torch_mod.zeros(size, dtype=torch_mod.int32, pin_memory=True)
        self.words_host = self.words.numpy()
        self.results_host = self.results.numpy()
        self.device = device
        self.max_polls = max_polls
        self._launch = launch
        self._tickets = [0] * size
        self._next = 0
        self._lock = threading.Lock()

    def close(self, index: int, stream_handle: int) -> None:
        """Enqueue a wait on word ``index`` for a fresh ticket; the stream stops there until ``open(index)``."""
        with self._lock:
            ticket = self._next + 1 if self._next < MAX_TICKET else 1
            self._next = ticket
        self._tickets[index] = ticket
        self.results_host[index] = PENDING
        self._launch(self.words, self.results, index, ticket, self.max_polls, stream_handle)

    def open(self, index: int) -> None:
        """Let the stream go on: a plain store to host memory, seen by the polling kernel."""
        self.words_host[index] = self._tickets[index]

    def outcome(self, index: int) -> int:
        """``RELEASED``, ``TIMED_OUT``, or ``PENDING`` (the wait has not run yet)."""
        return int(self.results_host[index])


class GateFactory:
    """Builds each device's gate off the call path; the hot path only asks ``get``."""

    def __init__(self, torch_mod: Any, size: int, *, max_polls: int = DEFAULT_MAX_POLLS,
                 launcher: Callable[[Any, Any], WaitLauncher] | None = None) -> None:
        self._torch = torch_mod
        self._size = size
        self._max_polls = max_polls
        self._launcher = launcher or triton_wait_launcher
        self._gates: dict[Any, StreamGate | None] = {}  # device -> gate; None: it failed to build (not retried)
        self._wanted: set[Any] = set()

    def get(self, device: Any) -> StreamGate | None:
        """The device's gate if ready; otherwise None, and the device is queued for ``prepare``."""
        gate = self._gates.get(device, False)
        if gate is False:
            self._wanted.add(device)
            return None
        return gate  # type: ignore[return-value]

    def prepare(self) -> int:
        """Build and warm the gates asked for (compiles the wait kernel); from the flush thread. Returns how many
        were built; a device whose gate fails keeps plain pairs, logged once."""
        built = 0
        for device in list(self._wanted):
            self._wanted.discard(device)
            if device in self._gates:
                continue
            try:
                gate = StreamGate(self._torch, device, self._size, max_polls=self._max_polls,
                                  launch=self._launcher(self._torch, device))
                warm(gate, self._torch, device)
            except Exception:  # noqa: BLE001 - no gate: plain event pairs, as before
                log.warning("routescope telemetry: no stream gate on %s; its event pairs stay plain", device,
                            exc_info=True)
                self._gates[device] = None
                continue
            self._gates[device] = gate
            built += 1
        return built

    def built(self, device: Any) -> bool:
        """Has ``device``'s gate been built, or failed to be (then its pairs are plain for good)?"""
        return device in self._gates

    def ready(self) -> list[Any]:
        """The devices whose gate is built (not those whose gate failed)."""
        return [device for device, gate in self._gates.items() if gate is not None]

    @property
    def pending(self) -> bool:
        return bool(self._wanted)


def warm(gate: StreamGate, torch_mod: Any, device: Any) -> None:
    """Run the wait once on a side stream and release it: the compile happens here, not in a sampled call."""
    stream = torch_mod.cuda.Stream(device)
    with torch_mod.cuda.device(device), torch_mod.cuda.stream(stream):  # the JIT's first launch takes both from torch
        gate.close(0, stream.cuda_stream)
    gate.open(0)


def triton_wait_launcher(torch_mod: Any, device: Any) -> WaitLauncher:
    """The Triton wait kernel, launched through a ``launcher.Step`` bound to its compiled handle after the first
    launch: the compiled C launcher with the words' addresses as plain ints (no JIT, no handle lookup, no pointer
    check per launch: the host cost a sampled gated call pays, docs/timing-fidelity.md)."""
    import triton
    import triton.language as tl

    from dispatcher.kernels.launcher import Step
    from dispatcher.kernels.stamps import Pointer

    step = Step(_wait_kernel(triton, tl), ("gate", getattr(device, "index", None) or 0), (1,), {})
    pointers: dict[int, tuple[Any, Any]] = {}

    def launch_wait(words: Any, results: Any, index: int, ticket: int, max_polls: int, stream_handle: int) -> None:
        typed = pointers.get(id(words))
        if typed is None:
            typed = pointers[id(words)] = (Pointer(words.data_ptr(), torch_mod.int32),
                                           Pointer(results.data_ptr(), torch_mod.int32))
        step((*typed, index, ticket, max_polls), stream_handle)

    return launch_wait


_KERNEL: Any = None


def _wait_kernel(triton: Any, tl: Any) -> Any:
    """``words[index] == ticket`` or ``max_polls`` reads, whichever comes first; writes which to ``results[index]``.

    The integers are not specialised: a ticket or an index of 1 would otherwise become a constant of the kernel."""
    global _KERNEL
    if _KERNEL is None:

        @triton.jit(do_not_specialize=["index", "ticket", "max_polls"])
        def gate_wait(words, results, index, ticket, max_polls):
            seen = tl.load(words + index, volatile=True)
            polls = 1
            while (seen != ticket) & (polls < max_polls):
                seen = tl.load(words + index, volatile=True)
                polls += 1
            tl.store(results + index, (seen != ticket).to(tl.int32))

        _KERNEL = gate_wait
    return _KERNEL
