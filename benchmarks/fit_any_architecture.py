"""`tensor-tutor fit` on architectures it has no hand profile for, against real transformers steps.

For each model type (the 19 that fit once refused, three tied-embedding families, and the
hand-profiled ones) a small config in the type's own keys, with 4 decoder layers and a vocabulary
that keeps the loss head a minority of the activations, is built by transformers (random weights,
CPU) and run the way a user runs it (benchmarks/fit_vs_transformers.py: two training steps, the
second measured; or a prefill as generate() runs it), each storage tracked by
tutor.trace.memory_trace. Beside it: fit's answer for the matching request, from the architecture
`tensor-tutor fit` resolves (tutor.trace.arch_calibration: the hand profile, or the real class
counted on the meta device plus traces at small shapes fitted in b·s and b·s²). The measured shape
(default 2 x 256 tokens, 4 layers) is never one the calibration traced (2 and 3 layers, up to
2 x 128 tokens).

    python benchmarks/fit_any_architecture.py                       # every type, bf16 / recompute / inference
    python benchmarks/fit_any_architecture.py --arch gpt_oss --config bf16 --json
    python benchmarks/fit_any_architecture.py --sweep               # every causal-LM type transformers has:
                                                                    # resolved, counted exactly?
Calibrations are cached in $TENSOR_TUTOR_DATA_DIR (a temporary folder unless it is set).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parent.parent))
    sys.path.append(str(Path(__file__).resolve().parent))

import fit_vs_transformers as base  # noqa: E402  (the measuring and the comparison rows)

VOCAB = 512
SMALL = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=1024, pad_token_id=0,
             bos_token_id=1, eos_token_id=2)
MOE = dict(num_experts_per_tok=2, moe_intermediate_size=128)
# The 19 model types fit once refused and three tied-embedding families, each in its own keys
# (experts under the name its configuration class uses).
CALIBRATED: dict[str, dict] = {
    "gemma3_text": dict(SMALL, head_dim=32, sliding_window=64),
    "granite": dict(SMALL),
    "granitemoe": dict(SMALL, num_local_experts=4, num_experts_per_tok=2),
    "starcoder2": dict(SMALL),
    "gpt_neox": dict(SMALL),
    "cohere": dict(SMALL),
    "cohere2": dict(SMALL, sliding_window=64),
    "glm": dict(SMALL),
    "glm4": dict(SMALL),
    "falcon": dict(SMALL, num_kv_heads=2, new_decoder_architecture=True),
    "smollm3": dict(SMALL),
    "olmoe": dict(SMALL, num_experts=4, **MOE),
    "olmo3": dict(SMALL, sliding_window=64),
    "phi": dict(SMALL),
    "stablelm": dict(SMALL),
    "exaone4": dict(SMALL, sliding_window=64),
    "helium": dict(SMALL, head_dim=32),  # HeliumAttention's o_proj assumes heads x head_dim = hidden
    "seed_oss": dict(SMALL),
    "gpt_oss": dict(SMALL, num_local_experts=4, num_experts_per_tok=2, sliding_window=64, head_dim=32),
    # Hybrid and state-space models: attention beside Mamba/SSM, gated-delta or short-convolution layers,
    # whose cache holds keys and values for the attention layers and a constant conv and recurrent state
    # for the others. Chunked scans (mamba2, bamba, granitemoehybrid, zamba2, qwen3_next) pad the prompt
    # to whole chunks: chunks of 64 here, so that the traced lengths and the measured one pad differently.
    "jamba": dict(SMALL, num_experts=4, num_experts_per_tok=2, attn_layer_period=2, attn_layer_offset=1,
                  expert_layer_period=2, expert_layer_offset=1, mamba_d_state=16, mamba_dt_rank=8),
    "bamba": dict(SMALL, attn_layer_indices=[1, 3], mamba_n_heads=8, mamba_d_head=32, mamba_d_state=16,
                  mamba_chunk_size=64),
    "nemotron_h": dict({k: v for k, v in SMALL.items() if k != "num_hidden_layers"}, head_dim=32,
                       layers_block_type=["linear_attention", "mlp", "full_attention", "mlp"],
                       ssm_state_size=16, mamba_num_heads=8, mamba_head_dim=32, n_groups=1, chunk_size=64),
    "granitemoehybrid": dict(SMALL, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=128,
                             layer_types=["mamba", "attention", "mamba", "attention"], mamba_n_heads=8,
                             mamba_d_head=32, mamba_d_state=16, mamba_chunk_size=64),
    "zamba2": dict(SMALL, num_key_value_heads=4, layers_block_type=["mamba", "hybrid", "mamba", "hybrid"],
                   mamba_d_state=16, n_mamba_heads=8, chunk_size=64),
    "qwen3_next": dict(SMALL, head_dim=32, num_experts=4, **MOE, shared_expert_intermediate_size=128,
                       layer_types=["linear_attention", "full_attention"] * 2, linear_key_head_dim=32,
                       linear_value_head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4),
    "lfm2": dict(SMALL, layer_types=["conv", "full_attention", "conv", "full_attention"]),
    "falcon_h1": dict(SMALL, head_dim=32, mamba_d_ssm=256, mamba_n_heads=8, mamba_d_head=32, mamba_d_state=16,
                      mamba_chunk_size=64),
    "mamba": dict(hidden_size=128, num_hidden_layers=4, state_size=16, vocab_size=VOCAB, time_step_rank=8,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "mamba2": dict(hidden_size=128, num_hidden_layers=4, num_heads=8, head_dim=32, state_size=16, n_groups=1,
                   chunk_size=64, vocab_size=VOCAB, time_step_rank=8, pad_token_id=0, bos_token_id=1,
                   eos_token_id=2),
    "falcon_mamba": dict(hidden_size=128, num_hidden_layers=4, state_size=16, vocab_size=VOCAB, time_step_rank=8,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "longcat_flash": dict({k: v for k, v in SMALL.items() if k not in ("num_hidden_layers", "intermediate_size")},
                          num_layers=2, num_key_value_heads=4, ffn_hidden_size=256, q_lora_rank=64, kv_lora_rank=32,
                          qk_nope_head_dim=32, qk_rope_head_dim=16, head_dim=16, v_head_dim=32,
                          n_routed_experts=4, moe_topk=2, zero_expert_num=2, expert_ffn_hidden_size=128),
    # Types a fake trace once could not run. jetmoe and dbrx read their routing's values (the trace
    # routes tokens evenly; these real runs route as their random weights do); inkling_text and hy_v4 cast
    # modules at construction; xlm reads its sequence lengths; hrm_text's count is of its stacks' slots.
    "jetmoe": dict(SMALL, num_local_experts=4, num_experts_per_tok=2, kv_channels=32),
    "dbrx": dict(n_layers=4, d_model=128, n_heads=4, vocab_size=VOCAB, max_seq_len=1024,
                 rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                 attn_config={"kv_n_heads": 2, "clip_qkv": 8, "rope_theta": 500000.0},  # its own rope_theta
                 ffn_config={"ffn_hidden_size": 256, "moe_num_experts": 4, "moe_top_k": 2}),
    "inkling_text": dict(SMALL, head_dim=32),
    "hy_v4": dict(SMALL, head_dim=32),
    "xlm": dict(emb_dim=128, n_layers=4, n_heads=4, vocab_size=VOCAB, max_position_embeddings=1024, is_decoder=True,
                causal=True, pad_index=0),
    "hrm_text": dict(SMALL, head_dim=32),
    # Tied-embedding families in their own spellings (GPT-BigCode's attribute map, BLOOM's n_layer/n_head
    # and its 4h MLP); GPT-BigCode keeps its default dropouts (0.1), as SantaCoder and StarCoder ship.
    "gpt_bigcode": dict(n_embd=128, n_inner=256, n_layer=4, n_head=4, vocab_size=VOCAB, n_positions=1024,
                        pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "bloom": dict(hidden_size=128, n_layer=4, n_head=4, vocab_size=VOCAB, pad_token_id=0, bos_token_id=1,
                  eos_token_id=2),
    "ernie4_5": dict(SMALL, head_dim=32),
}
HAND: dict[str, dict] = {
    "llama": dict(SMALL),
    "qwen2": dict(SMALL),
    "qwen3": dict(SMALL, head_dim=32),
    "qwen3_moe": dict(SMALL, head_dim=32, num_experts=4, **MOE),
    "mistral": dict(SMALL),
    "mixtral": dict(SMALL, num_local_experts=4, num_experts_per_tok=2),
    "gemma": dict(SMALL, num_key_value_heads=1, head_dim=32),
    "gemma2": dict(SMALL, head_dim=32, sliding_window=64),
    "phi3": dict(SMALL),
    "olmo": dict(SMALL),
    "olmo2": dict(SMALL),
}
DEFAULT_CONFIGS = ("bf16", "recompute", "inference")


def config_dict(model_type: str) -> dict:
    """The config as transformers writes it (to_dict), as `fit` reads a config.json."""
    from transformers import AutoConfig

    keys = {**CALIBRATED, **HAND}[model_type]
    return AutoConfig.for_model(model_type, **keys).to_dict()


def build(model_type: str, run):
    """The real model from the written config, with the run's attention and dtype. A 16-bit model is
    built as from_pretrained(dtype=torch.bfloat16) builds it: parameters in bf16, the rotary buffers
    kept in fp32 (model.to(bfloat16) would cast those too, which no loading path does)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = config_dict(model_type)
    fields = {k: v for k, v in config.items() if k != "model_type"}
    dtype = {"dtype": torch.bfloat16} if run.bf16_model else {}
    torch.manual_seed(0)
    hf_config = AutoConfig.for_model(model_type, **fields)
    try:
        model = AutoModelForCausalLM.from_config(hf_config, attn_implementation=run.attention, **dtype)
    except ValueError:  # no SDPA path: transformers runs its default
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **fields), **dtype)
    if run.mode == "train":
        # As transformers' Trainer runs it (TrainingArguments.use_cache False), and as `fit --trace` and the
        # calibration trace it. With the config's default (True) some models build a cache in training:
        # GPT-NeoX then keeps 11% fewer activations (K and V shared with the cache).
        model.config.use_cache = False
    return config, model


