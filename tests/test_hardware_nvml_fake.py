"""GPU paths on a fake libnvidia-ml behind the REAL nvidia-ml-py wrappers (tests/fake_nvml.py):
device identity by UUID and CUDA_VISIBLE_DEVICES, MIG, an R525 driver, a lost GPU, and the
torch-version and torch-API variants. Everything here runs on a CPU-only machine."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest


from tests.fake_nvml import (
    GPU_IS_LOST, NO_PERMISSION, R535_SYMBOLS, FakeNvml, FakeProcess, a100_with_migs, h100, rtx_4090,
)

from tutor.errors import UserError
from tutor.hardware import nvidia
from tutor.hardware.cpu import detect_cpu
from tutor.hardware.machine import Machine, cuda_devices, gpu_for_cuda_index
from tutor.hardware.memory_budget import device_budget
from tutor.hardware.specs import SPECS_BY_KEY

GiB = 2**30
CPU = detect_cpu()


def machine_on(monkeypatch, fake: FakeNvml) -> Machine:
    fake.install(monkeypatch)
    status, gpus = nvidia.detect_nvidia()
    return Machine(cpu=CPU, gpus=gpus, nvml=status)


@pytest.fixture(autouse=True)
def no_visible_devices(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


# --- the fake itself behaves like libnvidia-ml through the real wrappers -------------------------

def test_real_error_subclasses_and_pointer_handles(monkeypatch):
    import pynvml

    FakeNvml([h100(lost=True)]).install(monkeypatch)
    pynvml.nvmlInit()
    try:
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetHandleByIndex(3)
    finally:
        pynvml.nvmlShutdown()


def test_no_driver_is_a_state_from_the_real_error_class(monkeypatch):
    machine = machine_on(monkeypatch, FakeNvml([h100()], init_error=12))
    assert machine.gpus == [] and machine.nvml.reason == "no NVIDIA driver found (NVML: NVML Shared Library Not Found)"


# --- 3. drivers older than R535 ---------------------------------------------------------------

def test_r525_driver_falls_back_to_the_throttle_reasons_call(monkeypatch):
    machine = machine_on(monkeypatch, FakeNvml([h100(reasons=0x4 | 0x200 | 0x400)], driver="525.147.05",
                                               missing=R535_SYMBOLS))
    (gpu,) = machine.gpus
    assert gpu.clock_event_reasons == ("software power cap", "board limit", "reliability")
    assert "clock_event_reasons" not in gpu.unavailable


def test_a_current_driver_uses_the_clock_event_call(monkeypatch):
    fake = FakeNvml([h100(reasons=0x1)])
    machine = machine_on(monkeypatch, fake)
    assert machine.gpus[0].clock_event_reasons == ("idle",)
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" not in fake.calls


def test_not_supported_is_not_retried_as_an_old_driver(monkeypatch):
    fake = FakeNvml([h100(errors={"nvmlDeviceGetCurrentClocksEventReasons": 3})])
    machine = machine_on(monkeypatch, fake)
    assert machine.gpus[0].unavailable["clock_event_reasons"] == "N/A: not supported"
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" not in fake.calls


def test_process_memory_the_driver_cannot_give_is_none(monkeypatch):
    machine = machine_on(monkeypatch, FakeNvml([h100(processes=[FakeProcess(1, None), FakeProcess(2, GiB)])]))
    assert machine.gpus[0].processes == (nvidia.GpuProcess(1, None), nvidia.GpuProcess(2, GiB))


# --- 1. NVML index vs CUDA index: one function, CUDA's parsing, UUIDs --------------------------

EIGHT = [h100(uuid=f"GPU-8{i}000000-aaaa-4000-8000-00000000000{i}") if i % 2 == 0
         else rtx_4090(uuid=f"GPU-9{i}000000-bbbb-4000-8000-00000000000{i}") for i in range(8)]


@pytest.mark.parametrize(("visible", "expected"), [
    (None, [0, 1, 2, 3, 4, 5, 6, 7]),
    ("7,3", [7, 3]),
    ("1", [1]),
    ("0,2,-1,1", [0, 2]),         # CUDA guide: an invalid entry hides the rest
    ("2,9,1", [2]),               # out of range is invalid too
    ("1,1", []),                  # a repeated device: no device at all
    ("", []),
    ("1gpu,2ampere", [1, 2]),     # strtoul-style parsing
    ("GPU-95,GPU-80", [5, 0]),    # UUID prefixes
    ("GPU-8", []),                # an ambiguous prefix is invalid
    ("3,GPU-93", []),             # the same GPU by index and by UUID is a repeat
])
def test_cuda_visible_devices_as_cuda_parses_it(monkeypatch, visible, expected):
    machine = machine_on(monkeypatch, FakeNvml(EIGHT))
    assert [gpu.index for gpu in cuda_devices(machine.gpus, visible)] == expected
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert [machine.gpu_for(f"cuda:{i}").index for i in range(len(expected))] == expected
    assert machine.gpu_for(f"cuda:{len(expected)}") is None


def test_torch_uuid_wins_over_the_order_guess(monkeypatch):
    machine = machine_on(monkeypatch, FakeNvml([h100(), rtx_4090()]))
    # CUDA's default FASTEST_FIRST may put the 4090 first; torch's UUID says which one cuda:0 is.
    bare = rtx_4090().uuid.removeprefix("GPU-")
    assert machine.gpu_for("cuda:0", torch_uuid=bare).name == "NVIDIA GeForce RTX 4090"
    assert gpu_for_cuda_index(0, machine.gpus, None, torch_uuid=bare).index == 1


def test_fit_budgets_the_gpu_torch_runs_on(monkeypatch):
    machine = machine_on(monkeypatch, FakeNvml([h100(), rtx_4090()]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    for spec in (None, "0", "cuda:0", "cuda"):
        budget = device_budget(spec, machine)
        assert (budget.name, budget.capacity) == ("GPU 1: NVIDIA GeForce RTX 4090", 23 * GiB), spec
    with pytest.raises(UserError, match=r"no GPU 1: CUDA_VISIBLE_DEVICES='1' shows CUDA 1 of this machine's 2"):
        device_budget("1", machine)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,1")
    assert device_budget(None, machine).kind == "cpu"  # torch would see no GPU and run on the CPU
    with pytest.raises(UserError, match="shows CUDA 0 of"):
        device_budget("0", machine)


def test_peaks_and_name_follow_the_same_gpu(monkeypatch):
    from tutor.calculators import device_peaks
    from tutor.ui.widgets.live_pane import peak_lines, shown_gpu

    machine = machine_on(monkeypatch, FakeNvml([h100(), rtx_4090()]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    flops, _, name = device_peaks(machine, "this", "bf16")
    assert name == "NVIDIA GeForce RTX 4090"
    assert flops == pytest.approx(SPECS_BY_KEY["rtx-4090"].peak_tflops("bf16") * 1e12)
    assert shown_gpu(machine).index == 1
    assert peak_lines(machine)[1] == f"peak bf16: {SPECS_BY_KEY['rtx-4090'].peak_tflops('bf16'):.3g} TFLOP/s"


def test_live_pane_traces_the_gpu_its_peaks_describe(monkeypatch):
    from tutor.hardware.sampler import NvmlReader, Sample
    from tutor.ui.widgets.live_pane import gpu_series, shown_gpu

    machine = machine_on(monkeypatch, FakeNvml([h100(), rtx_4090(utilization=(12, 3))]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    reader = NvmlReader()
    try:
        samples = [Sample(0.0, None, None, None, reader())]
    finally:
        reader.close()
    series = gpu_series(samples, shown_gpu(machine))
    assert series[0].reading.strip() == "12.0 %" and series[1].reading.startswith("1.0 / 24 GiB")


def test_bench_memory_reads_the_gpu_torch_names(monkeypatch):
    import tutor.hardware
    import tutor.hardware.torch_devices
    from tutor.bench import memory

    machine = machine_on(monkeypatch, FakeNvml([h100(), rtx_4090()]))
    monkeypatch.setattr(tutor.hardware, "detect_machine", lambda: machine)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setattr(tutor.hardware.torch_devices, "torch_uuid", lambda device: None)
    uuid = memory.nvml_uuid_for("cuda:0")
    assert uuid == rtx_4090().uuid
    assert memory._nvml_memory(uuid) == (GiB, 24 * GiB, "")
    monkeypatch.setattr(tutor.hardware.torch_devices, "torch_uuid", lambda device: h100().uuid[4:])
    assert memory._nvml_memory(memory.nvml_uuid_for("cuda:0"))[:2] == (2 * GiB, 81559 * 2**20)
    assert memory._nvml_memory(None)[2].startswith("NVML does not list")


# --- 2. MIG ----------------------------------------------------------------------------------

def test_mig_devices_are_read_with_their_own_memory_and_sms(monkeypatch):
    machine = machine_on(monkeypatch, FakeNvml([a100_with_migs()]))
    (gpu,) = machine.gpus
    assert gpu.mig_enabled and [m.gpu_instance_id for m in gpu.mig_devices] == [1, 5, 6]
    one_g = gpu.mig_devices[1]
    assert one_g.sm_count == 14 and one_g.memory_total_bytes == 10 * GiB - 256 * 2**20
    assert one_g.spec.key == "a100-80gb-sxm" and one_g.is_mig
    assert gpu.processes == (nvidia.GpuProcess(777, None),)
    assert machine.to_json()["gpus"][0]["mig_devices"][1]["sm_count"] == 14


def test_a_mig_slice_gets_its_share_of_the_peak_and_its_own_memory(monkeypatch):
    machine = machine_on(monkeypatch, FakeNvml([h100(), a100_with_migs()]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-aaaaaaaa-0002")
    a100 = SPECS_BY_KEY["a100-80gb-sxm"]
    assert machine.peak_tflops("cuda:0", "bf16") == pytest.approx(a100.peak_tflops("bf16") * 14 / 108)
    assert machine.peak_memory_gbps("cuda:0") == pytest.approx(a100.bandwidth_gbps * (10 * GiB - 256 * 2**20)
                                                               / (81920 * 2**20))
    assert "14 SMs of 108" in machine.peak_source("cuda:0", "bf16")
    budget = device_budget("0", machine)
    assert budget.capacity == 10 * GiB - 256 * 2**20 and "MIG device 1" in budget.name
    assert machine.gpu_for("cuda:1") is None


def test_mig_enumeration_without_and_with_legacy_visible_devices(monkeypatch):
    machine = machine_on(monkeypatch, FakeNvml([h100(), a100_with_migs()]))
    units = cuda_devices(machine.gpus, None)
    assert [(u.index, u.mig_index) for u in units] == [(0, None), (1, 0), (1, 1), (1, 2)]
    legacy = cuda_devices(machine.gpus, f"MIG-{a100_with_migs().uuid}/6/0")
    assert [u.gpu_instance_id for u in legacy] == [6]


def test_mig_parent_memory_denied_still_reads_the_slices(monkeypatch):
    fake_gpu = a100_with_migs()
    fake_gpu.errors["nvmlDeviceGetMemoryInfo"] = NO_PERMISSION
    machine = machine_on(monkeypatch, FakeNvml([fake_gpu]))
    (gpu,) = machine.gpus
    assert gpu.memory_free_bytes is None and gpu.unavailable["memory"] == "N/A: insufficient permissions"
    assert device_budget("cuda:0", machine).capacity == 40 * GiB - 512 * 2**20 - GiB


def test_a_non_mig_gpu_says_mig_is_off_and_pre_ampere_says_nothing(monkeypatch):
    machine = machine_on(monkeypatch, FakeNvml([h100(), rtx_4090(capability=(7, 5))]))
    assert machine.gpus[0].mig_enabled is False and machine.gpus[1].mig_enabled is None
    assert "mig_mode" not in machine.gpus[1].unavailable


# --- 4. one lost GPU --------------------------------------------------------------------------

def test_a_lost_gpu_does_not_blank_the_others(monkeypatch):
    from tutor.hardware.sampler import NvmlReader

    machine = machine_on(monkeypatch, FakeNvml([h100(), rtx_4090(lost=True), a100_with_migs()]))
    assert "GPU is lost" in machine.gpus[1].name and machine.gpus[2].name == "NVIDIA A100-SXM4-80GB"
    reader = NvmlReader()
    try:
        samples = reader()
    finally:
        reader.close()
    by_key = {(s.index, s.mig_index): s for s in samples}
    assert by_key[(0, None)].utilization_pct == 97 and by_key[(1, None)].memory_used_bytes is None
    assert by_key[(2, None)].memory_used_bytes == 3 * GiB and by_key[(2, 0)].memory_used_bytes == GiB


def test_a_gpu_lost_while_sampling_reads_none_and_the_rest_go_on(monkeypatch):
    from tutor.hardware.sampler import NvmlReader

    fake = FakeNvml([h100(), rtx_4090()])
    fake.install(monkeypatch)
    reader = NvmlReader()
    try:
        assert [s.memory_used_bytes for s in reader()] == [2 * GiB, GiB]
        fake.gpus[0].lost = True
        assert [s.memory_used_bytes for s in reader()] == [None, GiB]
    finally:
        reader.close()
    assert fake.calls["shutdown"] == fake.calls["init"] == 1
    assert GPU_IS_LOST == 15


# --- 5. fp8 and SDPA on torch 2.3/2.4 ----------------------------------------------------------

def test_scaled_mm_works_with_the_torch_2_4_schema(monkeypatch):
    import torch

    from tutor.bench import matmul

    seen = {}

    def old_scaled_mm(self, mat2, *, bias=None, out_dtype=None, scale_a=None, scale_b=None, scale_result=None,
                      use_fast_accum=False):  # torch 2.3/2.4: keyword-only scales, (out, amax) returned
        seen.update(scale_a=scale_a, scale_b=scale_b)
        return torch.zeros(self.shape[0], mat2.shape[1], dtype=out_dtype), torch.tensor(0.0)

    monkeypatch.setattr(torch, "_scaled_mm", old_scaled_mm)
    scale = torch.tensor(1.0)
    out = matmul.scaled_mm(torch.zeros(4, 8), torch.zeros(8, 2), scale, torch.bfloat16)
    assert isinstance(out, torch.Tensor) and out.shape == (4, 2) and seen["scale_a"] is scale


def test_scaled_mm_matches_the_current_schema_under_fake_tensors():
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tutor.bench.matmul import scaled_mm

    with FakeTensorMode():
        a = torch.randn(32, 64).to(torch.float8_e4m3fn)
        b = torch.randn(16, 64).to(torch.float8_e4m3fn).t()
        out = scaled_mm(a, b, torch.tensor(1.0), torch.bfloat16)
    assert (out.shape, out.dtype) == ((32, 16), torch.bfloat16)


def test_gqa_attention_without_enable_gqa_matches(monkeypatch):
    import torch

    from tutor.labs import tiny_transformer as tt

    torch.set_num_threads(1)
    torch.manual_seed(0)
    block = tt.Block(tt.BlockShape(hidden=64, heads=4, kv_heads=2, ffn=128, style="llama", attention="sdpa",
                                   dropout=0.0)).eval()
    x = torch.randn(2, 16, 64)
    with torch.no_grad():
        new = block(x)
        calls = []
        real = torch.nn.functional.scaled_dot_product_attention

        def sdpa_2_4(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):  # no enable_gqa
            calls.append(k.shape[1])
            return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale)

        monkeypatch.setattr(tt, "sdpa_has_enable_gqa", lambda: False)
        monkeypatch.setattr(tt.F, "scaled_dot_product_attention", sdpa_2_4)
        old = block(x)
    assert calls == [4] and torch.allclose(new, old, atol=1e-6)


# --- 6. NVML vs torch, the fp32_precision API, NCCL device_id -----------------------------------

def test_fp32_precision_api_does_not_lose_the_results():
    import torch

    from tutor.bench.environment import float32_matmul_precision, torch_environment
    from tutor.bench.matmul import _precision_context

    previous = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    try:
        with pytest.raises(RuntimeError):
            torch.get_float32_matmul_precision()  # what used to escape after the suite
        assert float32_matmul_precision() == "cuda.matmul.fp32_precision=tf32"
        assert torch_environment()["float32_matmul_precision"] == "cuda.matmul.fp32_precision=tf32"
        with _precision_context("fp32", "cpu"):
            pass
    finally:
        torch.backends.cuda.matmul.fp32_precision = previous
    assert torch.get_float32_matmul_precision() in ("highest", "high", "medium")


def test_nvml_and_torch_disagreeing_is_one_line_that_says_why():
    from tutor.hardware.torch_devices import TorchDevice, TorchView, accelerator_agreement

    cpu = TorchDevice("cpu", "cpu", "cpu", None, None, None, None)
    cpu_wheel = TorchView("2.13.0+cpu", None, None, "AVX2", (cpu,))
    assert "CPU-only build" in accelerator_agreement(2, None, cpu_wheel)
    cuda_wheel = TorchView("2.13.0", "12.8", None, "AVX2", (cpu,))
    assert "cannot use them" in accelerator_agreement(1, None, cuda_wheel)
    gpu = TorchDevice("cuda:0", "cuda", "NVIDIA H100 80GB HBM3", 80 * GiB, 132, (9, 0), None, "1111")
    with_gpu = TorchView("2.13.0", "12.8", None, "AVX2", (cpu, gpu))
    assert accelerator_agreement(1, None, with_gpu) is None
    assert "NVML does not" in accelerator_agreement(0, "no NVIDIA driver found", with_gpu)
    assert accelerator_agreement(0, None, cpu_wheel) is None


_RANK_WITH_A_FAKE_INIT = """
import os
import torch, torch.distributed as dist
from tutor.bench import ranks

