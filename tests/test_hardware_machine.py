"""detect_machine(): the API the bench uses, on this (CPU-only) machine; caching; no torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tutor.hardware import Machine, detect_machine
from tutor.hardware.machine import CPU_MEMORY_PEAK_NOTE, DTYPES


def test_detect_machine_is_cached_per_process():
    first = detect_machine()
    assert isinstance(first, Machine)
    assert detect_machine() is first
    refreshed = detect_machine(refresh=True)
    assert refreshed is not first and detect_machine() is refreshed


def test_cpu_peaks_through_the_api():
    machine = detect_machine()
    for dtype in DTYPES:
        peak = machine.cpu.peaks[dtype]
        value = machine.peak_tflops("cpu", dtype)
        assert value == (peak.flops / 1e12 if peak.flops is not None else None)
        source = machine.peak_source("cpu", dtype)
        assert source
        if value is not None:
            # The source names the formula and the clock it assumed.
            assert "physical cores" in source and "GHz" in source and machine.cpu.peak_clock.source in source
    assert machine.peak_tflops("cpu", "tf32") is None and machine.peak_tflops("cpu", "fp8") is None
    assert machine.peak_clock_hz("cpu") == machine.cpu.peak_clock.hz


def test_cpu_memory_peak_is_unknown_and_says_why():
    machine = detect_machine()
    assert machine.peak_memory_gbps("cpu") is None
    assert machine.peak_memory_source("cpu") == CPU_MEMORY_PEAK_NOTE and "dmidecode" in CPU_MEMORY_PEAK_NOTE


def test_mps_has_no_table():
    machine = detect_machine()
    assert machine.peak_tflops("mps", "fp32") is None and "measured only" in machine.peak_source("mps", "fp32")


def test_to_json_is_plain_json():
    data = detect_machine().to_json()
    assert json.loads(json.dumps(data)) == data
    assert set(data) == {"cpu", "memory", "nvml", "gpus", "versions"}


@pytest.mark.skipif(sys.platform != "linux", reason="the CI machine's layout")
def test_no_gpu_here_means_a_stated_reason():
    machine = detect_machine()
    if not machine.gpus:
        assert machine.nvml.reason
        assert machine.peak_tflops("cuda:0", "bf16") is None
        assert "measured only" in machine.peak_source("cuda:0", "bf16")


def test_detect_machine_does_not_import_torch():
    code = ("import sys\nfrom tutor.hardware import detect_machine\nm = detect_machine()\nm.to_json()\n"
            "assert 'torch' not in sys.modules and 'textual' not in sys.modules and 'numpy' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
