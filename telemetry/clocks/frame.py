"""The kernel frame: the part of a kernel's GPU time that its own stamps cannot see.

A stamping kernel writes the GPU's ``%globaltimer`` when its first program starts and when its last
program has stored its results. The kernel time a profiler reports (CUPTI, Nsight) runs from the
GPU starting the kernel to the kernel retiring, so it also holds the time before the first program
runs and after the last one's stores. That frame does not grow with the kernel: on the H200 it read
0.96-1.41 µs over 58 points from an 8 µs decode to a 1.2 ms prefill, one kernel or two
(docs/benchmarks.md, "Timing fidelity"). Left out, it makes an 8.5 µs kernel read 14% short.

So the ``device`` clock reports the stamped span plus the frame of the device's model: the value
measured here, or ``TelemetryConfig.device_frame_ns`` where set (``routescope bench fidelity``
prints the frame it measures on any GPU); a model not measured gets 0, the bare span.
"""

from __future__ import annotations

from typing import Any

# median of CUPTI's kernel time minus the stamped span, per device name (torch.cuda.get_device_name)
MEASURED_NS: dict[str, int] = {
    "NVIDIA H200": 1184,  # the median of 30 points at 9e2c0af, 16a8a00 and fabcea4 (960-1,344 ns)
}
AUTO = -1  # the setting's default: the measured frame of the device's model

# The event clocks' constants run the other way: what a pair reads beyond the kernel time, taken off each reading.
# A gated pair (telemetry.clocks.gate) holds the pair's own two records and the step from the gate's wait to the start
# event; a pair captured into a graph holds its two record nodes. Per device name; a model not measured gets 0.
DEVICE, GATED, GRAPH = "device", "gated", "graph"
_TABLES: dict[str, dict[str, int]] = {
    DEVICE: MEASURED_NS,
    GATED: {"NVIDIA H200": 2450},  # the gated median beyond CUPTI's over 24 points at 189c7e0 (2.0-3.0 µs)
    GRAPH: {},
}


def measured_ns(clock: str, device_name: str, setting: int | None = None) -> int:
    """The constant of ``clock`` for a device named ``device_name``: ``setting`` unless None or ``AUTO``, else the
    value measured for that model, else 0."""
    if setting is not None and setting != AUTO:
        return setting
    return _TABLES[clock].get(device_name, 0)


def frame_ns(device_name: str, setting: int = AUTO) -> int:
    """The frame added to a stamped span on a device named ``device_name``: the setting when it is not ``AUTO``,
    else the measured value, else 0."""
    if setting != AUTO:
        return setting
    return MEASURED_NS.get(device_name, 0)


def device_name(torch_mod, device) -> str:  # noqa: ANN001 - torch or a stand-in
    """The device's model name; "" where the runtime cannot say (the frame is then 0)."""
    try:
        return str(torch_mod.cuda.get_device_name(device))
    except Exception:  # noqa: BLE001 - a name is a nicety; the span is still right
        return ""


def constants_in_use(stamps: Any, events: Any, graph_events: Any, brackets: Any) -> dict[tuple[str, str], int]:
    """Each clock's constant (ns) per device it has been used on: ``routescope_clock_constant_seconds``."""
    out: dict[tuple[str, str], int] = {}
    for clock, per_device in ((DEVICE, stamps.frames() if stamps is not None else {}),
                              (GATED, events.frame.known() if events is not None else {}),
                              (GRAPH, graph_events.frame.known() if graph_events is not None else {}),
                              ("bracket", brackets.constants() if brackets is not None else {})):
        for device, ns in per_device.items():
            out[(clock, str(device))] = ns
    return out
