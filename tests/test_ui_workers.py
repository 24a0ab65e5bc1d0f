"""Measurement threads give way to the interface thread; the app starts, follows and stops its
measurement process (tutor.worker); the test fakes satisfy the services' Protocols."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from tutor.ui.workers import MEASUREMENT_NICENESS, yield_cpu_to_the_interface


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are a Linux feature")
def test_a_measurement_thread_runs_at_a_lower_priority_than_the_interface() -> None:
    seen = {}

    def worker() -> None:
        yield_cpu_to_the_interface()
        seen["worker"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen["worker"] == MEASUREMENT_NICENESS
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) < MEASUREMENT_NICENESS


# ---- the app and its measurement process ---------------------------------------------------------

TESTS = Path(__file__).parent

from tests.subprocess_env import pythonpath


def test_the_fakes_satisfy_the_services_protocols():
    from tests.ui_fakes import FakeCurriculum, FakeProbe, FakeProgress, FakeSampler, fake_services

    from tutor.hardware.machine import Machine
    from tutor.files.settings import Settings
    from tutor.ui.services import CurriculumLike, ProbeLike, ProgressLike, SamplerLike

    services = fake_services()
    assert isinstance(FakeCurriculum(), CurriculumLike) and isinstance(FakeProgress(), ProgressLike)
    assert isinstance(FakeSampler(), SamplerLike) and isinstance(FakeProbe("x"), ProbeLike)
    assert isinstance(services.machine, Machine) and isinstance(services.settings, Settings)
    assert not isinstance(object(), SamplerLike)  # the Protocols check something


@pytest.mark.slow
def test_the_app_starts_its_worker_shows_a_crash_as_a_state_and_stops_it_on_exit():
    from tests.ui_fakes import fake_services, until
    from tests.worker_probes import PROBES

    from tutor.errors import UserError
    from tutor.ui.app import TutorApp
    from tutor.worker.client import WorkerClient
    from tutor.worker.proxies import worker_probes

    async def scenario() -> tuple[str, int | None]:
        worker = WorkerClient(probes_module="tests.worker_probes", warm=False, env={"PYTHONPATH": pythonpath(TESTS.parent)})
        services = fake_services(worker=worker, probes=worker_probes(worker, PROBES))
        app = TutorApp(services)
        async with app.run_test(size=(120, 40)) as pilot:
            # started after the first paint, without any job asking
            await until(pilot, lambda: app.worker_state.phase == "ready", "the worker to be ready")
            assert worker.pid is not None
            with pytest.raises(UserError) as failure:
                await asyncio.to_thread(services.probes["oom"].run, {}, lambda *a: None, threading.Event())
            await until(pilot, lambda: app.worker_state.phase == "failed", "the crash to reach the app")
            assert app.is_running
            assert any(failure.value.args[0] == note.message for note in app._notifications)
            result = await asyncio.to_thread(services.probes["quick"].run, {}, lambda *a: None, threading.Event())
            assert result.summary == "done"
            pid = worker.pid
        return worker.state.phase, pid

    phase, pid = asyncio.run(scenario())
    assert phase == "stopped"
    deadline = time.monotonic() + 30  # a limit for a hang only: the loop ends when the process is gone
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}")
