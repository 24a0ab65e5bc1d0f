"""fit --impl hf at more than one shape: each fix of the shape sweep checked against a real
transformers model run on the CPU at two shapes (so a term with the wrong power of s fails).

Measured through tutor.trace.memory_trace (real tensors, `fake=False`); `_measured_peak` is the only
place that touches the measuring code.
"""

from __future__ import annotations

import pytest

import torch
pytest.importorskip("transformers")

from tutor.theory import fit as fitting
from tutor.theory.models import architecture_from_config

_COMMON = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=1024, max_position_embeddings=1024)
CONFIGS = {
    # A small vocabulary, so that the loss head does not hide the re-run layer's moment.
    "llama": dict(_COMMON, model_type="llama", vocab_size=64),
    "gemma2": dict(_COMMON, model_type="gemma2", head_dim=32, sliding_window=64),
    "deepseek_v3": dict(_COMMON, model_type="deepseek_v3", num_key_value_heads=4, q_lora_rank=64, kv_lora_rank=32,
                        qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, n_routed_experts=4,
                        num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=64,
                        first_k_dense_replace=1, n_group=1, topk_group=1),
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _measured_peak(config: dict, **setup) -> tuple[int, str]:
    """(bytes, phase) of the peak of one real training step on the CPU (tutor.trace.memory_trace)."""
    from tutor.trace.memory_trace import TraceSetup, trace_step

    trace = trace_step(config, TraceSetup(mode="train", fake=False, **setup))
    peak = trace.peak
    return peak.bytes - peak.per_category_bytes.get("buffers", 0), peak.phase


def _theory_peak(config: dict, **request) -> fitting.PeakMoment:
    arch = architecture_from_config(config)
    return fitting.estimate(arch, fitting.FitRequest(mode="train", optimizer="adamw", gpu=False, **request)).worst.peak


# Full recompute: while backward re-runs a checkpointed layer and goes back through it, softmax's
# backward holds three s x s tensors in fp32 (the saved probabilities, the gradient arriving at
# them, its own gradient) beside Gemma-2's saved tanh: eager attention (Gemma-2 runs eager under
# sdpa too) and SDPA's math kernel (DeepSeek-V3's MLA on a CPU); the flash kernel holds none.
@pytest.mark.parametrize("model, attention", [("gemma2", "eager"), ("deepseek_v3", "sdpa"), ("llama", "sdpa")])
@pytest.mark.parametrize("batch, seq", [(1, 192), (1, 384)])
def test_full_recompute_peak_inside_the_re_run_layer(model: str, attention: str, batch: int, seq: int) -> None:
    config = CONFIGS[model]
    measured, phase = _measured_peak(config, dtype="bf16", recompute=True, attention=attention, batch=batch,
                                     seq_len=seq)
    theory = _theory_peak(config, recipe="bf16", recompute="full", attention=attention, batch=batch, seq_len=seq)
    assert phase == theory.phase == "backward"
    assert "re-run" in theory.formula
    assert theory.bytes == pytest.approx(measured, rel=0.05)


# AMP (hf-amp): autocast's 16-bit weight copies are saved for backward and freed by it, so the moments
# after backward (its end, optimizer.step()) hold the fp32 weights only.
@pytest.mark.parametrize("batch, seq", [(1, 16), (2, 16)])
def test_amp_optimizer_step_without_autocast_copies(batch: int, seq: int) -> None:
    config = dict(_COMMON, model_type="llama")
    measured, phase = _measured_peak(config, dtype="fp32", autocast=True, attention="sdpa", batch=batch, seq_len=seq)
    theory = _theory_peak(config, recipe="hf-amp", attention="sdpa", batch=batch, seq_len=seq)
    assert phase == theory.phase == "optimizer"
    assert theory.bytes == pytest.approx(measured, rel=0.02)
    assert theory.per_category["weights"] < _theory_peak(config, recipe="hf-amp", attention="sdpa", batch=batch,
                                                         seq_len=4096).per_category["weights"]


def _notes(config: dict, **request) -> tuple[str, ...]:
    return fitting.estimate(architecture_from_config(config), fitting.FitRequest(seq_len=256, **request)).notes


def test_gemma2_sdpa_note_says_transformers_runs_eager() -> None:
    assert any("Gemma-2" in note and "eager" in note for note in _notes(CONFIGS["gemma2"], attention="sdpa"))
    assert any("Gemma-2" in note for note in _notes(CONFIGS["gemma2"], mode="train", attention="sdpa"))
    assert not any("Gemma-2" in note for note in _notes(CONFIGS["gemma2"], attention="eager"))
    assert not any("Gemma-2" in note for note in _notes(CONFIGS["gemma2"], attention="sdpa", impl="fused"))


def test_cpu_math_sdpa_note_names_the_cause() -> None:
    gpt2 = dict(model_type="gpt2", n_embd=128, n_layer=2, n_head=4, vocab_size=1024, n_positions=512,
                resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)  # GPT-2's published dropout
    dropout = [n for n in _notes(gpt2, mode="train", gpu=False) if "math kernel" in n]
    assert len(dropout) == 1 and "dropout" in dropout[0] and "s x s" in dropout[0]
    mla = [n for n in _notes(CONFIGS["deepseek_v3"], gpu=False) if "math kernel" in n]
    assert len(mla) == 1 and "V head dim" in mla[0]
    # A GPU picks a flash or memory-efficient kernel; GPT-2 inference has no dropout.
    assert not any("math kernel" in n for n in _notes(CONFIGS["deepseek_v3"], gpu=True))
    assert not any("math kernel" in n for n in _notes(gpt2, gpu=False))


def test_fp32_optimizer_peak_formula_says_where_and_why() -> None:
    peak = _theory_peak(CONFIGS["llama"], recipe="fp32", attention="sdpa", batch=1, seq_len=4)
    assert peak.phase == "optimizer"
    assert "optimizer.step()" in peak.formula and "activations" in peak.formula and "temporaries" in peak.formula


# Tied embeddings: the weight is used twice, so autograd holds the lm_head's gradient until the
# embedding's arrives and then adds them: at the end of backward three V x h gradients are alive.
# With a light optimizer (SGD with momentum) and few tokens (the loss head's 12 s b V bytes below
# those 2 V h gradients) that moment is the peak.
@pytest.mark.parametrize("batch, seq", [(1, 8), (2, 12)])
def test_tied_embedding_gradients_at_the_end_of_backward(batch: int, seq: int) -> None:
    config = dict(_COMMON, model_type="llama", vocab_size=4096, tie_word_embeddings=True)
    measured, phase = _measured_peak(config, dtype="bf16", attention="sdpa", optimizer="sgd-momentum",
                                     batch=batch, seq_len=seq)
    arch = architecture_from_config(config)
    theory = fitting.estimate(arch, fitting.FitRequest(mode="train", recipe="bf16", optimizer="sgd-momentum",
                                                       gpu=False, batch=batch, seq_len=seq)).worst.peak
    assert phase == theory.phase == "backward"
    assert "tied embedding" in theory.formula
    assert theory.bytes == pytest.approx(measured, rel=0.02)
