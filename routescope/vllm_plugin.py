"""vLLM general plugin entry point (group ``vllm.general_plugins``): ``register`` is all vLLM calls.

vLLM runs it in every process (front end, engine core, workers), possibly more than once,
and does not guard the call: so it is idempotent, imports nothing heavy unless switched on
with ROUTESCOPE_VLLM=1, and lets no exception out. See docs/vllm.md.
"""

from __future__ import annotations


def register() -> None:
    """Switch routescope's observers on in this process when ROUTESCOPE_VLLM=1; otherwise do nothing."""
    try:
        from routescope.vllm import enabled

        if not enabled():
            return
        from routescope.vllm.plugin import install

        install()
    except Exception:  # noqa: BLE001 - never break vLLM's startup
        try:
            import logging

            logging.getLogger("vllm.routescope").warning("routescope: register() failed", exc_info=True)
        except Exception:  # noqa: BLE001
            pass
