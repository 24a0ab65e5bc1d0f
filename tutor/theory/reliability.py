"""How often to checkpoint a run that fails: Young's and Daly's optimum intervals, and the work lost.

Pure stdlib. Times in seconds. `write_s` (delta) is the time one checkpoint takes to write,
`mtbf_s` (M) the mean time between failures of the whole job, `restart_s` (R) the time to restart.
"""

from __future__ import annotations

import math
from numbers import Real

from tutor.errors import UserError


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not (isinstance(value, Real) and math.isfinite(value) and value > 0):
        raise UserError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


def job_mtbf_s(device_mtbf_s: float, devices: int) -> float:
    """MTBF of a job that stops when any one of `devices` independent devices fails, each with
    exponential failures of mean device_mtbf_s: the minimum of exponentials, M = M_device / n
    (Daly 2006, §2: the system failure rate is the sum of the component rates)."""
    if not isinstance(devices, int) or devices < 1:
        raise UserError(f"devices must be a whole number >= 1, got {devices!r}")
    return _positive("device MTBF", device_mtbf_s) / devices


def young_interval_s(write_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum compute time between checkpoints: tau = sqrt(2 delta M)
    (J. W. Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9), 1974)."""
    return math.sqrt(2 * _positive("write time", write_s) * _positive("MTBF", mtbf_s))


def daly_interval_s(write_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum: tau = sqrt(2 delta M) [1 + (1/3) sqrt(delta / 2M) + delta / (18 M)] - delta
    for delta < 2M, else M (J. T. Daly, "A higher order estimate of the optimum checkpoint interval
    for restart dumps", Future Generation Computer Systems 22(3), 2006, eq. 37)."""
    delta, m = _positive("write time", write_s), _positive("MTBF", mtbf_s)
    if delta >= 2 * m:
        return m
    return math.sqrt(2 * delta * m) * (1 + math.sqrt(delta / (2 * m)) / 3 + delta / (18 * m)) - delta


def expected_wall_time_s(work_s: float, interval_s: float, write_s: float, mtbf_s: float,
                         restart_s: float = 0.0) -> float:
    """Expected wall time to finish `work_s` of computation, checkpointing every `interval_s` of
    compute, with exponential failures: T = M e^(R/M) (e^((tau + delta)/M) - 1) work / tau
    (Daly 2006, eq. 13; each segment of tau + delta restarts from its checkpoint on a failure)."""
    tau, delta, m = _positive("interval", interval_s), _positive("write time", write_s), _positive("MTBF", mtbf_s)
    work = _positive("work", work_s)
    return m * math.exp(restart_s / m) * math.expm1((tau + delta) / m) * work / tau


def waste_fraction(interval_s: float, write_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """Share of the wall time not spent on useful work: 1 - work / expected wall time (Daly 2006, eq. 13)."""
    return 1 - 1 / (expected_wall_time_s(1.0, interval_s, write_s, mtbf_s, restart_s))


def first_order_waste_fraction(interval_s: float, write_s: float, mtbf_s: float) -> float:
    """Young's first-order waste: delta / tau for writing plus tau / (2M) of work redone per failure
    (Young 1974); minimal, sqrt(2 delta / M), at tau = sqrt(2 delta M)."""
    tau, delta, m = _positive("interval", interval_s), _positive("write time", write_s), _positive("MTBF", mtbf_s)
    return delta / tau + tau / (2 * m)


def segment_wall_time_moments(segment_s: float, mtbf_s: float, restart_s: float = 0.0) -> tuple[float, float]:
    """Mean and variance of the wall time to get one segment of `segment_s` (compute and its checkpoint write)
    through exponential failures of mean M, each failed attempt costing the time until the failure plus
    `restart_s`. With p = e^(-s/M) the chance an attempt survives, the failed attempts K are geometric
    (E[K] = (1-p)/p, Var[K] = (1-p)/p^2) and each costs Y = X + R with X exponential truncated to [0, s)
    (E[X] = M - s p/(1-p), Var[X] = M^2 - s^2 p/(1-p)^2); W = s + sum of K costs Y, so
    E[W] = s + E[K] E[Y] = (e^(s/M) - 1)(M + R) (Daly 2006, eq. 13 per segment, restarts not failing) and
    Var[W] = E[K] Var[Y] + Var[K] E[Y]^2 (the variance of a random sum, Wald)."""
    s, m = _positive("segment", segment_s), _positive("MTBF", mtbf_s)
    if isinstance(restart_s, bool) or not (isinstance(restart_s, Real) and math.isfinite(restart_s) and restart_s >= 0):
        raise UserError(f"restart time must be zero or a positive number of seconds, got {restart_s!r}")
    survive = math.exp(-s / m)
    fail = -math.expm1(-s / m)
    failures_mean, failures_var = fail / survive, fail / survive ** 2
    cost_mean = m - s * survive / fail + restart_s
    cost_var = m * m - s * s * survive / fail ** 2
    return s + failures_mean * cost_mean, failures_mean * cost_var + failures_var * cost_mean ** 2
