"""The PYTHONPATH a test gives a Python subprocess: its own folders first, then the one the suite
runs with. Replacing it instead drops whatever the suite found there: on the GPU image the packages
torch's environment lacks (textual among them) come from a wheelhouse on PYTHONPATH, and a child
started with PYTHONPATH=<repo> alone could not import the app."""

from __future__ import annotations

import os


def pythonpath(*first: object) -> str:
    """`first` (paths), then the current PYTHONPATH, joined with os.pathsep."""
    return os.pathsep.join([*(str(path) for path in first), *filter(None, [os.environ.get("PYTHONPATH")])])


def default_signals() -> None:
    """Popen's preexec_fn for a child that is sent a signal: SIGINT, SIGTERM and SIGHUP at their default
    dispositions. A suite run under `nohup` or as a background job (`&`) starts with SIGHUP or SIGINT ignored, and a
    child inherits that: tensor-tutor rightly keeps an ignored signal ignored, so the signal sent would be lost."""
    import signal

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
