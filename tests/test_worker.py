"""The measurement process (tutor.worker): jobs, progress, cancel, kill, crash and restart, against
the tiny probes of tests/worker_probes.py (no torch: the worker starts with warm=False)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tutor.errors import UserError
from tutor.labs import ProbeResult
from tutor.worker.client import CANCELLED, WorkerClient, WorkerState
from tutor.worker.proxies import worker_probe, worker_probes

TESTS = Path(__file__).parent
ROOT = TESTS.parent


def pid_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def wait_until(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


@pytest.fixture
def client():

    worker = WorkerClient(probes_module="worker_probes", warm=False, env={"PYTHONPATH": str(TESTS)})
    states: list[WorkerState] = []
    worker.subscribe(states.append)
    worker.states = states  # type: ignore[attr-defined]
    yield worker
    worker.stop()


@pytest.fixture
def probes(client):
    from worker_probes import PROBES

    return worker_probes(client, PROBES)


sys.path.insert(0, str(TESTS))


def test_a_probe_runs_in_the_worker_and_its_progress_and_result_come_back(client, probes):
    seen = []
    result = probes["quick"].run({"value": 3.25}, lambda fraction, text: seen.append((fraction, text)),
                                 threading.Event())
    assert isinstance(result, ProbeResult)
    assert result.metrics["value"] == 3.25 and result.rows[0].measured == 3.25
    assert result.details["pid"] == client.pid != os.getpid()
    assert (0.5, "halfway") in seen
    phases = [state.phase for state in client.states]
    assert phases[:3] == ["not started", "starting", "ready"] and "busy" in phases
    assert client.state.phase == "ready"


def test_the_proxy_keeps_the_probes_description():
    from worker_probes import PROBES

    proxy = worker_probe(WorkerClient(), PROBES["quick"])
    assert (proxy.name, proxy.title, proxy.default_params) == ("quick", "test probe quick", {"value": 1.5})
    assert proxy.check_params({"value": 2}) == {"value": 2} and proxy.run is not PROBES["quick"].run


def test_a_cooperative_probe_stops_on_cancel_and_the_worker_lives_on(client, probes):
    cancel = threading.Event()

    def progress(fraction, text):
        if text == "step 3":
            cancel.set()

    pid = None
    result = probes["sleepy"].run({}, progress, cancel)
    pid = client.pid
    assert result.cancelled and result.metrics["steps"] >= 3
    assert probes["quick"].run({}, lambda *a: None, threading.Event()).details["pid"] == pid


def test_a_probe_that_ignores_cancel_is_killed_with_its_children_and_the_worker_restarts(client, probes):
    cancel = threading.Event()
    child = []

    def progress(fraction, text):
        if text.startswith("child "):
            child.append(int(text.split()[1]))
            cancel.set()

    first = client.pid
    result = probes["stubborn"].run({}, progress, cancel)
    assert result.cancelled and result.rows == ()
    assert child and wait_until(lambda: not pid_alive(child[0]), 5.0), "the probe's child outlived the cancel"
    assert "restarting" in [state.phase for state in client.states]
    again = probes["quick"].run({}, lambda *a: None, threading.Event())
    assert again.details["pid"] not in (first, None)


def test_a_worker_killed_by_sigkill_is_reported_as_out_of_memory_and_the_next_run_restarts_it(client, probes):
    with pytest.raises(UserError) as failure:
        probes["oom"].run({}, lambda *a: None, threading.Event())
    message = str(failure.value)
    assert message.startswith("the measurement process was killed (probably out of memory) while running oom")
    assert "SIGKILL" in message and "\n" not in message
    assert client.state.phase == "failed" and client.state.text == message
    assert probes["quick"].run({}, lambda *a: None, threading.Event()).metrics["value"] == 1.5


def test_a_probe_failure_is_one_line_and_the_worker_survives_it(client, probes):
    probes["quick"].run({}, lambda *a: None, threading.Event())
    pid = client.pid
    with pytest.raises(UserError, match=r"^RuntimeError: the probe broke$"):
        probes["broken"].run({}, lambda *a: None, threading.Event())
    with pytest.raises(UserError, match=r"^size=0: must be at least 1$"):
        probes["refuses"].run({}, lambda *a: None, threading.Event())
    with pytest.raises(UserError, match=r"^the result could not be sent back: "):
        probes["unpicklable"].run({}, lambda *a: None, threading.Event())
    assert client.pid == pid and client.state.phase == "ready"


def test_a_job_cancelled_while_the_worker_starts_returns_without_running(client):
    cancel = threading.Event()
    cancel.set()
    assert client.run_job("quick", {"kind": "probe", "name": "quick", "params": {}}, lambda *a: None,
                          cancel) is CANCELLED


def test_a_worker_that_cannot_start_is_a_failed_state_with_its_reason():
    broken = WorkerClient(probes_module="no_such_probe_module", warm=False)
    try:
        with pytest.raises(UserError, match="could not start.*no_such_probe_module"):
            broken.run_job("quick", {"kind": "probe", "name": "quick", "params": {}}, lambda *a: None,
                           threading.Event())
        assert broken.state.phase == "failed"
    finally:
        broken.stop()


def test_the_worker_and_its_children_die_with_the_app(tmp_path):
    """The app killed with SIGKILL (no clean-up runs): the parent-death signal ends the worker."""
    script = textwrap.dedent(f"""
        import sys, threading, time
        sys.path.insert(0, {str(TESTS)!r})
        from tutor.worker.client import WorkerClient
        from tutor.worker.proxies import worker_probes
        from worker_probes import PROBES
        client = WorkerClient(probes_module="worker_probes", warm=False, env={{"PYTHONPATH": {str(TESTS)!r}}})
        probes = worker_probes(client, PROBES)
        def progress(fraction, text):
            if text.startswith("child "):
                print(client.pid, text.split()[1], flush=True)
        threading.Thread(target=probes["stubborn"].run, args=({{}}, progress, threading.Event())).start()
        time.sleep(60)
    """)
    app = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        worker_pid, child_pid = map(int, app.stdout.readline().split())
        assert pid_alive(worker_pid) and pid_alive(child_pid)
        app.kill()
        app.wait()
        assert wait_until(lambda: not pid_alive(worker_pid) and not pid_alive(child_pid), 10.0)
    finally:
        app.kill()
        app.wait()


def test_stop_ends_the_worker_and_later_jobs_fail_clearly(client, probes):
    probes["quick"].run({}, lambda *a: None, threading.Event())
    pid = client.pid
    client.stop()
    assert wait_until(lambda: not pid_alive(pid), 5.0)
    assert client.state.phase == "stopped"
    with pytest.raises(UserError, match="stopped"):
        probes["quick"].run({}, lambda *a: None, threading.Event())


def test_the_worker_runs_niced_and_under_the_memory_limit_it_is_given():
    from worker_probes import PROBES

    from tutor.worker.__main__ import MEASUREMENT_NICENESS

    limited = WorkerClient(probes_module="worker_probes", warm=False,
                           env={"PYTHONPATH": str(TESTS), "TENSOR_TUTOR_WORKER_MEMORY_LIMIT": "3GiB"})
    try:
        result = worker_probe(limited, PROBES["limits"]).run({}, lambda *a: None, threading.Event())
    finally:
        limited.stop()
    assert result.metrics["address_space"] == 3 * 2**30
    assert result.metrics["nice"] >= MEASUREMENT_NICENESS


def test_the_app_side_of_the_worker_imports_neither_torch_nor_textual():
    code = ("import sys, tutor.worker.client, tutor.worker.proxies, tutor.worker.jobs, tutor.worker.protocol; "
            "print(sorted({'torch', 'textual', 'numpy'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "[]"
