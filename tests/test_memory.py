"""Weight formats, training state per parameter, LoRA and overheads against published figures:
QLoRA, GGUF block layouts, whichllm, vLLM weights, ZeRO Table 1, Korthikanti Figure 1, the PEFT
Llama-3.2-3B run and the Hugging Face bert-large measurements."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tutor.theory.memory as memory
from tutor.errors import UserError
from tutor.theory.memory import (
    ALLOCATOR_SLACK_FRACTION,
    OPTIMIZERS,
    TRAINING_RECIPES,
    WEIGHT_FORMATS,
    activation_bytes_per_layer,
    adafactor_state_elements,
    allocator_slack_bytes,
    cuda_context_overhead_bytes,
    int8_rowwise_bits_per_weight,
    lora_adapter_params,
    model_state_bytes,
    model_state_bytes_per_param,
    weight_bytes,
    weight_format,
)
from tutor.theory.units import GB, GiB, MiB


def matches_printed(value: float | Fraction, printed: str) -> bool:
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return abs(Fraction(value) - Fraction(printed)) <= Fraction(1, 2 * 10**decimals)


# ---- weight formats ----------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("name", "bits"),
    [
        ("fp32", "32"), ("tf32", "32"), ("bf16", "16"), ("fp16", "16"), ("fp8", "8"),
        ("q4_0", "4.5"), ("q8_0", "8.5"),  # gpu_poor computeModelSizeGGML: 18 B and 34 B per 32 weights
        # llama.cpp k-quants (PR #1684) as quoted in model cards
        ("q2_k", "2.625"), ("q3_k", "3.4375"), ("q4_k", "4.5"), ("q5_k", "5.5"), ("q6_k", "6.5625"),
    ],
)
def test_published_bits_per_weight(name: str, bits: str) -> None:
    assert weight_format(name).bits_per_weight == Fraction(bits)


def test_whichllm_bytes_per_weight_for_fp4_formats() -> None:
    # Andyyyy64/whichllm engine/quantization.py: MXFP4 0.53125, NVFP4 0.5625 bytes per weight.
    assert weight_format("mxfp4").bytes_per_weight == Fraction("0.53125")
    assert weight_format("nvfp4").bytes_per_weight == Fraction("0.5625")


def test_qlora_nf4_constants() -> None:
    # QLoRA arXiv 2305.14314 §3: blocksize-64 fp32 constants cost 0.5 bit/param, double
    # quantization brings them to 8/64 + 32/(64·256) = 0.127 bits.
    assert weight_format("nf4").bits_per_weight - 4 == Fraction(1, 2)
    assert matches_printed(weight_format("nf4-dq").bits_per_weight - 4, "0.127")
    assert weight_format("nf4").bytes_per_weight == Fraction("0.5625")


def test_group_128_int4_is_about_0_52_bytes() -> None:
    for name in ("int4", "gptq-int4-g128", "awq-int4-g128", "GPTQ", "awq"):
        assert weight_format(name).bits_per_weight == 4 + Fraction(20, 128)
    assert matches_printed(weight_format("int4").bytes_per_weight, "0.52")


def test_deepseek_fp8_block_scale_overhead() -> None:
    # README_WEIGHTS.md: an fp32 scale per 128x128 block, +4/16384 bytes per weight.
    assert weight_format("fp8-block128").bytes_per_weight == 1 + Fraction(4, 16384)


def test_int8_row_scale_is_per_row() -> None:
    assert weight_format("int8").bits_per_weight == 8
    assert int8_rowwise_bits_per_weight(4096) == 8 + Fraction(32, 4096)
    assert int8_rowwise_bits_per_weight(4096, scale_bits=16) == 8 + Fraction(16, 4096)


def test_vllm_llama3_8b_weights() -> None:
    # vllm-project/vllm PR #10511: "weights 14.96 GiB" for Meta-Llama-3-8B in bf16.
    assert matches_printed(weight_bytes(8_030_261_248, "bf16") / GiB, "14.96")


def test_vllm_llama33_70b_fp8_weights_within_0_1_percent() -> None:
    # Llama-3.3-70B-FP8-dynamic keeps 2,109,382,656 elements in bf16 and 68,451,041,280 in fp8;
    # vLLM (llm-d measurements) loaded it in 67.72 GiB.
    total = weight_bytes(2_109_382_656, "bfloat16") + weight_bytes(68_451_041_280, "fp8")
    assert matches_printed(total / GiB, "67.68")
    assert abs(total / GiB - 67.72) / 67.72 < 0.001


def test_weight_bytes_rounds_up_to_whole_bytes() -> None:
    assert weight_bytes(3, "nf4") == 2  # 13.5 bits
    assert weight_bytes(10**9, "float16") == 2 * 10**9
    assert weight_bytes(256, "q6_k") == 210


@given(params=st.integers(1, 10**13), name=st.sampled_from(sorted(WEIGHT_FORMATS)))
def test_weight_bytes_is_the_smallest_whole_byte_count(params: int, name: str) -> None:
    n_bytes = weight_bytes(params, name)
    exact = params * WEIGHT_FORMATS[name].bits_per_weight / 8
    assert n_bytes >= exact > n_bytes - 1


def test_aliases_and_unknown_names() -> None:
    assert weight_format("float32") is WEIGHT_FORMATS["fp32"]
    assert weight_format("Half") is WEIGHT_FORMATS["fp16"]
    assert weight_format("bfloat16") is WEIGHT_FORMATS["bf16"]
    assert weight_format("Q4_K") is WEIGHT_FORMATS["q4_k"]
    with pytest.raises(UserError, match="nf4-dq") as caught:
        weight_format("int3")
    assert "\n" not in str(caught.value)


def test_every_format_cites_a_source() -> None:
    for fmt in WEIGHT_FORMATS.values():
        assert fmt.source and fmt.description and fmt.bits_per_weight > 0


# ---- training state per parameter ---------------------------------------------------------------

@pytest.mark.parametrize(
    ("recipe", "optim", "weights", "grads", "opt_bytes"),
    [
        ("mixed", "adam", 2, 2, 12),       # ZeRO §3.1: K = 12, 16 B/param
        ("megatron", "adam", 2, 4, 12),    # Megatron theoretical_memory_usage.py: 18
        ("hf-amp", "adamw", 6, 4, 8),      # HF model_memory_anatomy: 6 + 4 + 8 = 18
        ("bf16", "adamw", 2, 2, 4),        # pure bf16: 8 B/param
        ("fp32", "adam", 4, 4, 8),         # 16
        ("mixed", "sgd-momentum", 2, 2, 8),  # EleutherAI TM101: SGD + momentum 8 B incl. master
        ("mixed", "sgd", 2, 2, 4),
        ("mixed", "lion", 2, 2, 8),
    ],
)
def test_bytes_per_param_anchors(recipe, optim, weights, grads, opt_bytes) -> None:
    state = model_state_bytes_per_param(recipe, optim)
    assert (state.weights, state.gradients, state.optimizer) == (weights, grads, opt_bytes)
    assert state.total == weights + grads + opt_bytes


def test_default_is_mixed_adam_16_bytes() -> None:
    assert model_state_bytes_per_param().total == 16


def test_8bit_adam_is_6_bytes_with_master_plus_block_absmax() -> None:
    # EleutherAI TM101: "8-bit optimizers: 6 bytes" incl. the fp32 master; Dettmers et al.
    # arXiv 2110.02861: one fp32 absmax per 2048-value block adds 4/2048 B per state.
    state = model_state_bytes_per_param("mixed", "adam-8bit")
    assert state.optimizer == 4 + 2 * (1 + Fraction(4, 2048))
    assert abs(state.optimizer - 6) / 6 < 0.001
    # HF docs: "2 bytes * number of parameters for 8-bit AdamW" (states only, no master).
    assert matches_printed(model_state_bytes_per_param("bf16", "adam-8bit").optimizer, "2.0")


def test_zero_paper_baseline() -> None:
    # ZeRO Figure 1 / Table 1 N_d = 1: 7.5B -> 120 GB, 128B -> 2048 GB, 1T -> 16000 GB.
    assert model_state_bytes(7_500_000_000) == 120 * GB
    assert model_state_bytes(128 * 10**9) == 2048 * GB
    assert model_state_bytes(10**12) == 16_000 * GB


def test_korthikanti_22b_params_and_optimizer() -> None:
    # arXiv 2205.05198 Figure 1: 12·L·h²/t parameters per rank at 18 B (Megatron) = 45.5625 GiB.
    per_rank = 12 * 48 * 6144**2 // 8
    assert Fraction(model_state_bytes(per_rank, "megatron", "adam"), GiB) == Fraction("45.5625")


def test_peft_llama_3_2_3b_pure_bf16_within_2_percent_of_allocated() -> None:
    # huggingface/peft method_comparison full fine-tuning: 3,212,749,824 params, 26.06 GB allocated avg.
    predicted = model_state_bytes(3_212_749_824, "bf16", "adamw")
    assert matches_printed(predicted / GB, "25.70")
    assert abs(predicted / GB - 26.06) / 26.06 < 0.02


def test_hf_peft_optimizer_example() -> None:
    # HF PEFT docs: a 7B model's AdamW optimizer needs 84 GB; 0.2B LoRA adapters need 2.4 GB.
    optimizer_bytes = model_state_bytes_per_param("mixed", "adamw").optimizer
    assert 7 * 10**9 * optimizer_bytes == 84 * GB
    assert Fraction(2, 10) * 10**9 * optimizer_bytes == Fraction("2.4") * GB


def test_adafactor_factored_state() -> None:
    assert adafactor_state_elements((4, 4)) == 8  # row and column statistics
    assert adafactor_state_elements((4096, 11008)) == 4096 + 11008
    assert adafactor_state_elements((3, 4, 5)) == 3 * 4 + 3 * 5
    assert adafactor_state_elements((1024,)) == 1024
    assert adafactor_state_elements((4, 4), momentum=True) == 8 + 16
    assert model_state_bytes_per_param("fp32", "adafactor").optimizer == 0


def test_unknown_recipe_and_optimizer_list_the_names() -> None:
    with pytest.raises(UserError, match="megatron") as caught:
        model_state_bytes_per_param("apex")
    assert "\n" not in str(caught.value)
    with pytest.raises(UserError, match="adam-8bit"):
        model_state_bytes_per_param("mixed", "shampoo")
    assert model_state_bytes_per_param("mixed", "AdamW_8bit") == model_state_bytes_per_param("mixed", "adam-8bit")


def test_tables_are_complete() -> None:
    assert set(TRAINING_RECIPES) == {"mixed", "megatron", "hf-amp", "bf16", "fp32"}
    assert {"adam", "adamw", "sgd", "sgd-momentum", "adam-8bit", "adafactor", "lion"} <= set(OPTIMIZERS)


# ---- LoRA -----------------------------------------------------------------------------------------

def test_lora_llama_3_2_3b_rank_32_on_q_and_v() -> None:
    # huggingface/peft lora--llama-3.2-3B-rank32.json: 9,175,040 trainable parameters.
    # q_proj 3072 -> 3072; v_proj 3072 -> 8 KV heads × 128 = 1024; 28 layers.
    per_layer = lora_adapter_params(3072, 3072, 32) + lora_adapter_params(3072, 1024, 32)
    assert 28 * per_layer == 9_175_040


def test_lora_bad_rank() -> None:
    with pytest.raises(UserError):
        lora_adapter_params(4096, 4096, 0)


# ---- bert-large measurements (reference §4.1) ------------------------------------------------------

BERT_LARGE_PARAMS = 335_143_938  # BERT-large 335,141,888 + a 2-way classifier head


def bert_large_layer(batch: int, recompute: str = "none") -> int:
    return activation_bytes_per_layer(
        seq_len=512, batch=batch, hidden=1024, heads=16, kv_heads=16, head_dim=64, ffn=4096,
        gated_mlp=False, dropout=True, attention="eager", recompute=recompute, bytes_per_value=4,
    )


@pytest.mark.parametrize(
    ("setup", "reference_estimate_mib", "measured_mb"),
    [("bs4", 13_081, 14_949), ("bs1", 8_113, 8_681), ("bs1+checkpointing", 6_574, 6_775)],
)
def test_bert_large_fp32_training_within_15_percent(setup: str, reference_estimate_mib: int, measured_mb: int) -> None:
    # HF perf_train_gpu_one, V100, seq 512, fp32 AdamW; nvidia-smi "MB" are MiB. The estimate is
    # model states + 24 layers of activations + the measured CUDA context; it leaves out the
    # allocator slack and temporaries, so it must stay below the measurement.
    states = model_state_bytes(BERT_LARGE_PARAMS, "fp32", "adamw")
    if setup == "bs1+checkpointing":
        # gradient checkpointing: every layer input kept, one layer recomputed at a time
        activations = 24 * bert_large_layer(1, "full") + bert_large_layer(1)
    else:
        activations = 24 * bert_large_layer(4 if setup == "bs4" else 1)
    estimate = states + activations + cuda_context_overhead_bytes().bytes
    assert round(estimate / MiB) == reference_estimate_mib
    assert estimate / MiB < measured_mb
    assert (measured_mb - estimate / MiB) / measured_mb < 0.15


def test_bert_large_optimizer_savings_within_5_percent() -> None:
    adam = model_state_bytes(BERT_LARGE_PARAMS, "fp32", "adamw")
    adafactor_saving = (adam - model_state_bytes(BERT_LARGE_PARAMS, "fp32", "adafactor")) / MiB
    eight_bit_saving = (adam - model_state_bytes(BERT_LARGE_PARAMS, "fp32", "adam-8bit")) / MiB
    assert abs(adafactor_saving - (14_949 - 12_295)) / (14_949 - 12_295) < 0.05
    assert abs(eight_bit_saving - (14_949 - 13_085)) / (14_949 - 13_085) < 0.05


# ---- overheads ------------------------------------------------------------------------------------

def test_cuda_context_is_labelled_hf_measurement() -> None:
    context = cuda_context_overhead_bytes()
    assert context.bytes == 1343 * MiB
    assert "model_memory_anatomy" in context.source
    assert context.note.startswith("typical, measured on one setup; your card differs")


# Reference memory-and-models.md §4.2, huggingface/peft method_comparison/MetaMathQA results,
# full-finetuning--llama-3.2-3B: pure bf16 + AdamW, reserved average as printed (GB).
PEFT_FULL_FT_PARAMS, PEFT_FULL_FT_RESERVED_AVG_GB = 3_212_749_824, 33.10


def test_allocator_slack_default_reproduces_peft_reserved_gap() -> None:
    assert matches_printed(ALLOCATOR_SLACK_FRACTION, "0.27")
    # Independent of how the fraction is defined: the theory's own state bytes for that run
    # (8 B/param = 25.70 GB) plus the default slack must land on the reserved figure the run printed.
    allocated = model_state_bytes(PEFT_FULL_FT_PARAMS, "bf16", "adam")
    slack = allocator_slack_bytes(allocated)
    reserved = allocated + slack.bytes
    assert abs(reserved / GB - PEFT_FULL_FT_RESERVED_AVG_GB) / PEFT_FULL_FT_RESERVED_AVG_GB < 0.03
    assert "estimate" in slack.note
    assert allocator_slack_bytes(1000, 0.1).bytes == 100
    assert allocator_slack_bytes(1001, Fraction(1, 10)).bytes == 101  # rounded up


@pytest.mark.parametrize(
    "call",
    [
        lambda: allocator_slack_bytes(-1),
        lambda: allocator_slack_bytes(100, -0.1),
        lambda: allocator_slack_bytes(100, float("nan")),
        lambda: allocator_slack_bytes(100, "ten percent"),
        lambda: weight_bytes(0, "bf16"),
        lambda: weight_bytes(10, "bf17"),
        lambda: adafactor_state_elements(()),
        lambda: adafactor_state_elements((4, 0)),
    ],
)
def test_bad_input_is_one_line_user_error(call) -> None:
    with pytest.raises(UserError) as caught:
        call()
    assert "\n" not in str(caught.value)


def test_memory_reexports_activation_and_kv_functions() -> None:
    for name in memory.__all__:
        assert hasattr(memory, name), name
    assert memory.kv_cache_bytes_per_token(layers=32, kv_heads=8, head_dim=128) == 131_072
