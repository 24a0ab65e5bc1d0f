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


def wait_until(predicate, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


@pytest.fixture
def client():

    worker = WorkerClient(probes_module="tests.worker_probes", warm=False, env={"PYTHONPATH": pythonpath(TESTS.parent)})
    states: list[WorkerState] = []
    worker.subscribe(states.append)
    worker.states = states  # type: ignore[attr-defined]
    yield worker
    worker.stop()


@pytest.fixture
def probes(client):
    from tests.worker_probes import PROBES

    return worker_probes(client, PROBES)



from tests.subprocess_env import pythonpath


@pytest.mark.slow
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
    from tests.worker_probes import PROBES

    proxy = worker_probe(WorkerClient(), PROBES["quick"])
    assert (proxy.name, proxy.title, proxy.default_params) == ("quick", "test probe quick", {"value": 1.5})
    assert proxy.check_params({"value": 2}) == {"value": 2} and proxy.run is not PROBES["quick"].run


@pytest.mark.slow
def test_a_cooperative_probe_stops_on_cancel_and_the_worker_lives_on(client, probes):
    cancel = threading.Event()

    def progress(fraction, text):
        if text.startswith("step"):  # reports are throttled: any step may be the first to arrive
            cancel.set()

    pid = None
    result = probes["sleepy"].run({}, progress, cancel)
    pid = client.pid
    assert result.cancelled and result.metrics["steps"] >= 1
    assert probes["quick"].run({}, lambda *a: None, threading.Event()).details["pid"] == pid


@pytest.mark.slow
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
    assert child and wait_until(lambda: not pid_alive(child[0])), "the probe's child outlived the cancel"
    assert "restarting" in [state.phase for state in client.states]
    again = probes["quick"].run({}, lambda *a: None, threading.Event())
    assert again.details["pid"] not in (first, None)


@pytest.mark.slow
def test_a_worker_killed_by_sigkill_is_reported_as_out_of_memory_and_the_next_run_restarts_it(client, probes):
    with pytest.raises(UserError) as failure:
        probes["oom"].run({}, lambda *a: None, threading.Event())
    message = str(failure.value)
    assert message.startswith("the measurement process was killed (probably out of memory) while running oom")
    assert "SIGKILL" in message and "\n" not in message
    assert client.state.phase == "failed" and client.state.text == message
    assert probes["quick"].run({}, lambda *a: None, threading.Event()).metrics["value"] == 1.5


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_job_cancelled_while_the_worker_starts_returns_without_running(client):
    cancel = threading.Event()
    cancel.set()
    assert client.run_job("quick", {"kind": "probe", "name": "quick", "params": {}}, lambda *a: None,
                          cancel) is CANCELLED


@pytest.mark.slow
def test_a_worker_that_cannot_start_is_a_failed_state_with_its_reason():
    broken = WorkerClient(probes_module="no_such_probe_module", warm=False)
    try:
        with pytest.raises(UserError, match="could not start.*no_such_probe_module"):
            broken.run_job("quick", {"kind": "probe", "name": "quick", "params": {}}, lambda *a: None,
                           threading.Event())
        assert broken.state.phase == "failed"
    finally:
        broken.stop()


@pytest.mark.slow
def test_the_worker_and_its_children_die_with_the_app(tmp_path):
    """The app killed with SIGKILL (no clean-up runs): the parent-death signal ends the worker."""
    script = textwrap.dedent(f"""
        import sys, threading, time
        from tutor.worker.client import WorkerClient
        from tutor.worker.proxies import worker_probes
        from tests.worker_probes import PROBES
        client = WorkerClient(probes_module="tests.worker_probes", warm=False, env={{"PYTHONPATH": {pythonpath(TESTS.parent)!r}}})
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
        assert wait_until(lambda: not pid_alive(worker_pid) and not pid_alive(child_pid))
    finally:
        app.kill()
        app.wait()


@pytest.mark.slow
def test_stop_ends_the_worker_and_later_jobs_fail_clearly(client, probes):
    probes["quick"].run({}, lambda *a: None, threading.Event())
    pid = client.pid
    client.stop()
    assert wait_until(lambda: not pid_alive(pid))
    assert client.state.phase == "stopped"
    with pytest.raises(UserError, match="stopped"):
        probes["quick"].run({}, lambda *a: None, threading.Event())


@pytest.mark.slow
def test_the_worker_runs_niced_and_under_the_memory_limit_it_is_given():
    from tests.worker_probes import PROBES

    from tutor.worker.__main__ import MEASUREMENT_NICENESS

    limited = WorkerClient(probes_module="tests.worker_probes", warm=False,
                           env={"PYTHONPATH": pythonpath(TESTS.parent), "TENSOR_TUTOR_WORKER_MEMORY_LIMIT": "3GiB"})
    try:
        result = worker_probe(limited, PROBES["limits"]).run({}, lambda *a: None, threading.Event())
    finally:
        limited.stop()
    assert result.metrics["address_space"] == 3 * 2**30
    assert result.metrics["nice"] >= MEASUREMENT_NICENESS


@pytest.mark.slow
def test_every_job_runs_in_the_thread_that_warmed_the_worker_not_in_one_of_its_own():
    # torch's OpenMP pool belongs to the thread that calls it: a job in a fresh thread met a cold
    # pool beside the warm one, and fp32 matmuls at one core's rate (the low first numbers).
    from tests.worker_probes import PROBES

    warm = WorkerClient(probes_module="tests.worker_probes", warm=True, env={"PYTHONPATH": pythonpath(TESTS.parent)})
    try:
        where = worker_probe(warm, PROBES["where"])
        first, second = (where.run({}, lambda *a: None, threading.Event()).metrics for _ in range(2))
    finally:
        warm.stop()
    assert first["warmed_in"] != -1, "the worker did not warm up"
    assert first["thread"] == second["thread"] == first["warmed_in"]
    assert first["thread"] != first["pid"], "jobs must not run in the thread that reads cancel commands"


@pytest.mark.slow
def test_the_app_side_of_the_worker_imports_neither_torch_nor_textual():
    code = ("import sys, tutor.worker.client, tutor.worker.proxies, tutor.worker.jobs, tutor.worker.protocol; "
            "print(sorted({'torch', 'textual', 'numpy'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "[]"


# ---- progress throttle, and the app's interface in busy readings --------------------------

@pytest.mark.slow
def test_progress_is_throttled_to_ten_a_second_and_the_last_held_report_still_arrives(client, probes):
    seen: list[tuple[float, float, str]] = []
    result = probes["chatty"].run({"seconds": 0.6}, lambda fraction, text: seen.append((time.monotonic(), fraction, text)),
                                  threading.Event())
    assert result.metrics["reports"] > 1000, "the probe did not flood"
    worker_reports = [entry for entry in seen if entry[2].startswith("report") or entry[2] == "the last step"]
    # Over 1,000 reports in 0.6 s of the worker's clock, at most ten a second of them sent. (How far
    # apart they arrive here is the machine's scheduling: the throttle's spacing is checked on a fake
    # clock below.)
    assert 3 <= len(worker_reports) <= 0.6 * 10 + 3, len(worker_reports)
    assert worker_reports[-1][2] == "the last step"  # held, then sent by the timer: never a stale step


def test_the_throttle_holds_reports_sends_done_at_once_and_nothing_after_close():
    from tutor.worker.__main__ import ProgressThrottle

    now = [100.0]
    sent: list[tuple[float, str]] = []
    throttle = ProgressThrottle(lambda fraction, text: sent.append((fraction, text)), 0.1, clock=lambda: now[0])
    throttle(0.1, "a")
    throttle(0.2, "b")
    throttle(0.3, "c")
    assert sent == [(0.1, "a")]
    now[0] += 0.05
    throttle(1.0, "done")  # the end is never held back
    assert sent == [(0.1, "a"), (1.0, "done")]
    now[0] += 0.01
    throttle(0.5, "held")
    throttle.close()
    time.sleep(0.15)  # the timer would have fired by now
    assert sent == [(0.1, "a"), (1.0, "done")]
    live = ProgressThrottle(lambda fraction, text: sent.append((fraction, text)), 0.05)
    live(0.1, "x")
    live(0.2, "y")
    assert wait_until(lambda: sent[-1] == (0.2, "y"))


@pytest.mark.slow
def test_busy_readings_in_the_worker_count_the_app_interface_apart(client, probes):
    """The test process plays the app: it is the worker's parent, and it burns a core meanwhile."""
    import psutil

    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    me = psutil.Process()
    before = sum(me.cpu_times()[:2])
    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        result = probes["busy"].run({"seconds": 1.0}, lambda fraction, text: None, threading.Event())
    finally:
        stop.set()
        spinner.join()
    burnt = sum(me.cpu_times()[:2]) - before
    busy = result.details["busy"]
    assert result.details["interface_pid"] == str(os.getpid())
    assert busy["interface_cpu_s"] is not None and busy["interface_cpu_s"] >= 0.5 * min(burnt, 1.0) - 0.05
    assert busy["interface_cpu_s"] <= burnt + 0.05
    assert "this app's interface used" in result.summary
