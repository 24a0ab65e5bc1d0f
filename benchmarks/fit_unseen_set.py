"""`tensor-tutor fit` against real transformers runs, on every causal-LM type at shapes drawn afresh.

benchmarks/fit_any_architecture.py compares fit with real steps on a fixed list of model types in
hand-written small configs. This one takes them from the installed transformers itself: for each type of
its causal-LM mapping (or --arch), the small config of benchmarks/fit_every_causal_lm.py (the class's
own defaults, its leading layers and two repeats of its pattern of layer kinds, a small vocabulary, at
most 8 experts) made narrow enough to run for real on a CPU (`narrow_config`: every width key the
config has, halved until the model has at most MAX_PARAMETERS parameters and one forward runs), then
run the way a user runs it (fit_vs_transformers: two training steps, the second measured; or a
prefill), every storage tracked by tutor.trace.memory_trace, beside fit's answer for the same request.

The shape is drawn from --seed (batch 1-3, 80-320 tokens), so a run is not tuned on the shapes the
calibration traces. Each row: measured, fit and their ratio; the last line counts the categories within
10%, the bar fit is held to. Types whose small config does not run for real are listed with the reason.

    python benchmarks/fit_unseen_set.py --arch jamba --arch olmo3            # bf16, recompute, inference
    python benchmarks/fit_unseen_set.py --config amp --config fp32-eager --seed 7
    python benchmarks/fit_unseen_set.py --all --json > unseen.json          # every type (long: hours on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parent.parent))
    sys.path.append(str(Path(__file__).resolve().parent))

import fit_any_architecture as beside  # noqa: E402  (a real run beside fit's answer)
import fit_every_causal_lm as every  # noqa: E402  (the small configs)
import fit_vs_transformers as base  # noqa: E402  (the measuring and the comparison rows)

MAX_PARAMETERS = 20_000_000
DEFAULT_CONFIGS = ("bf16", "recompute", "inference")
# Width keys and the floor each is halved down to: sizes the classes' code accepts when they shrink
# together (heads x head_dim = hidden for the classes that derive one from the others).
WIDTHS = {
    "hidden_size": 128, "d_model": 128, "n_embd": 128, "dim": 128,
    "intermediate_size": 256, "ffn_hidden_size": 256, "n_inner": 256, "ffn_dim": 256, "d_ff": 256,
    "moe_intermediate_size": 64, "shared_expert_intermediate_size": 128, "expert_intermediate_size": 64,
    "mlp_hidden_size": 256, "hidden_size_per_layer_input": 32,
    "num_attention_heads": 4, "n_head": 4, "num_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32,
    "mamba_n_heads": 4, "mamba_d_head": 32, "mamba_d_state": 16, "ssm_state_size": 16, "state_size": 16,
    "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
    "kv_lora_rank": 32, "q_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
}


def narrow_config(model_type: str) -> tuple[dict | None, str]:
    """(config.json of a small runnable `model_type`, how it was made) or (None, why not): fit_every_causal_lm's
    small config, its widths halved together (WIDTHS, never below their floors) until the model has at most
    MAX_PARAMETERS parameters and a forward of 16 tokens runs on the CPU."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tutor.trace.layer_count import layer_section

    if model_type in every.SKIPPED:
        return None, every.SKIPPED[model_type]
    try:
        config = every.small_config(model_type)
    except Exception as exc:  # noqa: BLE001 - transformers' own defaults do not build
        return None, f"no small config: {type(exc).__name__}: {exc}"[:160]
    last = "too large"
    for halvings, proportional in [(h, False) for h in range(7)] + [(h, True) for h in range(1, 7)]:
        trial = json.loads(json.dumps(config))
        found = layer_section(trial)
        section = found[0] if found is not None else trial
        for key, floor in WIDTHS.items():
            value = section.get(key)
            if not isinstance(value, int) or isinstance(value, bool):
                continue
            if proportional:  # every count halved alike, per-head sizes kept: ratios the class validates hold
                if not key.endswith(("head_dim", "d_head", "_state", "state_size", "lora_rank")):
                    section[key] = max(1, value >> halvings)
            elif value > floor:
                section[key] = max(floor, value >> halvings)
        try:
            fields = {k: v for k, v in trial.items() if k != "model_type"}
            hf_config = AutoConfig.for_model(model_type, **fields)
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(hf_config)
            size = sum(p.numel() for p in model.parameters())
            if size > MAX_PARAMETERS:
                last = f"{size:,} parameters at {halvings} halvings"
                continue
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **fields))
            vocab = hf_config.get_text_config().vocab_size
            with torch.no_grad():
                model(input_ids=torch.randint(3, min(vocab, 200), (1, 16)))
            return AutoConfig.for_model(model_type, **fields).to_dict(), (f"{size:,} parameters, widths / 2^{halvings}"
                                                                + (" in proportion" if proportional else ""))
        except Exception as exc:  # noqa: BLE001 - this width does not run: try a narrower one
            last = f"{type(exc).__name__}: {exc}"[:160]
    return None, f"no runnable small config ({last})"


