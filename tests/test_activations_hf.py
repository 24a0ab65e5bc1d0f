"""The hf activation profile against real transformers modules run on a CPU, one test per cause of a
difference found. Saved tensors are counted as autograd packs them (each unique non-parameter storage once);
steps and prefills are measured by tutor.trace.memory_trace, the tracker of `fit --trace` and of
benchmarks/fit_vs_transformers.py (every live storage, from the op that made it to its free)."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest

import torch
transformers = pytest.importorskip("transformers")

from torch.multiprocessing.reductions import StorageWeakRef

from tutor.trace.memory_trace import (
    TraceSetup,
    attention_to_run,
    build_model,
    enable_recompute,
    measure_prefill,
    measure_training_step,
    token_ids,
    training_step,
)
from tutor.theory import fit as fitting
from tutor.theory.activations import (
    hf_attention_backend,
    hf_layer_activation_terms,
    hf_layer_shape,
)
from tutor.theory.models import architecture_from_config, count_parameters

H, HEADS, KV_HEADS, FFN, VOCAB, BATCH = 64, 4, 2, 128, 512, 2


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    yield
    torch.set_num_threads(before)


def _config(kind: str, **overrides):
    if kind == "gpt2":
        kw = dict(n_embd=H, n_layer=2, n_head=HEADS, vocab_size=VOCAB, n_positions=512)
    else:
        kw = dict(hidden_size=H, num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                  intermediate_size=FFN, vocab_size=VOCAB, max_position_embeddings=512)
    if kind in ("gemma", "gemma2"):
        kw["head_dim"] = 16
    if kind == "mixtral":
        kw.update(num_local_experts=4, num_experts_per_tok=2)
    if kind == "qwen2_moe":
        kw.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, shared_expert_intermediate_size=96,
                  sliding_window=None)
    if kind == "deepseek_v3":
        kw.update(n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1, moe_intermediate_size=48,
                  kv_lora_rank=32, q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                  n_group=1, topk_group=1, num_key_value_heads=HEADS)
    kw.update(overrides)
    return transformers.AutoConfig.for_model(kind, **kw)


def _model(kind: str, precision: str, attention: str):
    config = _config(kind)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attention)
    model = model.to(torch.bfloat16 if precision == "bf16" else torch.float32).train()
    spec = {**config.to_dict(), "model_type": kind}
    if kind == "qwen2_moe":
        spec["sliding_window"] = None  # the config stores 0 when use_sliding_window is off: no window
    return model, architecture_from_config(spec)


def _key(tensor) -> int:
    return StorageWeakRef(tensor.untyped_storage()).cdata


def _saved_by_layer_one(model, ids, precision: str) -> int:
    """Bytes of the unique storages autograd saves inside decoder layer 1 (weights and, under
    autocast, their 16-bit copies excluded: those are the weights' share)."""
    params = {_key(p) for p in model.parameters()} | {_key(b) for b in model.buffers()}
    weight_shapes = {tuple(p.shape) for p in model.parameters()} | {tuple(p.shape[::-1]) for p in model.parameters()}
    layer = (model.transformer.h if hasattr(model, "transformer") else model.model.layers)[1]
    inside = [False]
    layer.register_forward_pre_hook(lambda *_: inside.__setitem__(0, True))
    layer.register_forward_hook(lambda *_: inside.__setitem__(0, False))
    seen: set[int] = set()
    total = [0]
    # Hold every packed tensor: a storage freed during forward (a branch the loss does not reach, such
    # as DeepSeek-V3's routing scores) could hand its address to a later one, which would then pass
    # for a storage already seen.
    held: list = []

    def pack(tensor):
        held.append(tensor)
        key = _key(tensor)
        copy_of_weight = precision == "amp" and tensor.dtype == torch.bfloat16 and tuple(tensor.shape) in weight_shapes
        # First saver owns a storage: RoPE's cos/sin, computed once per model, belong to layer 0.
        if key not in params and key not in seen:
            seen.add(key)
            if inside[0] and not copy_of_weight:
                total[0] += tensor.untyped_storage().nbytes()
        return tensor

    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "amp" else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        model(input_ids=ids, labels=ids)
    return total[0]


def _theory_layer_one(arch, precision: str, attention: str, seq: int) -> int:
    shape = hf_layer_shape(arch, moe_layer=arch.layer_is_moe[1])
    backend = hf_attention_backend(attention, gpu=False, dropout=shape.dropout, head_dim=shape.head_dim,
                                   v_head_dim=shape.v_head_dim, model_type=arch.model_type)
    terms = hf_layer_activation_terms(shape, seq_len=seq, batch=BATCH, precision=precision, backend=backend, gpu=False)
    return int(sum(term.bytes for term in terms))


def _expert_parallel_sentinel_bytes(model, arch, seq: int) -> int:
    """What layer 1 saves on top of the theory in a transformers whose grouped_mm experts build the
    expert-parallel sentinel mask without expert parallelism (5.17): a bool per token and routed
    expert, (tokens x top_k, 1), which masked_fill keeps for backward. Later ones (5.25) build it only
    under expert parallelism, the experts module then carrying `_is_expert_parallel`; the theory
    (tutor.theory.activations, measured on 5.24) follows those. 0 where no such mask is made."""
    layer = model.model.layers[1] if hasattr(model, "model") else None
    experts = getattr(getattr(layer, "mlp", None), "experts", None)
    if (experts is None or hasattr(experts, "_is_expert_parallel")
            or getattr(model.config, "_experts_implementation", None) != "grouped_mm"):
        return 0
    return BATCH * seq * arch.experts_per_token


def _check_layer(kind: str, precision: str, attention: str, rel: float = 0.0) -> None:
    # Two sequence lengths, so a term with the wrong power of s (s x s against s x h) fails.
    # Under autocast the lengths avoid token counts equal to a weight dimension (the copy filter).
    model, arch = _model(kind, precision, "eager" if kind == "gemma2" else attention)
    for seq in ((40, 72) if precision == "amp" else (32, 64)):
        # Fixed token ids: which experts DeepSeek-V3's router picks changes what it saves.
        ids = torch.randint(0, VOCAB, (BATCH, seq), generator=torch.Generator().manual_seed(seq))
        measured = _saved_by_layer_one(model, ids, precision)
        expected = _theory_layer_one(arch, precision, attention, seq) + _expert_parallel_sentinel_bytes(model, arch, seq)
        assert expected == pytest.approx(measured, rel=rel, abs=64)


# Cause 2: --recipe fp32 keeps 4-byte activations (and cause 3's norms, 4's SwiGLU, at 4 bytes).
def test_cause_2_fp32_activations_are_four_bytes() -> None:
    _check_layer("llama", "fp32", "sdpa")


# Cause 3: RMSNorm keeps its fp32 upcast; Gemma's keeps the normalized tensor in fp32 too; Gemma-2 has 4 norms.
@pytest.mark.parametrize("kind", ["llama", "gemma", "gemma2"])
def test_cause_3_rmsnorm_keeps_fp32_copies(kind: str) -> None:
    _check_layer(kind, "bf16", "sdpa")


# Cause 4: unfused SwiGLU keeps act(gate); GPT-2's gelu_new as Python ops keeps 5 tensors of s x 4h.
@pytest.mark.parametrize("kind", ["qwen2", "gpt2"])
def test_cause_4_unfused_mlp_activations(kind: str) -> None:
    _check_layer(kind, "bf16", "sdpa")


# Cause 5: eager attention keeps the fp32 softmax and its 16-bit copy, K and V expanded (GQA),
# and Gemma-2's soft-cap tanh.
@pytest.mark.parametrize("kind", ["mistral", "gemma2"])
def test_cause_5_eager_attention(kind: str) -> None:
    _check_layer(kind, "bf16", "eager")


# Cause 6: SDPA falls back to the math kernel (s x s, fp32 on a CPU) with dropout (GPT-2) or a
# V head dim unlike Q/K's (DeepSeek-V3 MLA). DeepSeek-V3's layer is counted up to ~15% high here
# (exact with whole-model first-saver attribution in the scratch measurement; the MLA / router
# attribution difference is not yet settled): a known, bounded gap, on the safe side.
@pytest.mark.parametrize("kind, precision, rel", [("gpt2", "fp32", 0.0), ("deepseek_v3", "bf16", 0.1),
                                                  ("deepseek_v3", "fp32", 0.15)])
def test_cause_6_sdpa_math_fallback(kind: str, precision: str, rel: float) -> None:
    assert hf_attention_backend("sdpa", gpu=True, dropout=True, head_dim=24, v_head_dim=16) == "flash"
    _check_layer(kind, precision, "sdpa", rel)


# Cause 7: grouped experts keep k copies of each token, act(gate), and the down output for the
# routing-weight multiply; DeepSeek-V3's router upcasts to fp32.
@pytest.mark.parametrize("kind, rel", [("mixtral", 0.002), ("qwen2_moe", 0.002), ("deepseek_v3", 0.1)])
def test_cause_7_moe_grouped_experts(kind: str, rel: float) -> None:
    _check_layer(kind, "bf16", "sdpa", rel)


# Cause 8: autocast: fp32 residual stream and norms, a 16-bit input copy per linear, experts in fp32.
@pytest.mark.parametrize("kind, rel", [("llama", 0.0), ("gpt2", 0.0), ("mixtral", 0.0), ("qwen2_moe", 0.03)])
def test_cause_8_autocast_activations(kind: str, rel: float) -> None:
    _check_layer(kind, "amp", "sdpa", rel)


def _measured_step_peak(model, ids) -> tuple[int, str]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    training_step(model, optimizer, ids)  # the steady state: optimizer states exist
    peak = measure_training_step(model, optimizer, ids).peak
    return peak.bytes, peak.phase


# Causes 1 and 9: the loss head's fp32 tensors (12 s b V at the start of backward) on top of every
# layer's activations make the peak, early in backward, before the gradients exist.
@pytest.mark.parametrize("recipe, seq", [("bf16", 32), ("bf16", 96), ("fp32", 64)])
def test_causes_1_and_9_training_step_peak(recipe: str, seq: int) -> None:
    model, arch = _model("llama", "bf16" if recipe == "bf16" else "fp32", "sdpa")
    ids = torch.randint(0, VOCAB, (BATCH, seq))
    measured, phase = _measured_step_peak(model, ids)
    request = fitting.FitRequest(mode="train", recipe=recipe, optimizer="adamw", batch=BATCH, seq_len=seq, gpu=False)
    peak = fitting.estimate(arch, request).worst.peak
    assert peak.phase == phase == "backward"
    assert peak.bytes == pytest.approx(measured, rel=0.01)


# Cause 9 (optimizer): with few tokens the step peaks in optimizer.step(), all gradients present.
def test_cause_9_small_batches_peak_in_the_optimizer_step() -> None:
    model, arch = _model("llama", "fp32", "sdpa")
    ids = torch.randint(0, VOCAB, (1, 4))
    measured, phase = _measured_step_peak(model, ids)
    request = fitting.FitRequest(mode="train", recipe="fp32", optimizer="adamw", batch=1, seq_len=4, gpu=False)
    peak = fitting.estimate(arch, request).worst.peak
    assert peak.phase == phase == "optimizer"
    assert peak.bytes == pytest.approx(measured, rel=0.05)


# Full recompute: one checkpoint per layer, one layer re-run at a time.
def test_full_recompute_peak() -> None:
    model, arch = _model("llama", "fp32", "sdpa")
    model.gradient_checkpointing_enable()
    ids = torch.randint(0, VOCAB, (BATCH, 64))
    measured, _ = _measured_step_peak(model, ids)
    request = fitting.FitRequest(mode="train", recipe="fp32", optimizer="adamw", batch=BATCH, seq_len=64,
                                 recompute="full", gpu=False)
    # The theory leaves out part of the re-run layer's backward working set (fp32 here: ~3.5% low).
    assert fitting.estimate(arch, request).worst.peak.bytes == pytest.approx(measured, rel=0.05)


# Cause 11: past the window, the note says the cache holds the whole prompt right after prefill.
def test_cause_11_sliding_window_note() -> None:
    from tutor.files.models import resolve_model

    arch, _ = resolve_model("mistral-7b")
    assert arch.sliding_window
    long = fitting.estimate(arch, fitting.FitRequest(seq_len=2 * arch.sliding_window))
    short = fitting.estimate(arch, fitting.FitRequest(seq_len=arch.sliding_window // 2))
    assert any("whole" in note and "prefill" in note for note in long.notes)
    assert not any("prefill" in note for note in short.notes)


def test_total_is_the_peak_plus_overhead() -> None:
    _, arch = _model("llama", "bf16", "sdpa")
    worst = fitting.estimate(arch, fitting.FitRequest(mode="train", seq_len=64, batch=2)).worst
    assert worst.total == worst.peak.bytes + worst.component("overhead")
    assert worst.total <= worst.sum_of_components
    assert set(worst.peak.per_category) >= {"weights", "gradients", "optimizer", "activations", "kv_cache"}


# ---------------------------------------------------------------------------------------------
# Whole steps and prefills at the sizes of benchmarks/fit_vs_transformers.py (hidden 128, vocab 1024),
# the real transformers model run on the CPU, measured by tutor.trace.memory_trace as that benchmark does.

_BENCHMARK_SIZE = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=1024, max_position_embeddings=512)
_BENCHMARK_MODELS = {
    "llama": dict(_BENCHMARK_SIZE),
    "mixtral": dict(_BENCHMARK_SIZE, num_local_experts=4, num_experts_per_tok=2),
    "gemma2": dict(_BENCHMARK_SIZE, head_dim=32, sliding_window=64),
    "deepseek_v3": dict(_BENCHMARK_SIZE, num_key_value_heads=4, q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=32,
                        qk_rope_head_dim=16, v_head_dim=32, n_routed_experts=4, num_experts_per_tok=2,
                        n_shared_experts=1, moe_intermediate_size=64, first_k_dense_replace=1, n_group=1,
                        topk_group=1),
}
# run -> (parameter dtype, bf16 autocast, full recompute); "inference" is a bf16 prefill.
_RUNS = {"amp": ("fp32", True, False), "recompute": ("bf16", False, True), "inference": ("bf16", False, False)}


@dataclasses.dataclass(frozen=True)
class _Row:
    measured: int
    theory: int


def _rows(kind: str, run: str, batch: int = 2, seq_len: int = 128, impl: str = "hf") -> dict[str, _Row]:
    """Measured (memory_trace, real tensors) and fit's figure per category for one run of a benchmark model."""
    config = {"model_type": kind, **_BENCHMARK_MODELS[kind]}
    dtype, autocast, recompute = _RUNS[run]
    mode = "inference" if run == "inference" else "train"
    attention, _ = attention_to_run(config, "sdpa")  # Gemma-2: transformers runs eager
    model = build_model(config, TraceSetup(mode=mode, dtype=dtype, attention=attention, fake=False), seed=0)
    ids = token_ids(config["vocab_size"], batch, seq_len, seed=1)
    if mode == "inference":
        measured = measure_prefill(model, ids)
        request = fitting.FitRequest(mode=mode, dtype="bf16", batch=batch, seq_len=seq_len, attention=attention,
                                     gpu=False, impl=impl)
    else:
        model.train()
        if recompute:
            enable_recompute(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        cast = torch.bfloat16 if autocast else None
        training_step(model, optimizer, ids, autocast_dtype=cast)
        measured = measure_training_step(model, optimizer, ids, autocast_dtype=cast)
        request = fitting.FitRequest(mode=mode, recipe="hf-amp" if autocast else dtype, optimizer="adamw",
                                     recompute="full" if recompute else "none", batch=batch, seq_len=seq_len,
                                     attention=attention, gpu=False, impl=impl)
    arch = architecture_from_config(model.config.to_dict())
    worst = fitting.estimate(arch, request).worst
    rows = {name: _Row(measured.max_per_category[name], worst.component(name))
            for name in ("weights", "activations", "kv_cache")}
    rows["parameters"] = _Row(sum(p.numel() for p in model.parameters()), count_parameters(arch).total)
    rows["peak"] = _Row(measured.peak.bytes, worst.peak.bytes)
    return rows


# Cause 10: the prefill peak, as generate() runs it (logits_to_keep=1, no grad), at two lengths so
# a wrong power of s fails: a dense model and an MoE model (grouped experts).
@pytest.mark.parametrize("arch", ["llama", "mixtral"])
@pytest.mark.parametrize("batch, seq", [(1, 48), (2, 160)])
def test_cause_10_prefill_activations(arch: str, batch: int, seq: int) -> None:
    rows = _rows(arch, "inference", batch=batch, seq_len=seq)
    assert rows["activations"].theory == pytest.approx(rows["activations"].measured, rel=0.01)
    assert rows["peak"].theory == pytest.approx(rows["peak"].measured, rel=0.01)


# MLA's math SDPA (fp32 copies, s x s scores twice and an fp32 causal mask) holds DeepSeek-V3's prefill peak.
def test_cause_10_prefill_mla_math_attention() -> None:
    for seq in (64, 192):
        rows = _rows("deepseek_v3", "inference", batch=2, seq_len=seq)
        assert rows["activations"].theory == pytest.approx(rows["activations"].measured, rel=0.04)


# Cause 8 (weights): autocast copies only the weights of linears (attention, router, lm_head), not the
# input embedding, the norms or the grouped experts: Mixtral is far below 6 B/param.
def test_cause_8_autocast_weight_copies_mixtral() -> None:
    rows = _rows("mixtral", "amp", seq_len=32)
    assert rows["weights"].theory == pytest.approx(rows["weights"].measured, rel=0.001)
    assert rows["weights"].measured < 5.5 * rows["parameters"].measured


# Full recompute: the re-run layer's tensors live after the loss head's backward freed its fp32
# log-softmax and Gemma-2's soft-cap; Gemma-2 peaks there, inside the recomputed layer's backward.
def test_full_recompute_gemma2() -> None:
    rows = _rows("gemma2", "recompute")
    assert rows["activations"].theory == pytest.approx(rows["activations"].measured, rel=0.05)
    assert rows["peak"].theory == pytest.approx(rows["peak"].measured, rel=0.05)


# Cause 11: right after prefill transformers' sliding-window layers hold the whole prompt; fit --impl hf
# counts that, --impl fused (a serving engine) the window.
def test_cause_11_gemma2_kv_cache_after_prefill() -> None:
    rows = _rows("gemma2", "inference", batch=2, seq_len=160)
    assert rows["kv_cache"].theory == rows["kv_cache"].measured
    fused = _rows("gemma2", "inference", batch=2, seq_len=160, impl="fused")
    assert fused["kv_cache"].theory < rows["kv_cache"].measured


# Full recompute of grouped MoE experts: the re-run layer's backward starts by un-sorting the routed
# output (three k x h gradients, in the routing-weight product's dtype) and reaches the experts' own
# gradients only after their down projection freed its input and output. A wide hidden size with
# narrow experts (Qwen3-MoE, bf16 routing weights) peaks at the first moment; narrow hidden with wide
# experts (Mixtral, fp32 routing weights) at the second. A small vocabulary keeps the loss head below both.
@pytest.mark.parametrize("kind, fields", [
    ("qwen3_moe", dict(hidden_size=128, moe_intermediate_size=32, intermediate_size=256, num_experts=8,
                       num_experts_per_tok=2, head_dim=32, decoder_sparse_step=1, mlp_only_layers=[])),
    ("mixtral", dict(hidden_size=64, intermediate_size=256, num_local_experts=8, num_experts_per_tok=2)),
])
def test_full_recompute_moe_rerun_moments(kind: str, fields: dict) -> None:
    config = {"model_type": kind, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 128, "max_position_embeddings": 512, **fields}
    model = build_model(config, TraceSetup(mode="train", dtype="bf16", attention="sdpa", fake=False), seed=0)
    model.train()
    enable_recompute(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = token_ids(config["vocab_size"], BATCH, 96, seed=1)
    training_step(model, optimizer, ids)
    measured = measure_training_step(model, optimizer, ids).max_per_category["activations"]
    request = fitting.FitRequest(mode="train", recipe="bf16", optimizer="adamw", recompute="full", batch=BATCH,
                                 seq_len=96, attention="sdpa", gpu=False)
    theory = fitting.estimate(architecture_from_config(model.config.to_dict()), request).worst.component("activations")
    assert theory == pytest.approx(measured, rel=0.01)


# Math SDPA on a CPU (torch's rule: dropout, or a V head dim unlike Q/K's): the kernel's C++ locals (fp32
# copies of Q, K, V, its causal mask, the bmm output and the 16-bit casts) live until it returns, beside
# MLA's Python-held projections. With a small vocabulary (and dense layers: a grouped-experts layer's
# backward can hold more) the step's activations peak there, in the last layer's forward, not at the loss
# head. Two lengths, so a wrong power of s fails. Fit is exact on benchmarks/fit_unseen_set.py's
# narrowed DeepSeek-V3 (2 x 296, 3 x 144, also the re-run forward under full recompute); here 0.1% low at
# 160 tokens and 1.2% low at 192 (not yet explained). Longer prompts peak later, in the last layer's
# attention backward, a moment fit has for full recompute only.
@pytest.mark.parametrize("seq, rel", [(160, 0.005), (192, 0.015)])
def test_math_sdpa_attention_core_moment(seq: int, rel: float) -> None:
    config = {"model_type": "deepseek_v3", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 128, "max_position_embeddings": 512,
              "q_lora_rank": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
              "v_head_dim": 32, "first_k_dense_replace": 2, "n_routed_experts": 4, "num_experts_per_tok": 2,
              "moe_intermediate_size": 64, "n_group": 1, "topk_group": 1}
    model = build_model(config, TraceSetup(mode="train", dtype="bf16", attention="sdpa", fake=False), seed=0)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = token_ids(config["vocab_size"], BATCH, seq, seed=1)
    training_step(model, optimizer, ids)
    measured = measure_training_step(model, optimizer, ids)
    request = fitting.FitRequest(mode="train", recipe="bf16", optimizer="adamw", batch=BATCH,
                                 seq_len=seq, attention="sdpa", gpu=False)
    worst = fitting.estimate(architecture_from_config(model.config.to_dict()), request).worst
    assert worst.component("activations") == pytest.approx(measured.max_per_category["activations"], rel=rel)
    assert worst.peak.bytes == pytest.approx(measured.peak.bytes, rel=rel)
    assert "attention core" in worst.peak.formula
    assert worst.peak.phase == measured.peak.phase == "forward"


# The backend rule is torch's own (sdp_utils_cpp.cpp, use_flash_attention_cpp), asked of this torch: the CPU
# flash kernel refuses dropout and unequal head dims, and takes masks and grouped KV heads. A model on the
# flash path (Llama) has no attention-core moment.
def test_cpu_sdpa_backend_rule_is_torchs() -> None:
    from torch.nn.attention import SDPBackend

    from tutor.theory.activations import hf_attention_core_terms

    for d, dv, dropout, kv, mask in [(32, 32, 0.0, 4, False), (48, 32, 0.0, 4, False), (32, 32, 0.1, 4, False),
                                     (32, 32, 0.0, 2, True), (32, 32, 0.0, 2, False)]:
        q, k, v = (torch.randn(2, heads, 16, width, dtype=torch.bfloat16)
                   for heads, width in ((4, d), (kv, d), (kv, dv)))
        m = torch.ones(2, 1, 16, 16, dtype=torch.bool).tril() if mask else None
        chosen = SDPBackend(torch._fused_sdp_choice(q, k, v, m, dropout, not mask, enable_gqa=kv < 4))
        ours = hf_attention_backend("sdpa", gpu=False, dropout=dropout > 0, head_dim=d, v_head_dim=dv)
        assert ours == ("math" if chosen == SDPBackend.MATH else "flash")
    _, arch = _model("llama", "bf16", "sdpa")
    shape = hf_layer_shape(arch, moe_layer=False)
    assert hf_attention_core_terms(shape, seq_len=64, batch=2, backend="flash", gpu=False) == ()
