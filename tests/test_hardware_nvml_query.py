"""One NVML query path (tutor.hardware.nvidia.NvmlQuery / open_nvml) for env, the live sampler and
bench's memory accounting: what the driver cannot answer becomes a reason, a bug in our code does not
hide behind it. Runs on the C-level fake of tests/fake_nvml.py behind the real nvidia-ml-py."""

from __future__ import annotations

from pathlib import Path

import pytest


from tests.fake_nvml import FakeNvml, h100, rtx_4090

from tutor.hardware import nvidia

GiB = 2**30


def test_a_driver_failure_is_a_reason_and_a_bug_is_raised(monkeypatch):
    import pynvml

    FakeNvml([h100()]).install(monkeypatch)
    pynvml.nvmlInit()
    try:
        query = nvidia.NvmlQuery(pynvml)
        assert query("handle", "nvmlDeviceGetHandleByIndex", 7) is None
        assert query.unavailable["handle"].startswith("N/A: NVML error") and query.codes["handle"] == 2
        monkeypatch.setattr(pynvml, "nvmlDeviceGetBrokenThing", lambda: {}["missing"], raising=False)
        with pytest.raises(KeyError):  # our own bug: not swallowed as "N/A"
            query("broken", "nvmlDeviceGetBrokenThing")
        assert query("absent", "nvmlDeviceGetNoSuchFunction") is None
        assert query.unavailable["absent"] == "N/A: this nvidia-ml-py has no nvmlDeviceGetNoSuchFunction"
    finally:
        pynvml.nvmlShutdown()


def test_open_nvml_says_why_without_a_driver(monkeypatch):
    FakeNvml([h100()], init_error=12).install(monkeypatch)
    module, reason = nvidia.open_nvml()
    assert module is None and reason == "no NVIDIA driver found (NVML: NVML Shared Library Not Found)"


def test_the_sampler_reports_why_it_reads_no_gpu(monkeypatch):
    from tutor.hardware.sampler import NvmlReader

    fake = FakeNvml([h100()], init_error=12)
    fake.install(monkeypatch)
    reader = NvmlReader()
    try:
        assert reader() == () and reader.reason.startswith("no NVIDIA driver found")
    finally:
        reader.close()
    fake = FakeNvml([h100(), rtx_4090()])
    fake.install(monkeypatch)
    reader = NvmlReader()
    try:
        assert reader.reason is None and [s.memory_used_bytes for s in reader()] == [2 * GiB, GiB]
    finally:
        reader.close()
    assert fake.calls["init"] == fake.calls["shutdown"] == 1


def test_bench_memory_uses_the_same_session_and_reasons(monkeypatch):
    from tutor.bench import memory

    fake = FakeNvml([h100(), rtx_4090()])
    fake.install(monkeypatch)
    assert memory._nvml_memory(rtx_4090().uuid) == (GiB, rtx_4090().memory_total, "")
    used, total, note = memory._nvml_memory("GPU-00000000-0000-4000-8000-00000000dead")
    assert (used, total) == (None, None) and note.startswith("NVML memory N/A: NVML error")
    assert fake.calls["init"] == fake.calls["shutdown"] == 2  # every session closed, even the failed one
    FakeNvml([h100()], init_error=12).install(monkeypatch)
    assert memory._nvml_memory(h100().uuid)[2].startswith("no NVIDIA driver found")
