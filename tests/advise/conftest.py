"""Fixtures: hermetic environment (no ROUTESCOPE_*/OTEL_* leaking in) and apps from the service's factory."""

from tests.service.conftest import clean_env, client_for  # noqa: F401 - the service tests' own fixtures
