"""Labs: the small real experiments that lessons run in `measure` and `predict` blocks.

A lab takes a params dict, a progress callback and a cancel Event, and returns a ProbeResult:
rows of measured-against-theory figures plus a flat `metrics` dict that `predict` blocks name.
Every theory figure comes from `tutor.theory`; every measured figure from this machine.

Importing this package imports no lab module and never torch: the types are in tutor.labs.probe,
the list of labs is data in tutor.labs.registry, and a lab's module is imported when the lab is
looked up to run (`PROBES[name]`, `get_probe`, `run_probe`).
"""

from __future__ import annotations

from tutor.labs.probe import Measurement, Param, Probe, ProbeResult, ProgressFn
from tutor.labs.registry import LABS, LabEntry, LoadedLabs, lab_entry, load_lab, run_lab

PROBES: LoadedLabs = LoadedLabs()
"""Every lab by name; looking one up imports its module (listing the names imports none)."""

get_probe = load_lab
run_probe = run_lab

__all__ = ["LABS", "PROBES", "LabEntry", "Measurement", "Param", "Probe", "ProbeResult", "ProgressFn", "get_probe",
           "lab_entry", "load_lab", "run_lab", "run_probe"]
