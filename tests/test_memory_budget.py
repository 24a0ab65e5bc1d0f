"""One answer to 'how much memory does this device offer', shared by fit, its lab and the app."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tutor.errors import UserError
from tutor.hardware.memory_budget import device_budget

CPU = SimpleNamespace(model_name="Test CPU", ram_available_bytes=20 * 2**30)
GPU = SimpleNamespace(index=0, name="NVIDIA H100 80GB HBM3", memory_free_bytes=79 * 10**9)
NO_GPU = SimpleNamespace(cpu=CPU, gpus=[], nvml=SimpleNamespace(reason="NVML Shared Library Not Found"))
ONE_GPU = SimpleNamespace(cpu=CPU, gpus=[GPU], nvml=SimpleNamespace(reason=None))


def test_a_gpu_offers_its_free_memory_and_a_cpu_its_available_ram() -> None:
    assert device_budget(None, ONE_GPU).capacity == 79 * 10**9
    assert device_budget("0", ONE_GPU).kind == "cuda"
    assert device_budget(None, NO_GPU).capacity == 20 * 2**30
    assert device_budget("cpu", ONE_GPU).kind == "cpu" and not device_budget("cpu", ONE_GPU).gpu


def test_a_typed_size_is_a_card_you_do_not_have() -> None:
    budget = device_budget("24GiB", NO_GPU)
    assert (budget.capacity, budget.kind, budget.gpu) == (24 * 2**30, "given", True)


@pytest.mark.parametrize(("spec", "machine", "fragment"), [("0", NO_GPU, "NVML Shared Library"),
                                                           ("3", ONE_GPU, "has 1"), ("lots", NO_GPU, "size")])
def test_devices_that_are_not_there(spec: str, machine, fragment: str) -> None:
    with pytest.raises(UserError, match=fragment):
        device_budget(spec, machine)
