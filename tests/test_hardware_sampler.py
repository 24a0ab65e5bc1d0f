"""The live sampler with fake readers and a fake clock: ring buffer, history, failures become None."""

from __future__ import annotations

import itertools
import threading

import pytest

from tutor.errors import UserError
from tutor.hardware.sampler import GpuSample, HostSample, Sampler, clamp_interval, read_host


def fake_clock(start: float = 1000.0, step: float = 0.5):
    counter = itertools.count()
    return lambda: start + step * next(counter)


def host() -> HostSample:
    return HostSample(cpu_percent=(10.0, 20.0), ram_used_bytes=4 * 2**30, ram_total_bytes=16 * 2**30)


def gpus() -> tuple[GpuSample, ...]:
    return (GpuSample(0, 97.0, 2**30, 1755, 350.0, 45), GpuSample(1, 0.0, 0, 210, 30.0, 30))


@pytest.mark.parametrize(("asked", "used"), [(0.01, 0.25), (0.25, 0.25), (0.5, 0.5), (1.0, 1.0), (10, 1.0)])
def test_interval_is_clamped_to_1_to_4_hz(asked, used):
    assert clamp_interval(asked) == used
    assert Sampler(asked, host_reader=host, gpu_reader=gpus).interval_s == used


def test_bad_arguments():
    with pytest.raises(UserError):
        clamp_interval(float("nan"))
    with pytest.raises(UserError):
        Sampler(0.5, maxlen=0)


def test_samples_and_history_with_a_fake_clock():
    sampler = Sampler(0.5, host_reader=host, gpu_reader=gpus, clock=fake_clock())
    assert sampler.latest() is None
    for _ in range(3):
        sampler.sample_once()
    latest = sampler.latest()
    assert latest.timestamp == 1001.0 and latest.cpu_percent == (10.0, 20.0)
    assert sampler.history("ram_used_bytes") == [(1000.0, 4 * 2**30), (1000.5, 4 * 2**30), (1001.0, 4 * 2**30)]
    assert [v for _, v in sampler.history("power_w", gpu=1)] == [30.0] * 3
    assert [v for _, v in sampler.history("sm_clock_mhz", gpu=5)] == [None] * 3  # no such GPU


def test_ring_buffer_is_bounded():
    sampler = Sampler(0.5, maxlen=4, host_reader=host, gpu_reader=gpus, clock=fake_clock(0, 1))
    for _ in range(10):
        sampler.sample_once()
    assert [s.timestamp for s in sampler.samples()] == [6, 7, 8, 9]


def test_unknown_fields_are_user_errors():
    sampler = Sampler(0.5, host_reader=host, gpu_reader=gpus)
    with pytest.raises(UserError, match="gpu=index"):
        sampler.history("power_w")
    with pytest.raises(UserError):
        sampler.history("cpu_percent", gpu=0)


def test_failing_readers_become_none():
    def broken_host() -> HostSample:
        raise OSError("psutil exploded")

    def broken_gpus() -> tuple[GpuSample, ...]:
        raise RuntimeError("NVML exploded")

    sample = Sampler(0.5, host_reader=broken_host, gpu_reader=broken_gpus, clock=fake_clock()).sample_once()
    assert sample.cpu_percent is None and sample.ram_used_bytes is None and sample.gpus == ()


def test_thread_samples_and_stops():
    ticks = threading.Event()
    count = 0

    def counting_host() -> HostSample:
        nonlocal count
        count += 1
        if count >= 2:
            ticks.set()
        return host()

    sampler = Sampler(0.25, host_reader=counting_host, gpu_reader=gpus)
    with sampler:
        assert sampler.running
        assert ticks.wait(timeout=10), "the sampler thread produced fewer than 2 samples"
    assert not sampler.running
    taken = len(sampler.samples())
    assert taken >= 2
    sampler.stop()  # a second stop is harmless
    assert len(sampler.samples()) == taken


def test_thread_survives_a_reader_that_always_fails():
    seen = threading.Event()

    def broken_host() -> HostSample:
        seen.set()
        raise ValueError("nope")

    sampler = Sampler(0.25, host_reader=broken_host, gpu_reader=gpus)
    sampler.start()
    assert seen.wait(timeout=10)
    sampler.stop()
    assert sampler.latest() is not None and sampler.latest().cpu_percent is None


def test_real_host_reader():
    sample = read_host()
    assert sample.ram_total_bytes and sample.ram_used_bytes is not None
    assert sample.cpu_percent is not None and all(0 <= p <= 100 for p in sample.cpu_percent)
