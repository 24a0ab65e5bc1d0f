"""`tensor-tutor fit <config.json>` answers every decoder-only causal LM of the installed transformers.

Every model type of transformers' causal-LM mapping gets a small config made from its configuration
class's own defaults (benchmarks/fit_every_causal_lm.py: two repeats of its pattern of layer kinds, a
256-token vocabulary, at most 8 experts) and is asked of the command line as a user asks it. Types
without a hand profile are calibrated by traces on fake tensors (tutor.trace.arch_calibration): this is
the sweep that finds the families the calibration cannot build or trace. The benchmark's SKIPPED names
the types that are not decoder-only language models fit can be asked about here, each with its reason;
KNOWN_REFUSED the ones fit still refuses, whose refusal must be one line naming the type and the reason.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from tests.benchmark_scripts import load

sweep = load("fit_every_causal_lm")

from tutor.cli import main

TYPES = sweep.causal_lm_types()


@pytest.fixture(autouse=True)
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path / "data"))


def test_the_lists_name_real_types_once() -> None:
    for listed in (sweep.SKIPPED, sweep.KNOWN_REFUSED, sweep.OVERRIDES):
        assert set(listed) <= set(TYPES), set(listed) - set(TYPES)
    assert not set(sweep.SKIPPED) & set(sweep.KNOWN_REFUSED)
    assert all(reason.strip() for reason in (*sweep.SKIPPED.values(), *sweep.KNOWN_REFUSED.values()))


@pytest.mark.slow
@pytest.mark.parametrize("model_type", [t for t in TYPES if t not in sweep.SKIPPED])
def test_fit_answers_a_decoder_only_causal_lm(model_type: str, tmp_path, capsys) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(sweep.small_config(model_type), default=str))
    capsys.readouterr()
    code = 0
    try:
        main(["fit", str(path), "--device", "cpu", "--seq", "64", "--json"])
    except SystemExit as exit_:
        code = exit_.code or 0
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("[transformers]")]
    if model_type in sweep.KNOWN_REFUSED:
        assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
        assert lines[0].startswith("tensor-tutor: error:") and sweep.KNOWN_REFUSED[model_type] in lines[0]
        named = (model_type, transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
        assert any(name in lines[0] for name in named), lines[0]
        return
    assert code == 0, err
    answer = json.loads(out)
    assert answer["model"]["profile"] in ("hand", "calibrated-trace")
    assert answer["sum_of_components_bytes"] > 0 and answer["peak"]
