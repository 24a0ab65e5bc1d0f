"""Measurements of this machine with torch: one timing core, matmul, bandwidth, transfers,
collectives and memory accounting; suites with a time budget; the results notebook.

Modules import torch only inside the functions that measure, so importing `tutor.bench.*`
(for example to read the notebook in `bench history`) stays cheap.
"""
