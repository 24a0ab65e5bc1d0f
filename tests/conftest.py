"""Shared test configuration: GPU-marked tests are skipped where no CUDA device exists."""

from __future__ import annotations

import importlib.util
import os

import pytest

# Tests never write into the user's real data dir (results notebook, progress, settings).
os.environ.setdefault("TENSOR_TUTOR_DATA_DIR", os.path.join(os.path.dirname(__file__), ".tmp-data"))


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if gpu_items and not _cuda_available():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CUDA")
        for item in gpu_items:
            item.add_marker(skip)
