"""Kernel implementations and the registry that picks one per kernel name and device."""

from .common import KernelArgs, SparseIndex
from .registry import KernelImpl, KernelRegistry, NoImplementation, default_registry

__all__ = ["KernelArgs", "KernelImpl", "KernelRegistry", "NoImplementation", "SparseIndex", "default_registry"]