def compare(model_type: str, run_name: str, batch: int, seq_len: int) -> tuple[base.RunResult, dict]:
    import torch

    from tutor.trace.arch_calibration import calibrated_for, measured_architecture
    from tutor.theory import fit as fitting
    from tutor.theory.models import architecture_from_config

    torch.set_num_threads(1)
    run = base.CONFIGS[run_name]
    config, model = build(model_type, run)
    attention = base.attention_used(model)
    request = base.fit_request(run, "hf", batch, seq_len, attention)
    started = time.perf_counter()
    if model_type in CALIBRATED:
        arch = calibrated_for(measured_architecture(config, model_type), request)
    else:
        arch = architecture_from_config(config, model_type)
    answer_seconds = time.perf_counter() - started
    result = beside_fit(model_type, run_name, model, arch, request, batch, seq_len)
    info = {"profile": arch.profile, "calibration_seconds": round(answer_seconds, 2),
            "check_error": next((s.check_error for s in arch.calibration.setups
                                 if s.key == fitting._calibration_key(arch, request)), None) if arch.calibration else None}
    return result, info


def beside_fit(model_type: str, run_name: str, model, arch, request, batch: int, seq_len: int) -> base.RunResult:
    """`model` run for real as `run_name` runs it (fit_vs_transformers: two training steps, the second measured;
    or a prefill), each category beside fit's answer to `request` for `arch`."""
    from tutor.theory import fit as fitting
    from tutor.theory.models import count_parameters

    run = base.CONFIGS[run_name]
    if run.mode == "train":
        measured = base.measure_training(model, run, batch, seq_len)
        categories = base.TRAIN_CATEGORIES
    else:
        measured = base.measure_inference(model, batch, seq_len)
        categories = base.INFERENCE_CATEGORIES
    worst = fitting.estimate(arch, request).worst
    theory = {c.name: worst.component(c.name) for c in worst.components}
    rows = []
    for category in categories:
        if category == "parameters":
            rows.append(base.Row(model_type, run_name, category, measured.params, count_parameters(arch).total))
        elif category == "peak":
            rows.append(base.Row(model_type, run_name, category, measured.peak.bytes, worst.peak.bytes))
        else:
            rows.append(base.Row(model_type, run_name, category, measured.category_max.get(category, 0),
                                 theory.get(category, 0)))
    return base.RunResult(model_type, run_name, rows, measured.peak, worst.peak.phase, dict(worst.peak.per_category),
                          measured.seconds, [f"profile {arch.profile}"] + list(measured.notes))


