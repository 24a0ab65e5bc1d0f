"""Lab budgets are for the lab's own work: the clock starts after torch is loaded, a cold
start with the default budget gives a full result, and a budget spent before anything was measured
is one clear error, never an empty result."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import pytest

from tutor.errors import UserError
from tutor.labs import run_probe


class _Clock:
    """perf_counter for a lab module that jumps 100 s per call: every budget is spent at once."""

    def __init__(self) -> None:
        self._ticks = itertools.count()

    def __call__(self) -> float:
        return next(self._ticks) * 100.0


@pytest.mark.parametrize(("lab", "module"), [("cast-error", "tutor.labs.precision"),
                                              ("quant-error", "tutor.labs.quantization"),
                                              ("fp8-scaling", "tutor.labs.fp8_scaling")])
def test_a_budget_spent_before_the_first_measurement_is_an_error(monkeypatch, lab: str, module: str) -> None:
    import importlib

    pytest.importorskip("torch")
    target = importlib.import_module(module)
    monkeypatch.setattr(target.time, "perf_counter", _Clock())
    with pytest.raises(UserError, match="ran out before the first"):
        run_probe(lab, {})


@pytest.mark.slow
@pytest.mark.parametrize("lab", ["cast-error", "quant-error"])
def test_a_cold_start_with_the_default_budget_measures(lab: str, tmp_path) -> None:
    """A fresh interpreter imports torch inside the lab, as `tensor-tutor lab NAME` does."""
    pytest.importorskip("torch")
    env = {**os.environ, "TENSOR_TUTOR_DATA_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "tutor", "lab", lab, "--json"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["rows"] and not result["cancelled"]


def test_non_finite_values_are_cast_not_crashed_on() -> None:
    pytest.importorskip("torch")
    result = run_probe("cast-error", {"values": ["nan", "inf", "-inf", "1.5"]})
    values = [row for row in result.rows if row.label.endswith(" in bf16")]
    assert [row.label.split(" -> ")[0] for row in values] == ["NaN", "inf", "-inf", "1.5"]
    assert result.metrics["agree_fraction"] == 1.0  # any NaN is a NaN, whatever its payload bits