def compare(model_type: str, config: dict, run_name: str, batch: int, seq_len: int) -> base.RunResult:
    """One real run of `config` (fit_vs_transformers' measuring) beside fit's answer for the same request,
    from the architecture `tensor-tutor fit config.json` resolves."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tutor.trace.arch_calibration import architecture_of, calibrated_for
    from tutor.files.models import ModelConfig

    torch.set_num_threads(1)
    run = base.CONFIGS[run_name]
    fields = {k: v for k, v in config.items() if k != "model_type"}
    dtype = {"dtype": torch.bfloat16} if run.bf16_model else {}
    torch.manual_seed(0)
    try:
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **fields),
                                                 attn_implementation=run.attention, **dtype)
    except ValueError:  # no such attention path: transformers runs its default
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **fields), **dtype)
    if run.mode == "train":
        model.config.use_cache = False  # as transformers' Trainer runs it
    arch = architecture_of(ModelConfig(config=config, name=model_type, source="benchmark"))
    request = base.fit_request(run, "hf", batch, seq_len, base.attention_used(model))
    arch = calibrated_for(arch, request)
    return beside.beside_fit(model_type, run_name, model, arch, request, batch, seq_len)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", action="append", help="model type (repeatable)")
    parser.add_argument("--all", action="store_true", help="every causal-LM type of the installed transformers")
    parser.add_argument("--config", action="append", choices=sorted(base.CONFIGS),
                        help="run (default: " + ", ".join(DEFAULT_CONFIGS) + ")")
    parser.add_argument("--seed", type=int, default=int(time.time()) % 10_000, help="draws the shape")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not args.arch and not args.all:
        parser.error("name --arch TYPE (repeatable) or --all")
    os.environ.setdefault("TENSOR_TUTOR_DATA_DIR", tempfile.mkdtemp(prefix="fit-unseen-"))
    draw = random.Random(args.seed)
    batch, seq_len = draw.randint(1, 3), draw.randrange(80, 321, 8)
    types = args.arch or every.causal_lm_types()
    results, refused, unrunnable = [], {}, {}
    from tutor.errors import UserError

    for model_type in types:
        config, how = narrow_config(model_type)
        if config is None:
            unrunnable[model_type] = how
            if not args.json:
                print(f"{model_type:24s} not run: {how}", flush=True)
            continue
        for run_name in args.config or DEFAULT_CONFIGS:
            try:
                result = compare(model_type, config, run_name, batch, seq_len)
            except UserError as error:
                refused[f"{model_type}/{run_name}"] = str(error)
                if not args.json:
                    print(f"{model_type:24s} {run_name:10s} REFUSED {error}", flush=True)
                continue
            except Exception as exc:  # noqa: BLE001 - the real run of this small config failed: not fit's
                unrunnable[f"{model_type}/{run_name}"] = f"{type(exc).__name__}: {exc}"[:200]
                if not args.json:
                    print(f"{model_type:24s} {run_name:10s} real run failed: {str(exc)[:120]}", flush=True)
                continue
            results.append(result)
            if not args.json:
                for row in result.rows:
                    ratio = f"{row.ratio:.3f}" if row.ratio is not None else "-"
                    print(f"{model_type:24s} {run_name:10s} {row.category:12s} measured {row.measured:>13,} "
                          f"fit {row.theory:>13,} {ratio:>7s} {'ok' if row.within else 'OFF'}", flush=True)
    within, total = base.summary(results)
    if args.json:
        report = base.results_json(results, "hf", batch, seq_len)
        report.update(seed=args.seed, refused=refused, not_run=unrunnable)
        print(json.dumps(report, indent=2))
    else:
        print(f"shape {batch} x {seq_len} (seed {args.seed}); {len(refused)} refused, {len(unrunnable)} not run")
        print(f"{within}/{total} categories within {float(base.TOLERANCE):.0%} ({within / max(total, 1):.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