def sweep() -> list[dict]:
    """Every causal-LM model type of this transformers: resolved by fit, and counted exactly?"""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from tutor.trace.arch_calibration import resolve_any_model
    from tutor.errors import UserError
    from tutor.theory.models import count_parameters

    rows = []
    folder = Path(tempfile.mkdtemp(prefix="fit-sweep-"))
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        row = {"model_type": model_type}
        try:
            hf_config = AutoConfig.for_model(model_type)
            text = hf_config.get_text_config()
            small = {}
            for key, value in (("hidden_size", 64), ("intermediate_size", 128), ("num_hidden_layers", 2),
                               ("num_attention_heads", 4), ("num_key_value_heads", 2), ("vocab_size", 256)):
                if hasattr(text, key):
                    small[key] = value
            if getattr(text, "first_k_dense_replace", 0) and "num_hidden_layers" in small:
                small["first_k_dense_replace"] = 1  # the default (3) exceeds the 2 layers traced here
            hf_config = AutoConfig.for_model(model_type, **small, pad_token_id=0, bos_token_id=1, eos_token_id=2)
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(hf_config)
            real = sum(p.numel() for p in model.parameters())
        except Exception as exc:  # noqa: BLE001 - transformers' own default config does not build: not fit's
            row.update(status="transformers cannot build it from a small default config", error=str(exc)[:120])
            rows.append(row)
            continue
        path = folder / f"{model_type}.json"
        path.write_text(json.dumps(hf_config.to_dict(), default=str))
        try:
            arch, _ = resolve_any_model(str(path))
            counted = count_parameters(arch).total
            row.update(status="exact" if counted == real else "count differs", profile=arch.profile,
                       real=real, counted=counted)
        except UserError as error:
            row.update(status="refused", error=str(error)[:160])
        except Exception as exc:  # noqa: BLE001 - a crash is a finding of this benchmark
            row.update(status="crashed", error=f"{type(exc).__name__}: {str(exc)[:140]}")
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", action="append", help="model type (repeatable; default: all)")
    parser.add_argument("--config", action="append", choices=sorted(base.CONFIGS), help="run (default: "
                        + ", ".join(DEFAULT_CONFIGS) + ")")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("TENSOR_TUTOR_DATA_DIR", tempfile.mkdtemp(prefix="fit-any-arch-"))
    if args.sweep:
        rows = sweep()
        if args.json:
            print(json.dumps({"sweep": rows}, indent=2))
        else:
            for row in rows:
                print(f"{row['model_type']:28s} {row['status']:58s} {row.get('profile', '')} {row.get('error', '')}")
            counts: dict[str, int] = {}
            for row in rows:
                counts[row["status"]] = counts.get(row["status"], 0) + 1
            print(counts)
        return 0
    archs = args.arch or [*CALIBRATED, *HAND]
    results, infos = [], {}
    for model_type in archs:
        for run_name in args.config or DEFAULT_CONFIGS:
            try:
                result, info = compare(model_type, run_name, args.batch, args.seq)
            except Exception as exc:  # noqa: BLE001 - one failing architecture must not hide the others
                print(f"{model_type}/{run_name}: FAILED {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
                continue
            results.append(result)
            infos[f"{model_type}/{run_name}"] = info
            if not args.json:
                for row in result.rows:
                    ratio = f"{row.ratio:.3f}" if row.ratio is not None else "-"
                    print(f"{model_type:12s} {run_name:10s} {row.category:12s} measured {row.measured:>13,} "
                          f"fit {row.theory:>13,} {ratio:>7s} {'ok' if row.within else 'OFF'} "
                          f"[{info['profile']}]", flush=True)
    within, total = base.summary(results)
    if args.json:
        report = base.results_json(results, "hf", args.batch, args.seq)
        report["profiles"] = infos
        print(json.dumps(report, indent=2))
    else:
        print(f"{within}/{total} categories within {float(base.TOLERANCE):.0%} ({within / max(total, 1):.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
