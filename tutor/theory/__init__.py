"""The numerical core: pure formulas, standard library only, each citing its source.

Everything tensor-tutor shows that is not measured on this machine is computed here, so the
lessons, the fit check and the benchmark's "theory" column can never disagree.
"""
