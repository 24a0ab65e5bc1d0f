"""benchmarks/fit_unseen_set.py: a small runnable config of any causal-LM type, and its real run beside fit."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from tests.benchmark_scripts import load

unseen = load("fit_unseen_set")


@pytest.fixture(autouse=True)
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path / "data"))


def test_a_narrowed_config_runs_small_and_keeps_the_type() -> None:
    config, how = unseen.narrow_config("mistral")
    assert config is not None, how
    assert config["model_type"] == "mistral"
    assert config["hidden_size"] < 4096 and "parameters" in how


def test_a_skipped_type_says_why() -> None:
    config, how = unseen.narrow_config("musicgen")
    assert config is None and "encoder-decoder" in how


def test_the_real_prefill_sits_beside_fit() -> None:
    config, _ = unseen.narrow_config("llama")
    result = unseen.compare("llama", config, "inference", 1, 96)
    rows = {row.category: row for row in result.rows}
    assert set(rows) == {"parameters", "weights", "buffers", "kv_cache", "activations", "peak"}
    assert rows["buffers"].measured > 0 and rows["buffers"].within  # RoPE's fp32 inv_freq and its copy
    assert rows["parameters"].measured == rows["parameters"].theory  # the hand profile counts exactly
    assert rows["kv_cache"].measured > 0 and rows["kv_cache"].within


def test_a_model_with_a_cache_of_its_own_is_measured_as_generate_runs_it() -> None:
    """MiniMax refuses a DynamicCache (generate() lets it make its own MiniMaxCache): the measured prefill, the
    one `fit --trace` makes, runs it that way and counts that cache."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tutor.trace.memory_trace import measure_prefill, supports_default_cache, token_ids

    config, how = unseen.narrow_config("minimax")
    assert config is not None, how
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("minimax", **{
        k: v for k, v in config.items() if k != "model_type"}), dtype=torch.bfloat16)
    assert not supports_default_cache(model)
    measured = measure_prefill(model, token_ids(model.config.vocab_size, 1, 64))
    assert measured.max_per_category["kv_cache"] > 0
