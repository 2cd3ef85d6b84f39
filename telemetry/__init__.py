"""Per-call routing telemetry for the dispatcher: a cheap probe, aggregates, Prometheus and OpenTelemetry export."""

from .config import TelemetryConfig, counterfactual_policy
from .core import Telemetry
from .probe import TelemetryProbe

__all__ = ["Telemetry", "TelemetryConfig", "TelemetryProbe", "counterfactual_policy"]
