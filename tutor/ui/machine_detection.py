"""This machine's detection (tutor.hardware.detect_machine), run once, off the path to the first paint.

Detecting reads lscpu, NVML and psutil (about 50-100 ms on the 2-core machine, plus ~40 ms of imports):
the home screen is painted first, showing "detecting…" where the device goes, and the app calls
`result()` in a thread worker afterwards (launch -> home as fast as a bare Textual
app). A screen that needs the machine before then (a lesson opened from the command line) calls
`result()`, which detects in the calling thread or waits for the thread already detecting.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tutor.hardware.machine import Machine


def detect_this_machine() -> Machine:
    """tutor.hardware.detect_machine, imported on the first call (looked up on tutor.hardware, where
    tests replace it)."""
    from tutor.hardware import detect_machine

    return detect_machine()


class MachineDetection:
    """One detection of the machine, done at most once, by whichever thread asks first."""

    def __init__(self, detect: Callable[[], Machine] = detect_this_machine) -> None:
        self._detect = detect
        self._machine: Machine | None = None
        self._lock = threading.Lock()

    @classmethod
    def known(cls, machine: Machine) -> MachineDetection:
        """A detection already done (tests, and hosts that detected the machine themselves)."""
        detection = cls(lambda: machine)
        detection._machine = machine
        return detection

    def ready(self) -> Machine | None:
        """The machine when detected, None while not yet (never waits)."""
        return self._machine

    def result(self) -> Machine:
        """The machine: detected now unless done (or waiting for the thread doing it)."""
        if self._machine is not None:
            return self._machine
        with self._lock:
            if self._machine is None:
                self._machine = self._detect()
            return self._machine
