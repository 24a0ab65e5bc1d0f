"""On a real NVIDIA GPU: torch's UUID finds its NVML device, fp8 runs through scaled_mm, the memory
snapshot reads the same GPU, and the NVML and torch views agree. Skipped without CUDA."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_every_cuda_device_has_its_nvml_gpu_by_uuid() -> None:
    import torch

    from tutor.hardware import detect_machine
    from tutor.hardware.torch_devices import torch_uuid

    machine = detect_machine(refresh=True)
    for index in range(torch.cuda.device_count()):
        device = f"cuda:{index}"
        by_uuid = machine.gpu_for(device, torch_uuid=torch_uuid(device))
        by_visible_devices = machine.gpu_for(device)
        assert by_uuid is not None, f"{device} ({torch_uuid(device)}) not among {[g.uuid for g in machine.gpus]}"
        assert by_visible_devices is not None and by_visible_devices.uuid == by_uuid.uuid, (
            "CUDA_VISIBLE_DEVICES parsing names another GPU than torch's UUID (CUDA_DEVICE_ORDER=FASTEST_FIRST?)")


def test_nvml_and_torch_agree_and_memory_reads_the_same_gpu() -> None:
    import torch

    from tutor.bench.memory import memory_accounting
    from tutor.hardware import detect_machine
    from tutor.hardware.torch_devices import accelerator_agreement, detect_torch_devices

    machine = detect_machine(refresh=True)
    assert accelerator_agreement(len(machine.gpus), machine.nvml.reason, detect_torch_devices()) is None
    snapshot = memory_accounting("cuda:0")
    assert snapshot.note == "" and snapshot.nvml_total_bytes is not None
    assert abs(snapshot.nvml_total_bytes - torch.cuda.get_device_properties(0).total_memory) < 2**30


def test_fp8_scaled_mm_runs_where_supported() -> None:
    import torch

    from tutor.bench.matmul import scaled_mm, supported_matmul_dtypes

    if "fp8" not in supported_matmul_dtypes("cuda:0"):
        pytest.skip("no fp8 on this GPU")
    a = torch.randn(256, 256, device="cuda:0").to(torch.float8_e4m3fn)
    b = torch.randn(256, 256, device="cuda:0").to(torch.float8_e4m3fn).t()
    out = scaled_mm(a, b, torch.tensor(1.0, device="cuda:0"), torch.bfloat16)
    reference = a.float() @ b.float()
    assert torch.allclose(out.float(), reference, rtol=0.05, atol=0.5)
