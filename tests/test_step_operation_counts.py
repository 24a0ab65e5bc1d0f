"""The step's operations (tutor.theory.step_operations) counted against the real model's: the GEMM FLOPs of a
training step's forward and backward as torch.utils.flop_counter counts them on each family's transformers model
(tiny, random weights), and the family mechanisms (MLP gating and activation, norms, soft-capping, MoE rows) as the
theory reads them from a config."""

from __future__ import annotations

import math

import pytest

from tutor.theory.fit import FitRequest
from tutor.theory.models import architecture_from_config, count_parameters
from tutor.theory.step_operations import GEMM, MEMORY, SDPA_MATH, training_operations
from tutor.files.models import read_model_config

# One preset per hand-profiled family, and families without a hand profile (transformers' default config of the
# model type, counted on the meta device: tutor.trace.arch_calibration.measured_architecture).
PRESETS = ("llama-3.2-1b", "mistral-7b", "phi-3-mini-4k", "gemma-2-2b", "olmo-2-7b", "gpt2", "qwen1.5-moe-a2.7b",
           "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3")
MEASURED = ("nemotron", "falcon", "gpt_neox", "cohere", "granite", "gpt_oss")


def _tiny(config: dict) -> dict:
    from tutor.trace.step_verify import sized_config

    return sized_config(config, layers=2, hidden=64, heads=2, seq=32, vocab=512)


def default_config(model_type: str) -> dict:
    """transformers' default config of a model type, without the fields its to_dict writes as None (derived)."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type).to_dict()
    config["model_type"] = model_type
    return {k: v for k, v in config.items() if v is not None}


def _request(attention: str) -> FitRequest:
    return FitRequest(mode="train", recipe="fp32", dtype="fp32", optimizer="adamw", batch=2, seq_len=32,
                      attention=attention, gpu=False)


def _grouped_mm_flops(a, b, *_args, out_shape=None, **_kwargs) -> int:
    """aten._grouped_mm (transformers' experts): 2·m·k·n over the groups; flop_counter has no formula for it."""
    if len(a) == 2 and len(b) == 2:  # the weight gradient: (k, S) x (S, n) summed per group
        return 2 * a[0] * a[1] * b[1]
    return 2 * math.prod(out_shape) * a[-1]


@pytest.mark.slow
@pytest.mark.parametrize("name", PRESETS + tuple(f"hf:{t}" for t in MEASURED))
def test_the_step_counts_the_gemm_flops_the_real_model_runs(name: str, tmp_path, monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from torch.utils.flop_counter import FlopCounterMode

    from tutor.trace.step_verify import build_as_run, scaled_architecture

    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    config = _tiny(default_config(name[3:]) if name.startswith("hf:") else read_model_config(name).config)
    torch.manual_seed(0)
    model, hf = build_as_run(torch, config, torch.float32)
    attention = hf._attn_implementation
    arch = scaled_architecture(config, name)
    ops = training_operations(arch, _request(attention), params_on_device=count_parameters(arch).total).operations
    ids = torch.randint(0, 512, (2, 32))
    model.train()
    counted = {}
    mapping = {torch.ops.aten._grouped_mm: _grouped_mm_flops}
    with FlopCounterMode(display=False, custom_mapping=mapping) as forward:
        loss = model(input_ids=ids, labels=ids).loss
    with FlopCounterMode(display=False, custom_mapping=mapping) as backward:
        loss.backward()
    for phase, counter in (("forward", forward), ("backward", backward)):
        real = counter.get_flop_counts()["Global"]
        # SDPA's fused CPU kernel is not counted by flop_counter: the linear layers are compared there; eager
        # attention's matmuls and SDPA's math path (MLA's unequal head widths: bmm on the whole square) as well.
        eager = attention == "eager" or any(op.kernel == SDPA_MATH for op in ops)
        counted[phase] = sum(v for k, v in real.items() if eager or "bmm" not in str(k))
        predicted = sum(op.total_flops for op in ops if op.phase == phase and op.kind == GEMM
                        and (eager or not op.name.startswith("attention")))
        assert predicted == pytest.approx(counted[phase], rel=1e-6), (phase, dict(real))
    assert counted["backward"] == 2 * counted["forward"]


def _arch(config: dict, name: str = "x"):
    return architecture_from_config(config, name)


def test_an_ungated_mlp_counts_two_matrices_and_its_own_activation() -> None:
    """Non-gated MLPs (GPT-2's gelu_new, 8 kernels) against a gated one (SiLU and the multiply by up)."""
    gpt2 = training_operations(_arch(read_model_config("gpt2").config), _request("sdpa"), params_on_device=1)
    llama = training_operations(_arch(read_model_config("llama-3.2-1b").config), _request("sdpa"), params_on_device=1)
    names = {op.name for op in gpt2.operations if op.phase == "forward" and op.kind == GEMM}
    assert {"c_fc", "mlp.c_proj"} <= names and "gate_proj" not in names
    act = next(op for op in gpt2.operations if op.phase == "forward" and op.name.startswith("gelu_new"))
    assert act.kernels == 8
    gated = next(op for op in llama.operations if op.phase == "forward" and op.name == "silu(gate) * up")
    assert gated.kernels == 2


def test_gemma2_counts_its_four_norms_and_its_soft_capping_and_llama_neither() -> None:
    gemma = training_operations(_arch(_tiny(read_model_config("gemma-2-2b").config)), _request("eager"),
                                params_on_device=1)
    llama = training_operations(_arch(_tiny(read_model_config("llama-3.2-1b").config)), _request("eager"),
                                params_on_device=1)

    def calls(ops, name):
        return sum(op.calls for op in ops.operations if op.phase == "forward" and op.name == name)

    assert calls(gemma, "post-attention norm") == 3 * 2 and calls(llama, "post-attention norm") == 2
    assert calls(gemma, "score soft-capping") == 2 and calls(gemma, "logit soft-capping") == 1
    assert calls(llama, "score soft-capping") == 0 and calls(llama, "logit soft-capping") == 0
    # Gemma-2's GQA under eager attention copies each key and value head out (repeat_kv); Llama's tiny config too.
    assert calls(gemma, "repeat_kv (keys, values)") == 2


def test_moe_experts_multiply_exactly_the_routed_rows() -> None:
    """Every token goes to k experts: the expert GEMMs have T·k rows in all, however unevenly they split."""
    for preset in ("qwen3-30b-a3b", "mixtral-8x7b", "qwen1.5-moe-a2.7b"):
        arch = _arch(_tiny(read_model_config(preset).config))
        ops = training_operations(arch, _request("sdpa"), params_on_device=1).operations
        rows = sum(op.m * op.calls for op in ops if op.phase == "forward" and op.name == "experts down")
        assert rows == 2 * 32 * arch.experts_per_token * arch.moe_layers, preset
        dispatch = next(op for op in ops if op.phase == "forward" and op.name.startswith("token dispatch"))
        assert dispatch.kind == MEMORY and dispatch.kernels == 4
