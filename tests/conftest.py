"""Tests marked ``gpu`` need a CUDA/ROCm device: skipped, with the reason, where there is none."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any("gpu" in item.keywords for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA/ROCm device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
