"""Does `tensor-tutor fit <config.json>` answer every decoder-only causal LM the installed transformers builds?

For each model type of transformers' causal-LM mapping (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) a small
config is made from the configuration class's own defaults (`small_config`: its leading layers and two
repeats of its pattern of layer kinds, at least 2 layers, a 256-token vocabulary, at most 8 experts),
written as config.json and given to the command line itself (`tensor-tutor fit config.json --device cpu
--seq 64 --json`, through tutor.cli.main, in this process). Types without a hand profile are answered by
the calibrated trace (tutor.trace.arch_calibration), so every one of them is traced here.

Each type ends as one of: "answered" (exit 0 and a JSON answer), "refused" (exit 2 and its one line
on stderr), "crashed" (anything else: a traceback is a bug of fit), or "skipped" (SKIPPED: not a
decoder-only language model, an extra dependency, or a class whose own defaults transformers cannot
run). KNOWN_REFUSED lists the types fit still refuses, each with the reason.

    python benchmarks/fit_every_causal_lm.py                       # every type, one line each and a count
    python benchmarks/fit_every_causal_lm.py --arch gemma3_text --arch gpt_neo
    python benchmarks/fit_every_causal_lm.py --write-configs DIR   # the small configs only
    python benchmarks/fit_every_causal_lm.py --configs DIR         # fit on configs written before (any tree:
                                                                   # PYTHONPATH=<another checkout> to compare)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parent.parent))

VOCAB = 256
# At most this many experts: a trace on fake tensors costs per operation, and MoE code loops over experts.
EXPERTS = {"num_experts": 8, "num_local_experts": 8, "n_routed_experts": 8, "moe_num_experts": 8,
           "num_experts_per_tok": 2, "num_experts_per_token": 2, "moe_topk": 2, "n_group": 1, "topk_group": 1,
           "num_expert_group": 1}
# Fields set where the class's own defaults describe no runnable language model, each with its reason.
OVERRIDES: dict[str, dict] = {
    # The default has no attention layer at all (attn_layer_indices None), and transformers' mask code needs one
    # (`get_mask_sizes` ... only LinearAttention layers); Bamba-9B (ibm-ai-platform/Bamba-9B, 32 layers) has three.
    "bamba": {"attn_layer_indices": [9, 18, 27]},
    # The default's layer_types are all linear attention (same failure); one attention layer in each 4.
    "granitemoehybrid": {"num_hidden_layers": 4, "layer_types": ["linear_attention"] * 3 + ["attention"]},
    # The default leaves num_experts_per_tok None (topk(k=None) fails) and its experts 1407 wide, which
    # torch's grouped matmul refuses (rows not 16-byte aligned); DeepSeek-V2-Lite routes 6 of 64, 1408 wide.
    "deepseek_v2": {"num_experts_per_tok": 6, "moe_intermediate_size": 1408},
    # ReformerModelWithLMHead refuses a config that is not a decoder, which the default is not.
    "reformer": {"is_decoder": True},
    # DbrxAttention reads rope_theta from attn_config, which the default's DbrxAttentionConfig lacks, and
    # clamps q, k, v to clip_qkv, None by default (clamp refuses no bounds); DBRX's own config: 500000 and 8.
    "dbrx": {"attn_config": {"rope_theta": 500000.0, "clip_qkv": 8}},
}
# Model types of the causal-LM mapping that are not decoder-only language models fit can be asked about with
# a config.json on this machine, each with its reason. Every other type must be answered or in KNOWN_REFUSED.
SKIPPED: dict[str, str] = {
    "gemma3n": "extra dependency: its vision tower (TimmWrapperModel) needs pillow, which is not installed",
    "musicgen": "text-to-music encoder-decoder: a T5 text encoder beside the audio-code decoder",
    "musicgen_melody": "text-to-music encoder-decoder: a T5 text encoder beside the audio-code decoder",
    "prophetnet": "encoder-decoder: its config has no decoder-only layer count (num_encoder_layers, "
                  "num_decoder_layers)",
    "xlnet": "a permutation language model, not decoder-only; its transformers code does not run in bf16",
    "xmod": "an encoder with per-language adapters: forward needs set_default_language() first",
    "gemma4_assistant": "transformers' default config of the class does not validate (hidden_size_per_layer_input)",
    "gemma4_unified_assistant": "a drafter that reads the KV cache of its main model (every layer KV-shared): "
                                "it does not run alone",
    "kolibri1_1": "transformers' default config of the class does not validate (kv_source_layers)",
    "dory": "transformers' default config of the class does not validate (n_input_layers + n_recurrent_layers "
            "+ n_output_layers against num_hidden_layers)",
    "cohere_compass_text": "transformers' default config of the class does not build ('full_attention')",
    "hunyuan_v1_dense": "transformers' default config of the class does not build (a None rope field)",
    "hunyuan_v1_moe": "transformers' default config of the class does not build (a None rope field)",
    "ministral": "transformers' default config of the class does not build (a None rope field)",
    "nemotron": "transformers' default config of the class does not build (a None size)",
    "lfm2_moe": "transformers' default config of the class does not build (a None list)",
    "qwen4_exp": "transformers' default config of the class does not build (None sizes)",
    "qwen4_exp_text": "transformers' default config of the class does not build (None sizes)",
    "dots1": "transformers' default config of the class does not build (empty() takes 1 positional argument)",
}
# Types fit refuses, with one line naming the architecture and the reason (a word of the reason here).
KNOWN_REFUSED: dict[str, str] = {}
# Types whose small config keeps the class's own depth: fields index its layers in a way the rebuild at another
# depth does not follow, so a config at fewer layers does not run (fit itself then traces the whole model).
OWN_DEPTH: dict[str, str] = {
    "inkling2_loop_text": "loop_layer_index_start/end index the looped layers (multiples of n_layers_per_attn_res_block)",
}


def causal_lm_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def small_config(model_type: str) -> dict:
    """The config.json of a small `model_type` model, as transformers writes it (to_dict): the class's own
    defaults (with OVERRIDES) at its leading layers and two repeats of its pattern of layer kinds (at
    least 2 layers; every kind is in it, and the pattern reads the same from it: tutor.trace.layer_count),
    a VOCAB-token vocabulary and at most EXPERTS experts.

    The widths stay the class's defaults: fit's calibration traces on fake tensors, which cost the same at
    any width, and the defaults are sizes the class's code accepts (a smaller hidden size alone breaks
    families whose head sizes are set apart: CodeGen's rotary_dim, the MLA ranks of DeepSeek-V2)."""
    from transformers import AutoConfig

    from tutor.trace.layer_count import class_view, layer_section, with_layers

    written, plan = class_view(AutoConfig.for_model(model_type, **OVERRIDES.get(model_type, {})).to_dict())
    if plan is not None and model_type not in OWN_DEPTH:
        written = with_layers(written, max(2, len(plan.lead) + 2 * plan.pattern_layers), plan)
    found = layer_section(written)
    section = found[0] if found is not None else written
    if isinstance(section.get("vocab_size"), int):
        section["vocab_size"] = VOCAB
    for number, key in enumerate(("pad_token_id", "bos_token_id", "eos_token_id")):
        if isinstance(section.get(key), int) and section[key] >= VOCAB:
            section[key] = number  # inside the small vocabulary (some classes require an int)
    default = AutoConfig.for_model(model_type, **{k: v for k, v in written.items() if k != "model_type"}).to_dict()
    for key, small in EXPERTS.items():
        value = section.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > small:
            section[key] = small
    try:
        return AutoConfig.for_model(model_type, **{k: v for k, v in written.items() if k != "model_type"}).to_dict()
    except Exception:  # noqa: BLE001 - a class whose expert counts are tied to others keeps its own
        return default


