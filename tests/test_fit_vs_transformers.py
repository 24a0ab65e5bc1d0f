"""fit against real transformers code: benchmarks/fit_vs_transformers.py, run as a user runs it.

The benchmark builds a dense Llama and a Mixtral MoE from small configs (random weights, CPU), runs
bf16 training with AdamW and a bf16 prefill, measures each with tutor.trace.memory_trace (the
tracker `fit --trace` uses) and sets it beside fit: every category fit reports (parameters, weights,
buffers, gradients, optimizer states, activations, KV cache, the peak) must be within 10% of what the tensors
really held. The script runs in a subprocess (`--json`), so its own code is what is checked; the
tracker itself is tested in tests/test_memory_trace.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch  # noqa: F401  (a hard dependency: missing is a failure, not a skip)

pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "fit_vs_transformers.py"
TRAIN_ROWS = ("parameters", "weights", "buffers", "gradients", "optimizer", "activations", "peak")
INFERENCE_ROWS = ("parameters", "weights", "buffers", "kv_cache", "activations", "peak")


@pytest.fixture(scope="module")
def report() -> dict:
    argv = [sys.executable, str(SCRIPT), "--arch", "llama", "--arch", "mixtral", "--config", "bf16",
            "--config", "inference", "--json"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.mark.slow
def test_every_category_is_compared(report) -> None:
    compared = {(row["arch"], row["config"], row["category"]) for row in report["rows"]}
    expected = {(arch, config, category) for arch in ("llama", "mixtral")
                for config, categories in (("bf16", TRAIN_ROWS), ("inference", INFERENCE_ROWS))
                for category in categories}
    assert compared == expected
    assert all(row["measured"] > 0 for row in report["rows"])


@pytest.mark.slow
def test_fit_matches_transformers_within_ten_percent(report) -> None:
    off = [f"{row['arch']}/{row['config']} {row['category']}: measured {row['measured']:,}, fit {row['theory']:,}"
           for row in report["rows"] if not row["within"]]
    assert not off, "\n".join(off)


@pytest.mark.slow
def test_training_peak_is_a_moment_not_the_sum_of_categories(report) -> None:
    # The measured peak of a bf16 step comes in backward, below every category at its own maximum.
    for run in (r for r in report["runs"] if r["config"] == "bf16"):
        measured = {row["category"]: row["measured"] for row in report["rows"]
                    if (row["arch"], row["config"]) == (run["arch"], run["config"])}
        assert run["measured_peak"]["phase"] == "backward"
        peak = run["measured_peak"]
        assert peak["bytes"] == measured["peak"] == sum(peak["per_category_bytes"].values())
        assert measured["peak"] < sum(measured[c] for c in ("weights", "gradients", "optimizer", "activations"))
