"""The routescope HTTP service: FastAPI app factory, uvicorn CLI, demo workload and the page at /."""

from __future__ import annotations

from routescope import __version__

__all__ = ["__version__", "create_app"]


def __getattr__(name: str):
    """``service.create_app`` without importing FastAPI until someone asks for it."""
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(name)
