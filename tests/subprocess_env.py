"""The PYTHONPATH a test gives a Python subprocess: its own folders first, then the one the suite
runs with. Replacing it instead drops whatever the suite found there: on the GPU image the packages
torch's environment lacks (textual among them) come from a wheelhouse on PYTHONPATH, and a child
started with PYTHONPATH=<repo> alone could not import the app."""

from __future__ import annotations

import os


def pythonpath(*first: object) -> str:
    """`first` (paths), then the current PYTHONPATH, joined with os.pathsep."""
    return os.pathsep.join([*(str(path) for path in first), *filter(None, [os.environ.get("PYTHONPATH")])])
