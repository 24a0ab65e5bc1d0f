"""fit against real transformers code, through the code of benchmarks/fit_vs_transformers.py.

Two architectures (a dense Llama, a Mixtral MoE) in two configurations (bf16 training with AdamW,
bf16 inference prefill) are built from configs with random weights and run on the CPU; every
category fit reports (parameters, weights, gradients, optimizer states, activations, KV cache, the
peak) must be within 10% of what the tensors really held. The tracker itself is checked first,
on a sequence of tensors whose live bytes are known.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "fit_vs_transformers.py"


def _benchmark():
    spec = importlib.util.spec_from_file_location("fit_vs_transformers", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


bench = _benchmark()


def test_tracker_counts_each_storage_once_from_creation_to_free() -> None:
    torch.set_num_threads(1)
    tracker = bench._make_tracker_class()()
    with tracker:
        tracker.enter_phase("forward")
        a = torch.ones(1000)             # 4,000 B
        b = a * 2                        # 4,000 B: 8,000 live
        del a                            # 4,000 live
        c = b.view(10, 100) + 1          # a view shares b's storage; the sum is new: 8,000 live
        d = b[:500].clone()              # 2,000 B: 10,000 live, the peak
        del b, c, d
        e = torch.zeros(100)             # 400 B after everything else was freed
    category_max, peak = bench.replay(tracker, lambda _key: "activations", {})
    assert peak.bytes == 10_000 and peak.phase == "forward" and peak.op == "clone.default"
    assert category_max == {"activations": 10_000}
    assert sum(delta for _key, delta, *_ in tracker.events) == e.untyped_storage().nbytes() == 400


@pytest.fixture(scope="module")
def results():
    import transformers

    transformers.logging.set_verbosity_error()
    return [bench.compare(arch, config) for arch in ("llama", "mixtral") for config in ("bf16", "inference")]


def test_fit_matches_transformers_within_ten_percent(results) -> None:
    off = [f"{row.arch}/{row.config} {row.category}: measured {row.measured:,}, fit {row.theory:,} "
           f"(x{row.ratio:.3f})" for result in results for row in result.rows if not row.within]
    assert not off, "\n".join(off)


def test_training_peak_is_a_moment_not_the_sum_of_categories(results) -> None:
    # The measured peak of a bf16 step comes in backward, below every category at its own maximum.
    for result in (r for r in results if r.config == "bf16"):
        measured = {row.category: row.measured for row in result.rows}
        assert result.measured_peak.phase == "backward"
        summed = sum(measured[c] for c in ("weights", "gradients", "optimizer", "activations"))
        assert measured["peak"] < summed
