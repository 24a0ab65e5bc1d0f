"""Measurement threads give way to the interface thread."""

from __future__ import annotations

import os
import sys
import threading

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
