"""How busy the machine was: other processes' CPU share, against a real CPU hog started outside this
process tree (it must count as "other") and inside it (it must not), plus the arithmetic on fixed snapshots."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tutor.bench.busy import BUSY_SHARE, BusyMeter, BusyShare, CpuSnapshot, busy_share_between

# Spins for at most 60 s, so a hog whose test died before killing it still ends on its own.
HOG = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass"
WINDOW_S = 1.5


def test_other_share_is_the_machine_minus_this_tree_over_the_usable_cores() -> None:
    first = CpuSnapshot(wall_s=10.0, machine_busy_s=100.0, own_s=5.0)
    last = CpuSnapshot(wall_s=12.0, machine_busy_s=103.4, own_s=5.6)
    share = busy_share_between(first, last, cores=2)
    assert share.window_s == pytest.approx(2.0)
    assert share.own_cpu_s == pytest.approx(0.6) and share.other_cpu_s == pytest.approx(2.8)
    assert share.other_share == pytest.approx(0.7) and share.own_share == pytest.approx(0.15)
    assert share.busy and share.describe() == "machine busy: other processes used 70% of 2 cores during the measurement"
    data = share.to_json()
    assert data["other_share"] == pytest.approx(0.7) and data["busy"] is True and data["cores"] == 2


def test_a_quiet_window_is_not_called_busy() -> None:
    quiet = BusyShare(window_s=3.0, cores=4, other_cpu_s=0.12, own_cpu_s=11.0)
    assert quiet.other_share == pytest.approx(0.01) and quiet.other_share < BUSY_SHARE
    assert not quiet.busy
    assert quiet.describe() == "other processes used only 1% of 4 cores during the measurement"


def test_clock_ticks_never_give_a_negative_or_above_full_share() -> None:
    # /proc/stat and per-process times tick separately: this tree can read more than the machine.
    first = CpuSnapshot(wall_s=0.0, machine_busy_s=50.0, own_s=1.0)
    share = busy_share_between(first, CpuSnapshot(wall_s=0.1, machine_busy_s=50.1, own_s=1.2), cores=1)
    assert share.other_cpu_s == 0.0 and share.other_share == 0.0 and share.own_share == 1.0


def _hog_outside_this_tree() -> psutil.Process:
    """A spinning process whose parent exits at once: it is reparented, so it is not our descendant."""
    launcher = subprocess.run(
        [sys.executable, "-c", "import subprocess, sys; "
         f"print(subprocess.Popen([sys.executable, '-c', {HOG!r}], start_new_session=True, "
         "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)"],
        capture_output=True, text=True, check=True, timeout=30)
    return psutil.Process(int(launcher.stdout.strip()))


def _hog_cpu_s(hog: psutil.Process) -> float:
    times = hog.cpu_times()
    return times.user + times.system


def _measure_with(hog: psutil.Process) -> tuple[BusyShare, float]:
    """The meter's reading over WINDOW_S while `hog` spins, and the CPU seconds the hog itself took."""
    time.sleep(0.2)  # past the hog's interpreter start-up
    before = _hog_cpu_s(hog)
    meter = BusyMeter.start()
    time.sleep(WINDOW_S)
    share = meter.stop()
    return share, _hog_cpu_s(hog) - before


@pytest.mark.sleeps
def test_a_cpu_hog_elsewhere_on_the_machine_is_reported_as_other_processes() -> None:
    hog = _hog_outside_this_tree()
    try:
        assert hog not in psutil.Process().children(recursive=True)
        share, hog_s = _measure_with(hog)
    finally:
        os.kill(hog.pid, signal.SIGKILL)
    assert hog_s > 0.1, "the hog never got a core"
    # Everything the hog burnt (less /proc/stat's 10 ms ticks) is in the other processes' share.
    assert share.other_cpu_s >= 0.85 * hog_s - 0.05
    assert share.other_share >= 0.85 * hog_s / (WINDOW_S * share.cores) - 0.05
    assert share.own_cpu_s < 0.5 * hog_s


@pytest.mark.sleeps
def test_a_cpu_hog_inside_this_process_tree_is_not_another_process() -> None:
    hog_process = subprocess.Popen([sys.executable, "-c", HOG])
    try:
        share, hog_s = _measure_with(psutil.Process(hog_process.pid))
    finally:
        hog_process.kill()
        hog_process.wait()
    assert hog_s > 0.1, "the hog never got a core"
    assert share.own_cpu_s >= 0.85 * hog_s - 0.05
    assert share.own_share >= 0.85 * hog_s / (WINDOW_S * share.cores) - 0.05


# ---- the app's interface, counted apart --------------------------------------------------

def test_the_app_interface_is_counted_apart_from_other_processes() -> None:
    first = CpuSnapshot(wall_s=0.0, machine_busy_s=100.0, own_s=5.0, interface_s=20.0)
    last = CpuSnapshot(wall_s=2.0, machine_busy_s=103.0, own_s=7.0, interface_s=20.48)
    share = busy_share_between(first, last, cores=2)
    assert share.interface_cpu_s == pytest.approx(0.48) and share.interface_share == pytest.approx(0.12)
    assert share.other_cpu_s == pytest.approx(0.52) and share.other_share == pytest.approx(0.13)
    assert not share.busy  # 25% with the interface; 13% without it
    assert share.describe() == ("other processes used only 13% of 2 cores during the measurement; "
                                "this app's interface used 12%")
    assert share.to_json()["interface_share"] == pytest.approx(0.12)
    cli = busy_share_between(CpuSnapshot(0.0, 100.0, 5.0), CpuSnapshot(2.0, 103.0, 7.0), cores=2)
    assert cli.interface_share is None and "interface" not in cli.describe()


@pytest.mark.sleeps
def test_a_hog_named_as_the_interface_is_not_other_processes(monkeypatch) -> None:
    from tutor.bench.busy import INTERFACE_PID_ENV, interface_process

    hog = _hog_outside_this_tree()
    try:
        monkeypatch.setenv(INTERFACE_PID_ENV, str(hog.pid))
        assert interface_process().pid == hog.pid
        share, hog_s = _measure_with(hog)
    finally:
        os.kill(hog.pid, signal.SIGKILL)
    assert hog_s > 0.1, "the hog never got a core"
    assert share.interface_cpu_s >= 0.85 * hog_s - 0.05
    monkeypatch.setenv(INTERFACE_PID_ENV, str(os.getpid()))
    assert interface_process() is None  # a process is never its own interface


def test_an_exact_zero_of_other_work_reads_zero_not_a_float_remainder():
    # Tick counts summed in floats: 0.3 + 0.1 - 0.4 is 5.6e-17, once shown as "1.7 × 10⁻¹²%".
    share = busy_share_between(CpuSnapshot(0.0, 10.0, 1.0, 0.0), CpuSnapshot(1.0, 10.4, 1.3, 0.1), cores=2)
    assert share.other_cpu_s == 0.0
    assert "used only 0% of 2 cores" in share.describe()
