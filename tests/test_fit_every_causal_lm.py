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
    for listed in (sweep.SKIPPED, sweep.KNOWN_REFUSED, sweep.OVERRIDES, sweep.OWN_DEPTH):
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


# ---------------------------------------------------------------------------------------------
# Each mechanism that took a type off KNOWN_REFUSED, fast: no transformers model is traced.


def test_fake_values_answer_reads_of_values_known_from_the_token_ids() -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tutor.trace.memory_trace import _fake_tensor_workarounds

    with FakeTensorMode():
        ids = torch.randint(0, 50, (2, 16))
        with _fake_tensor_workarounds(True) as values:
            values.give_token_ids(ids, 50)
            real = values.copies[ids][0]
            # XLM's check of its sequence lengths: a Python value read from a fake tensor.
            longest = (ids != 7).sum(dim=1).max().item()
            largest_position = torch.arange(16).unsqueeze(0).max().item()  # Reformer's largest position id
            picked = ids[ids > 25].shape  # a size set by the values (aten.nonzero)
            assert values.assumptions == []  # nothing rested on a stand-in
    assert longest == (real != 7).sum(dim=1).max().item() and largest_position == 15
    assert picked == real[real > 25].shape


def test_fake_values_route_weight_derived_picks_evenly_and_say_so() -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tutor.trace.memory_trace import COMPARISON_TRUE, UNIFORM_PICK, _fake_tensor_workarounds

    with FakeTensorMode():
        logits = torch.empty(24, 8)  # a router's logits: values a fake tensor does not have
        with _fake_tensor_workarounds(True) as values:
            _, experts = logits.topk(2, dim=1)
            gates = torch.zeros(24, 8).scatter(1, experts, 1)
            tokens_per_expert = gates.long().sum(0).tolist()  # JetMoE's expert sizes
            assert tokens_per_expert == [24 * 2 // 8] * 8
            assert values.assumptions == [UNIFORM_PICK]
            assert (torch.empty(10) > 0.5).nonzero().shape == (10, 1)  # BLT's patch starts: every position
            assert values.assumptions == [UNIFORM_PICK, COMPARISON_TRUE]


def test_fake_values_forget_a_copy_written_from_unknown_values() -> None:
    import torch
    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

    from tutor.trace.memory_trace import _fake_tensor_workarounds

    with FakeTensorMode():
        with _fake_tensor_workarounds(True):
            counts = torch.zeros(4, dtype=torch.long)
            view = counts[:2]
            view.copy_(torch.empty(2).long())  # written through a view, from values nobody has
            with pytest.raises(DataDependentOutputException):
                counts.sum().item()


def test_a_model_that_casts_a_module_while_it_is_built_is_built_on_meta_then_faked() -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from tutor.trace.memory_trace import _built_on_meta_then_faked

    class CastsWhileBuilt(torch.nn.Module):  # as DeepSeek-V4 keeps its norms in fp32
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.norm = torch.nn.LayerNorm(4).to(dtype=torch.float32)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight  # tied
            self.register_buffer("positions", torch.arange(6))

        @classmethod
        def _from_config(cls, config, attn_implementation, dtype):
            default = torch.get_default_dtype()
            torch.set_default_dtype(dtype)
            try:
                return cls()
            finally:
                torch.set_default_dtype(default)

    with FakeTensorMode():
        with pytest.raises(RuntimeError, match="Couldn't swap"):
            CastsWhileBuilt._from_config(None, "sdpa", torch.bfloat16)
        model = _built_on_meta_then_faked(CastsWhileBuilt, None, "sdpa", torch.bfloat16)
    assert all(isinstance(t, FakeTensor) and t.device.type == "cpu" for t in (*model.parameters(), *model.buffers()))
    assert model.embed.weight.dtype == torch.bfloat16 and model.norm.weight.dtype == torch.float32
    assert model.head.weight is model.embed.weight and model.embed.weight.requires_grad


def test_a_fake_tensor_deep_copies_to_a_storage_of_its_own() -> None:
    import copy

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tutor.trace.memory_trace import _fake_tensor_workarounds

    with FakeTensorMode():
        keys = torch.empty(2, 3)
        with _fake_tensor_workarounds(True):
            copied = copy.deepcopy({"keys": keys})["keys"]  # Inkling-2-Loop's copies of its cache layers
    assert copied.shape == keys.shape and copied.untyped_storage()._cdata != keys.untyped_storage()._cdata


def test_a_count_the_class_rewrites_is_rebuilt_from_the_count_it_was_given() -> None:
    from transformers import AutoConfig

    from tutor.trace.layer_count import config_at_depth

    # HRM-Text writes num_hidden_layers as the cache slots of its two stacks run in cycles (16 layers per
    # stack x H_cycles 2 x (L_cycles 3 + 1)) and keeps the layers per stack in num_layers_per_stack.
    written = AutoConfig.for_model("hrm_text", num_hidden_layers=16).to_dict()
    assert (written["num_hidden_layers"], written["num_layers_per_stack"]) == (128, 16)
    for depth in (2, 3):
        built = AutoConfig.for_model("hrm_text", **{k: v for k, v in config_at_depth(written, depth).items()
                                                    if k != "model_type"})
        assert (built.num_layers_per_stack, built.num_hidden_layers) == (depth, depth * 8)


def test_a_config_without_a_layer_count_is_left_whole() -> None:
    from tutor.trace.layer_count import with_layers

    # BLT counts each of its four stacks in a sub-config; a count added at the top would be read by
    # DynamicCache(config=...) alone, which would then hold fewer layers than the model runs.
    config = {"model_type": "blt", "decoder_config": {"num_hidden_layers": 9}, "hidden_size": 8}
    assert with_layers(config, 2) == config
