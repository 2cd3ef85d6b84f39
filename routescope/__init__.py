"""routescope: see how sparse MLA prefill calls are routed to attention kernels."""

__version__ = "0.1.0"
