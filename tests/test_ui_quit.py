"""Quitting the app while it measures: Ctrl+Q kills the measurement process and every
process it started before the app closes its screens, and `learn` then ends the process without
the interpreter's teardown (which left a blank pane for about a second)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
ROOT = TESTS.parent

from tests.test_worker import pid_alive, wait_until
from tests.ui_fakes import fake_services, sync, until
from tests.subprocess_env import pythonpath

from tutor.ui.app import TutorApp
from tutor.worker.client import WorkerClient
from tutor.worker.proxies import worker_probes


@pytest.mark.slow
@sync
async def test_ctrl_q_during_a_run_kills_the_measurement_process_before_the_app_closes():
    from tests.worker_probes import PROBES

    client = WorkerClient(probes_module="tests.worker_probes", warm=False, env={"PYTHONPATH": pythonpath(TESTS.parent)})
    probes = worker_probes(client, PROBES)
    app = TutorApp(dataclasses.replace(fake_services(), worker=client))
    seen_at_exit: list[tuple[str, int | None]] = []
    original_exit = app.exit

    def exit(*args, **kwargs):  # what the app has done by the time it starts closing its screens
        seen_at_exit.append((client.state.phase, client.pid))
        original_exit(*args, **kwargs)

    app.exit = exit  # type: ignore[method-assign]
    child: list[int] = []
    results: list[object] = []

    def progress(fraction: float, text: str) -> None:
        if text.startswith("child "):
            child.append(int(text.split()[1]))

    try:
        async with app.run_test(size=(120, 40)) as pilot:
            # The stubborn probe starts a child process (as multi-rank labs do) and ignores cancel.
            runner = threading.Thread(target=lambda: results.append(probes["stubborn"].run({}, progress, threading.Event())),
                                      daemon=True)
            runner.start()
            await until(pilot, lambda: child, "the stubborn probe to start its child", limit_s=120)
            worker_pid = client.pid
            assert worker_pid is not None and pid_alive(worker_pid) and pid_alive(child[0])
            await pilot.press("ctrl+q")
        assert seen_at_exit == [("stopped", None)], "the measurement process was still running when the app began to close"
        assert not pid_alive(worker_pid)
        assert wait_until(lambda: not pid_alive(child[0])), "a process the lab started outlived the app"
        runner.join(timeout=60)
        assert not runner.is_alive() and len(results) == 1 and results[0].cancelled  # type: ignore[attr-defined]
    finally:
        client.stop()


EXIT_SCRIPT = textwrap.dedent("""
    import atexit, sys
    from tutor import cli
    from tutor.commands import app_start
    from tutor.ui.app import TutorApp

    class Teardown:
        def __del__(self):
            print("interpreter teardown ran", flush=True)

    KEEP = Teardown()  # collected only by the interpreter's teardown
    atexit.register(lambda: print("atexit ran", flush=True))
    app_start._require_terminal = lambda: None

    def run(self):
        self.shut_down = True  # what on_unmount sets once the app ran and closed
        self.exit(return_code=3)
        sys.stdout.write("app done ")  # buffered: exit_without_teardown must flush it

    TutorApp.run = run
    cli.main(["learn", "training-loop/parameters"])
    print("learn returned")
""")


def test_learn_ends_the_process_after_the_app_without_the_interpreter_teardown(tmp_path):
    done = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**__import__("os").environ, "TENSOR_TUTOR_DATA_DIR": str(tmp_path),
                               "PYTHONPATH": pythonpath(ROOT)})
    assert done.returncode == 3, done.stderr[-2000:]
    assert done.stdout.startswith("app done ") and "atexit ran" in done.stdout
    assert "learn returned" not in done.stdout and "interpreter teardown ran" not in done.stdout
