"""GPU paths of the bench: CUDA events, L2 flush, tensor-core dtypes, HBM bandwidth, transfers,
memory accounting. Skipped where torch sees no CUDA device."""

from __future__ import annotations

import importlib.util

import pytest


def _cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda(), reason="needs an NVIDIA GPU with CUDA")]


@pytest.fixture(scope="module")
def machine():
    from tutor.hardware import detect_machine

    return detect_machine()


def test_cuda_timing_uses_events_and_flushes_l2() -> None:
    import torch

    from tutor.bench.timing import time_case

    a = torch.randn(2048, 2048, device="cuda:0")
    timing = time_case(lambda: a @ a, device="cuda:0", warmup=2, iters=10, flush_l2=True)
    assert timing.iters == 10 and timing.best_s > 0


def test_bf16_and_fp8_matmul_report_below_the_datasheet(machine) -> None:
    from tutor.bench.matmul import matmul_throughput, supported_matmul_dtypes

    for dtype in [d for d in ("bf16", "fp8") if d in supported_matmul_dtypes("cuda:0")]:
        (result,) = matmul_throughput("cuda:0", dtype, budget_s=3.0, machine=machine)
        assert result.backend == "torch/cublas" and result.tflops_median > 0
        if result.peak_tflops is not None:
            # percent_of_peak is None exactly when the measurement came out above the datasheet.
            assert result.percent_of_peak is not None, result.peak_note
            assert 0 < result.percent_of_peak <= 100
            assert result.tflops_median <= result.peak_tflops


def test_device_bandwidth_and_transfers(machine) -> None:
    from tutor.bench.bandwidth import GPU_MIN_ARRAY_BYTES, host_device_transfer, memory_bandwidth

    results = memory_bandwidth("cuda:0", budget_s=3.0, machine=machine, ops=("copy", "triad"))
    assert [r.op for r in results] == ["copy", "triad"]
    assert all(r.array_bytes >= GPU_MIN_ARRAY_BYTES and r.gbps_best > 0 for r in results)
    transfers = host_device_transfer("cuda:0", budget_s=2.0, machine=machine)
    assert [(r.op, r.memory) for r in transfers] == [("h2d", "pinned"), ("h2d", "pageable"),
                                                     ("d2h", "pinned"), ("d2h", "pageable")]
    assert all(r.kind == "transfer" and r.gbps_best > 0 for r in transfers)


def test_memory_accounting_layers_are_ordered() -> None:
    import torch

    from tutor.bench.memory import memory_accounting

    keep = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda:0")
    snapshot = memory_accounting("cuda:0")
    assert snapshot.torch_allocated_bytes >= keep.numel()
    assert snapshot.torch_reserved_bytes >= snapshot.torch_allocated_bytes
    if snapshot.nvml_used_bytes is not None:
        assert snapshot.nvml_used_bytes >= snapshot.torch_reserved_bytes
