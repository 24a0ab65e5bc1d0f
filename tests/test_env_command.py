"""`tensor-tutor env`: JSON keys, Rich rendering of the CPU and GPU states, speed-related import hygiene."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from tutor.commands import env as env_module
from tutor.hardware import detect_machine
from tutor.hardware.cpu import detect_cpu
from tutor.hardware.machine import UNKNOWN_GPU, Machine
from tutor.hardware.nvidia import GpuInfo, NvmlStatus

GiB = 2**30


def test_json_on_this_machine():
    result = CliRunner().invoke(env_module.env, ["--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data) >= {"cpu", "memory", "nvml", "gpus", "versions"}
    assert data["cpu"]["logical_cores"] >= 1
    assert set(data["cpu"]["peaks"]) == {"fp32", "tf32", "bf16", "fp16", "fp8", "int8"}
    assert data["cpu"]["clock"]["assumed_for_peak_source"]
    assert data["memory"]["total_bytes"] > 0 and data["memory"]["peak_gbps"] is None
    assert isinstance(data["nvml"]["available"], bool)
    if not data["nvml"]["available"]:
        assert data["nvml"]["reason"] and data["gpus"] == []
    assert data["versions"]["python"]


def test_cpu_peaks_in_json_agree_with_the_machine_api():
    machine = detect_machine()
    data = json.loads(CliRunner().invoke(env_module.env, ["--json"]).output)
    for dtype, peak in data["cpu"]["peaks"].items():
        assert peak["tflops"] == machine.peak_tflops("cpu", dtype)
        assert peak["source"] == machine.peak_source("cpu", dtype)


def test_rich_rendering_on_this_machine():
    result = CliRunner().invoke(env_module.env, [])
    assert result.exit_code == 0, result.output
    assert "CPU" in result.output and "RAM" in result.output and "clock for peaks" in result.output
    # One panel per GPU NVML lists here (an H200 machine: "GPU 0: NVIDIA H200 (cuda:0 ..."); without one,
    # the single "NVIDIA GPUs" panel that says why.
    gpus = detect_machine().gpus
    if gpus:
        assert all(f"GPU {gpu.index}: " in result.output for gpu in gpus), result.output
    else:
        assert "NVIDIA GPUs" in result.output


@pytest.fixture
def fake_machine(monkeypatch):
    gpus = [
        GpuInfo(0, "NVIDIA H200", uuid="GPU-1", memory_total_bytes=141 * GiB, memory_used_bytes=GiB,
                memory_free_bytes=140 * GiB, sm_clock_mhz=1980, sm_clock_max_mhz=1980, memory_clock_mhz=3201,
                memory_clock_max_mhz=3201, power_w=120.0, power_limit_w=700.0, temperature_c=40,
                utilization_gpu_pct=0, utilization_memory_pct=0, pcie_generation=5, pcie_generation_max=5,
                pcie_width=16, pcie_width_max=16, compute_capability=(9, 0), clock_event_reasons=("idle",),
                processes=()),
        GpuInfo(1, "NVIDIA GH200 480GB", power_w=None, clock_event_reasons=None,
                unavailable={"power_w": "N/A: not supported", "clock_event_reasons": "N/A: not supported"}),
    ]
    machine = Machine(cpu=detect_cpu(), gpus=gpus, nvml=NvmlStatus(True, None, "570.86", "12.8"), versions={})
    monkeypatch.setattr(env_module, "detect_machine", lambda: machine)
    return machine


def test_rich_rendering_with_gpus(fake_machine):
    result = CliRunner().invoke(env_module.env, [], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "NVIDIA H200" in out and "H200 SXM 141GB" in out and "989.4" in out and "4.8 TB/s" in out and "1830 MHz" in out
    assert UNKNOWN_GPU in out and "N/A: not supported" in out
    assert "gen 5 x16" in out and "idle" in out and "570.86" in out


def test_json_with_gpus(fake_machine):
    data = json.loads(CliRunner().invoke(env_module.env, ["--json"]).output)
    assert [g["spec_status"] for g in data["gpus"]] == ["datasheet", UNKNOWN_GPU]
    assert data["gpus"][0]["spec"]["peak_tflops"]["bf16"] == pytest.approx(989.4)
    assert data["nvml"]["driver_version"] == "570.86"


def test_no_driver_state_is_spelled_out(monkeypatch):
    machine = Machine(cpu=detect_cpu(), gpus=[], versions={},
                      nvml=NvmlStatus(False, "no NVIDIA driver found (NVML: Driver Not Loaded)"))
    monkeypatch.setattr(env_module, "detect_machine", lambda: machine)
    result = CliRunner().invoke(env_module.env, [], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "no NVIDIA driver found (NVML: Driver Not Loaded)" in result.output


def test_env_through_the_cli_does_not_import_torch():
    code = ("import sys, io, contextlib\nfrom tutor.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        main(['env', '--json'])\n    except SystemExit as e:\n        assert not e.code\n"
            "assert 'torch' not in sys.modules and 'textual' not in sys.modules, 'heavy import'\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)


def test_unknown_option_is_a_usage_error():
    result = CliRunner().invoke(env_module.env, ["--bogus"])
    assert result.exit_code == 2


def test_torch_opt_in_lists_the_cpu_device():
    result = CliRunner().invoke(env_module.env, ["--json", "--torch"])
    assert result.exit_code == 0, result.output
    view = json.loads(result.output)["torch"]
    assert view["torch_version"] and view["error"] is None
    assert view["devices"][0]["device"] == "cpu"
