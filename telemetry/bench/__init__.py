"""Benchmarks of telemetry's own cost: `routescope bench overhead` (CPU) and `python -m telemetry.bench.gpu_replay`."""
