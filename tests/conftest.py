"""Shared test configuration: GPU-marked tests are skipped where no CUDA device exists, and no test
sees what another left behind (a data folder of its own, torch's thread count put back), so the
suite passes in any order (pytest-randomly) and split over processes (pytest-xdist)."""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time

import pytest

# Tests never write into the user's real data dir (results notebook, progress, settings). This
# folder is only for code that runs before any test (collection); each xdist worker has its own.
os.environ.setdefault("TENSOR_TUTOR_DATA_DIR", os.path.join(
    os.path.dirname(__file__), ".tmp-data", os.environ.get("PYTEST_XDIST_WORKER", "main")))


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


@pytest.fixture(autouse=True)
def own_data_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh, empty data folder for every test: a bench result, a progress file or a setting one
    test saved (and that labs read back, such as a measured rate) never reaches another. Tests that
    need a particular folder set TENSOR_TUTOR_DATA_DIR themselves."""
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path_factory.mktemp("data")))
    # `time` measures a family's host code on first use (seconds of torch and transformers): only the tests that
    # are about that measurement switch it on.
    monkeypatch.setenv("TENSOR_TUTOR_MEASURE_HOST", "0")
    # The app turns a failing handler into a notice (tutor.ui.guard); a test sees the failure itself, as
    # Textual raises it, unless it is about that guard (it sets app.recover_failures).
    monkeypatch.setenv("TENSOR_TUTOR_UI_STRICT", "1")


@pytest.fixture
def measure_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """For a test of CPU physics (one core's share of the peak, the last-level cache, psutil's memory,
    a recorded CPU-only machine): a bench or lab left to choose its device (no --device, device=auto)
    measures on the CPU, as on a machine without CUDA. On a CUDA machine that default is cuda:0
    (tutor.bench.environment.resolve_device), where those figures do not hold."""
    monkeypatch.setattr("tutor.bench.environment.cuda_device_count", lambda: 0)


def _torch_default_threads() -> int:
    """The intra-op thread count torch starts with: OMP_NUM_THREADS, else one per physical core."""
    import psutil

    return int(os.environ.get("OMP_NUM_THREADS") or psutil.cpu_count(logical=False) or os.cpu_count() or 1)


@pytest.fixture(autouse=True)
def torch_threads_put_back():
    """torch.set_num_threads is process-wide: a test (or a lab it runs) that measures on one thread
    would otherwise slow, or change the result of, every torch test after it in this process."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    yield
    torch = sys.modules.get("torch")
    if torch is not None:
        wanted = before if before is not None else _torch_default_threads()
        if torch.get_num_threads() != wanted:
            torch.set_num_threads(wanted)


SLEEP_LIMIT_S = 0.25
"""The longest time.sleep test code may ask for: a test waits for the event it checks (a message, a
result, a process gone), never for a time that a busy machine can outlast."""
TESTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "")


@pytest.fixture(autouse=True)
def no_long_sleeps(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """Fail a test whose own code (a file under tests/) calls time.sleep for over SLEEP_LIMIT_S.
    Product code may sleep; so may a test marked `sleeps` (one that measures over a window)."""
    if request.node.get_closest_marker("sleeps"):
        yield
        return
    real_sleep = time.sleep
    long_sleeps: list[str] = []

    def guarded_sleep(seconds: float) -> None:
        caller = sys._getframe(1)
        if seconds > SLEEP_LIMIT_S and caller.f_code.co_filename.startswith(TESTS_DIR):
            where = f"time.sleep({seconds:g}) at {os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}"
            if threading.current_thread() is not threading.main_thread():
                long_sleeps.append(where)  # a thread may catch the error: the test fails at teardown
            raise AssertionError(f"{where}: wait for the event instead (tests/ui_fakes.until), "
                                 "or mark the test `sleeps` if it measures over a window")
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", guarded_sleep)
    yield
    if long_sleeps:
        pytest.fail("; ".join(long_sleeps))