def run_fit(model_type: str, path: Path) -> dict:
    """`tensor-tutor fit <path> --device cpu --seq 64 --json` (tutor.cli.main, in this process): the status,
    the exit code, and the answer's profile or the refusal's lines."""
    from tutor.cli import main

    out, err = io.StringIO(), io.StringIO()
    code: object = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(["fit", str(path), "--device", "cpu", "--seq", "64", "--json"])
    except SystemExit as exit_:
        code = exit_.code
    except Exception as exc:  # noqa: BLE001 - a traceback is what this sweep looks for
        return {"model_type": model_type, "status": "crashed", "reason": f"{type(exc).__name__}: {exc}"[:300]}
    lines = [line for line in err.getvalue().splitlines() if line.strip() and not line.startswith("[transformers]")]
    if code in (0, None):
        answer = json.loads(out.getvalue())
        return {"model_type": model_type, "status": "answered", "exit_code": 0,
                "profile": answer["model"].get("profile")}
    status = "refused" if code == 2 and len(lines) == 1 and "Traceback" not in err.getvalue() else "crashed"
    return {"model_type": model_type, "status": status, "exit_code": code, "reason": " | ".join(lines)[:400]}


def write_configs(types: list[str], folder: Path) -> dict[str, str]:
    """Each type's small config as folder/<type>.json; {type: reason} for those it skips or cannot make."""
    folder.mkdir(parents=True, exist_ok=True)
    skipped = {}
    for model_type in types:
        if model_type in SKIPPED:
            skipped[model_type] = SKIPPED[model_type]
            continue
        try:
            config = small_config(model_type)
        except Exception as exc:  # noqa: BLE001 - transformers' own defaults do not build: listed, not fit's
            skipped[model_type] = f"no small config: {type(exc).__name__}: {exc}"[:200]
            continue
        (folder / f"{model_type}.json").write_text(json.dumps(config, default=str))
    return skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", action="append", help="model type (repeatable; default: every causal LM)")
    parser.add_argument("--configs", type=Path, help="run fit on the configs in this folder (<type>.json)")
    parser.add_argument("--write-configs", type=Path, help="write the small configs to this folder and stop")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("TENSOR_TUTOR_DATA_DIR", tempfile.mkdtemp(prefix="fit-every-lm-"))
    if args.write_configs:
        skipped = write_configs(args.arch or causal_lm_types(), args.write_configs)
        (args.write_configs / "skipped.json").write_text(json.dumps(skipped, indent=2))
        print(f"{len(list(args.write_configs.glob('*.json'))) - 1} configs, {len(skipped)} skipped")
        return 0
    folder = args.configs or Path(tempfile.mkdtemp(prefix="fit-every-lm-configs-"))
    skipped = (json.loads((folder / "skipped.json").read_text()) if args.configs
               else write_configs(args.arch or causal_lm_types(), folder))
    types = args.arch or sorted({p.stem for p in folder.glob("*.json") if p.stem != "skipped"} | set(skipped))
    rows = []
    for model_type in types:
        path = folder / f"{model_type}.json"
        row = ({"model_type": model_type, "status": "skipped", "reason": skipped.get(model_type, "no config")}
               if not path.exists() else run_fit(model_type, path))
        rows.append(row)
        if not args.json:
            print(f"{model_type:28s} {row['status']:9s} {row.get('profile') or row.get('reason', '')}", flush=True)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    if args.json:
        print(json.dumps({"rows": rows, "counts": counts}, indent=2))
    else:
        print(counts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