def init_process_group(backend, *, device_id=None, **kwargs):  # torch >= 2.3's signature has device_id
    raise RuntimeError(f"stop here: {backend} {device_id}")

class PrintingPipe:  # what the rank sends its parent, on stdout
    def send(self, message): print(repr(message), flush=True)
    def poll(self): return False
    def close(self): pass

dist.init_process_group = init_process_group
torch.cuda.set_device = lambda index: None
ranks._rank_main(lambda ctx, params: {}, {}, 1, 2, 29999, "nccl", 1, PrintingPipe(), os.getppid(), 1.0)
"""


def test_nccl_process_groups_bind_their_device(monkeypatch):
    import subprocess

    import torch
    import torch.distributed as dist

    from tutor.bench import collective, ranks

    # collective's torchrun main binds its device with the same function the local ranks use
    assert ranks.process_group_device("nccl", "cuda:1") == {"device_id": torch.device("cuda", 1)}
    assert ranks.process_group_device("gloo", "cpu") == {}
    # A spawned local rank (tutor.bench.ranks, which bench collective and the labs use) binds cuda:<rank>;
    # run in its own interpreter, since a rank ends its process when it fails.
    rank = subprocess.run([sys.executable, "-c", _RANK_WITH_A_FAKE_INIT], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parent.parent)
    assert rank.returncode == 1 and rank.stdout.strip() == "('error', 'RuntimeError: stop here: nccl cuda:1')", \
        rank.stdout + rank.stderr
    seen = {}

    def init_process_group(backend, *, device_id=None, **kwargs):  # torch >= 2.3's signature has device_id
        seen.update(kwargs, backend=backend, device_id=device_id)
        raise RuntimeError("stop here")

    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    # a whole torchrun job of one rank (tutor.bench.ranks refuses an incomplete set in one line)
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # one GPU for the job's one rank: NCCL
    seen.clear()
    with pytest.raises(RuntimeError, match="stop here"):
        collective.main([])
    assert seen["device_id"] == torch.device("cuda", 0)


def test_bench_header_says_why_the_gpu_is_not_used(monkeypatch):
    from tutor.bench import environment

    machine = SimpleNamespace(gpus=[object()], nvml=SimpleNamespace(reason=None))
    note = environment.accelerator_note(machine)
    import torch

    if not torch.cuda.is_available():
        assert note is not None and "NVML sees 1 GPU" in note
