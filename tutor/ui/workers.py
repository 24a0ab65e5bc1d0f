"""What the app's measurement threads do so that the interface stays responsive.

With the real services the measuring happens in the measurement process (tutor.worker, itself
niced), and these threads only wait for its answer; with in-process services (tests, fakes) they
measure here, and the lower priority keeps the interface thread first in line either way.
"""

from __future__ import annotations

import os
import threading

MEASUREMENT_NICENESS = 10


def yield_cpu_to_the_interface(niceness: int = MEASUREMENT_NICENESS) -> None:
    """Lower the calling worker thread's scheduling priority.

    A measurement fills every core (torch and BLAS use all of them), so a key press would wait for
    a time slice. On Linux the nice value is per thread and inherited by the threads it starts, such
    as the OpenMP/BLAS pool that torch creates on its first large operation in this thread; the UI
    thread then gets a core as soon as it needs one, and the measurement loses nothing while the UI
    is idle. Elsewhere (or where the call is refused) nothing changes.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)
    except (AttributeError, OSError):
        pass
