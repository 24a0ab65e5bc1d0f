"""`tensor-tutor fit` against real transformers code: the verification benchmark.

Builds real transformers 5.x models from small configs (random weights, CPU) for nine
architectures and runs six configurations of each the way a user would:

    fp32-eager  fp32 model + AdamW, attn_implementation="eager"            (recipe fp32)
    fp32-sdpa   fp32 model + AdamW, attn_implementation="sdpa"             (recipe fp32)
    bf16        bf16 model + AdamW (bf16 states), sdpa                     (recipe bf16)
    amp         fp32 model + AdamW, forward under torch.autocast("cpu", bfloat16), sdpa  (recipe hf-amp)
    recompute   bf16, model.gradient_checkpointing_enable() (in transformers 5 a deprecated alias of
                activation_checkpointing_enable: torch.utils.checkpoint around every decoder layer with
                use_reentrant=False, and input embeddings made to require grad), sdpa
                                                                           (recipe bf16, recompute full)
    inference   bf16 prefill of the prompt, use_cache=True, logits_to_keep=1, under torch.no_grad, then the
                last-token logits cast to fp32, as generate() does          (mode inference, dtype bf16)

Training runs two steps shaped like a user's loop and measures the SECOND (steady state: the
optimizer states exist):

    loss = model(input_ids=ids, labels=ids).loss; loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)

How bytes are counted: by tutor.trace.memory_trace, the tracker `fit --trace` uses (this script
builds the models, runs them and sets them beside the theory; the measuring is that module's
`training_step`, `measure_training_step` and `measure_prefill`). A TorchDispatchMode sees every
tensor every aten op returns (forward, backward and optimizer step); each distinct storage is
counted once, at its full size, from the op that created it until its weakref says it was freed
(the method of torch's own torch.distributed._tools.mem_tracker.MemTracker; `--cross-check` runs
both on one model). Buffers inside a single kernel (never returned to Python) are not seen. Each
storage has the category it ends the step with, from its creation on:
    weights        the parameters' storages, plus casts of a parameter (autocast's bf16 weight copies)
    gradients      storages that end the backward pass as some parameter's .grad
    optimizer      the optimizer's state tensors (exp_avg, exp_avg_sq, step)
    kv_cache       (inference) the storages of the returned cache's keys and values
    buffers        the model's buffers (rotary inv_freq, a causal-mask table, ...), persistent or not
    optimizer_temporaries  anything else created during opt.step() / zero_grad()
    activations    everything else alive during forward and backward, including the token ids, the
                   loss, saved tensors and the backward pass's intermediate gradients
Each category's figure is its own maximum over the step; `peak` is the largest sum of all live
storages at one moment, with the phase and op where it happens. These are set beside
tutor.theory.fit.estimate for the matching FitRequest (optimizer adamw, gpu=False, impl hf unless
`--impl fused`), parameters beside count_parameters of the config as transformers writes it.

    python benchmarks/fit_vs_transformers.py                    # the full matrix (about 10 s on 2 cores)
    python benchmarks/fit_vs_transformers.py --arch llama --config bf16 --config inference --explain
    python benchmarks/fit_vs_transformers.py --batch 1 --seq 256 # another shape (default 2 x 128)
    python benchmarks/fit_vs_transformers.py --json > rows.json
    python benchmarks/fit_vs_transformers.py --impl fused       # the Korthikanti/Megatron figures
    python benchmarks/fit_vs_transformers.py --cross-check      # this tracker vs torch's MemTracker
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

if __package__ in (None, ""):  # run as a script: this checkout's tutor package, unless PYTHONPATH names another
    sys.path.append(str(Path(__file__).resolve().parent.parent))

TOLERANCE = Fraction(1, 10)
BATCH = 2
SEQ_LEN = 128
VOCAB = 1024

_COMMON = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=512)
# Small configs in each model type's own keys. Gemma-2 has a sliding layer (its even layers) with a
# window shorter than SEQ_LEN; DeepSeek-V3 has one dense and one MoE layer, MLA with a V head dim
# unlike Q/K's (so SDPA takes its math path, as at full size).
ARCHITECTURES: dict[str, dict] = {
    "llama": dict(_COMMON),
    "qwen2": dict(_COMMON),
    "mistral": dict(_COMMON),
    "gemma": dict(_COMMON, num_key_value_heads=1, head_dim=32),
    "gemma2": dict(_COMMON, head_dim=32, sliding_window=64),
    "gpt2": dict(n_embd=128, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=512,
                 bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1),
    "mixtral": dict(_COMMON, num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(_COMMON, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128,
                      shared_expert_intermediate_size=256),
    "deepseek_v3": dict(_COMMON, num_key_value_heads=4, q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=32,
                        qk_rope_head_dim=16, v_head_dim=32, n_routed_experts=4, num_experts_per_tok=2,
                        n_shared_experts=1, moe_intermediate_size=64, first_k_dense_replace=1, n_group=1,
                        topk_group=1),
}


@dataclass(frozen=True)
class RunConfig:
    """One way of running a model, and the FitRequest fields that describe it."""

    name: str
    mode: str                 # "train" | "inference"
    recipe: str               # FitRequest.recipe (training)
    attention: str            # attn_implementation and FitRequest.attention
    bf16_model: bool          # built in bf16, as from_pretrained(dtype=torch.bfloat16) builds it
    autocast: bool = False    # forward under torch.autocast("cpu", dtype=torch.bfloat16)
    recompute: str = "none"   # "full": model.gradient_checkpointing_enable()


CONFIGS: dict[str, RunConfig] = {c.name: c for c in (
    RunConfig("fp32-eager", "train", "fp32", "eager", bf16_model=False),
    RunConfig("fp32-sdpa", "train", "fp32", "sdpa", bf16_model=False),
    RunConfig("bf16", "train", "bf16", "sdpa", bf16_model=True),
    RunConfig("amp", "train", "hf-amp", "sdpa", bf16_model=False, autocast=True),
    RunConfig("recompute", "train", "bf16", "sdpa", bf16_model=True, recompute="full"),
    RunConfig("inference", "inference", "bf16", "sdpa", bf16_model=True),
)}

TRAIN_CATEGORIES = ("parameters", "weights", "buffers", "gradients", "optimizer", "activations", "peak")
INFERENCE_CATEGORIES = ("parameters", "weights", "buffers", "kv_cache", "activations", "peak")


# ---------------------------------------------------------------------------------------------
# What was measured (by tutor.trace.memory_trace), in fit's category names.

# memory_trace's categories as fit names them (fit calls the optimizer states "optimizer").
FIT_NAMES = {"optimizer_states": "optimizer"}


def _fit_names(per_category: dict[str, int]) -> dict[str, int]:
    return {FIT_NAMES.get(name, name): n for name, n in per_category.items() if n}


@dataclass
class Moment:
    """The live bytes at one moment of the timeline, per category."""

    bytes: int
    phase: str
    op_index: int
    op: str
    per_category: dict[str, int]
    storages: tuple[tuple[str, str, str, int], ...] = ()  # (category, phase made, op that made it, bytes)


def moment(peak) -> Moment:
    """A memory_trace TracePeak in fit's category names."""
    return Moment(peak.bytes, peak.phase, peak.op_index, peak.op, _fit_names(peak.per_category_bytes),
                  tuple((FIT_NAMES.get(category, category), *rest) for category, *rest in peak.storages))


@dataclass
class Measurement:
    """What one run really held: each category's own maximum, and the peak moment."""

    params: int
    category_max: dict[str, int]
    peak: Moment
    seconds: float
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# Running the models.


def build_model(model_type: str, run: RunConfig):
    """A transformers model from this benchmark's small config, with random weights. A 16-bit model is built as
    from_pretrained(dtype=torch.bfloat16) builds it: parameters in bf16, the rotary buffers kept in fp32
    (model.to(bfloat16) would cast those too, which no loading path does)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = {"dtype": torch.bfloat16} if run.bf16_model else {}
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **ARCHITECTURES[model_type])
    try:
        model = AutoModelForCausalLM.from_config(config, attn_implementation=run.attention, **dtype)
    except ValueError:  # e.g. Gemma-2 has no SDPA path in transformers 5: it runs its default (eager)
        torch.manual_seed(0)
        config = AutoConfig.for_model(model_type, **ARCHITECTURES[model_type])  # the failed try set sdpa on it
        model = AutoModelForCausalLM.from_config(config, **dtype)
    return config, model


def attention_used(model) -> str:
    """The attn_implementation the model really runs (transformers may refuse the one asked for)."""
    return model.config._attn_implementation


def _parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields tied tensors once


def measure_training(model, run: RunConfig, batch: int = BATCH, seq_len: int = SEQ_LEN) -> Measurement:
    """Two training steps of a user's loop; the second is measured by memory_trace's tracker."""
    import torch

    from tutor.trace.memory_trace import measure_training_step, token_ids, training_step

    started = time.perf_counter()
    model.train()
    if run.recompute == "full":
        model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = token_ids(model.config.vocab_size, batch, seq_len, seed=1)
    autocast = torch.bfloat16 if run.autocast else None
    training_step(model, optimizer, ids, labels=ids, autocast_dtype=autocast)
    measured = measure_training_step(model, optimizer, ids, labels=ids, autocast_dtype=autocast)
    return Measurement(_parameter_count(model), _fit_names(measured.max_per_category), moment(measured.peak),
                       time.perf_counter() - started, list(measured.notes))


def measure_inference(model, batch: int = BATCH, seq_len: int = SEQ_LEN) -> Measurement:
    """One prefill of the prompt, as generate() runs it, measured by memory_trace's tracker."""
    from tutor.trace.memory_trace import measure_prefill, token_ids

    started = time.perf_counter()
    measured = measure_prefill(model, token_ids(model.config.vocab_size, batch, seq_len, seed=1))
    return Measurement(_parameter_count(model), _fit_names(measured.max_per_category), moment(measured.peak),
                       time.perf_counter() - started, list(measured.notes))


# ---------------------------------------------------------------------------------------------
# The theory for the same run.


def architecture_for(model_type: str, hf_config):
    """tutor.theory's Architecture of the config as transformers writes it (to_dict()); if the
    theory rejects that, of the keys this benchmark passed (and say so)."""
    from tutor.errors import UserError
    from tutor.theory.models import architecture_from_config

    try:
        return architecture_from_config(hf_config.to_dict()), None
    except UserError as error:
        arch = architecture_from_config({"model_type": model_type, **ARCHITECTURES[model_type]})
        return arch, f"config as transformers writes it rejected ({error}); used the keys passed instead"


def fit_request(run: RunConfig, impl: str, batch: int = BATCH, seq_len: int = SEQ_LEN, attention: str | None = None):
    """The FitRequest that describes `run` (CPU rules: gpu=False); attention: the one the model
    really ran, when transformers did not take run.attention."""
    from tutor.theory import fit as fitting
    from tutor.theory.activations import ATTENTION_KINDS

    fields = {f.name for f in dataclasses.fields(fitting.FitRequest)}
    attention = attention or run.attention
    attention = attention if attention in ATTENTION_KINDS else "flash"  # a theory without sdpa
    request = dict(mode=run.mode, batch=batch, seq_len=seq_len, attention=attention, gpu=False)
    if run.mode == "train":
        request.update(recipe=run.recipe, optimizer="adamw", recompute=run.recompute)
    else:
        request.update(dtype="bf16")
    if "impl" in fields:
        request["impl"] = impl
    return fitting.FitRequest(**request)


@dataclass
class Theory:
    params: int
    categories: dict[str, int]
    peak_bytes: int
    peak_phase: str
    peak_per_category: dict[str, int]


def theory_for(arch, run: RunConfig, impl: str, batch: int = BATCH, seq_len: int = SEQ_LEN,
               attention: str | None = None) -> Theory:
    from tutor.theory import fit as fitting
    from tutor.theory.models import count_parameters

    estimate = fitting.estimate(arch, fit_request(run, impl, batch, seq_len, attention))
    worst = estimate.worst
    categories = {c.name: worst.component(c.name) for c in worst.components}
    peak = getattr(worst, "peak", None)
    if peak is None:  # a theory without the peak timeline: every category at its maximum at once
        per_category = {name: n for name, n in categories.items() if name != "overhead"}
        return Theory(count_parameters(arch).total, categories, sum(per_category.values()), "(sum of components)",
                      per_category)
    return Theory(count_parameters(arch).total, categories, peak.bytes, peak.phase, dict(peak.per_category))


# ---------------------------------------------------------------------------------------------
# Comparison.


@dataclass
class Row:
    arch: str
    config: str
    category: str
    measured: int
    theory: int

    @property
    def ratio(self) -> float | None:
        return None if self.measured == 0 else self.theory / self.measured

    @property
    def within(self) -> bool:
        if self.measured == 0:
            return self.theory == 0
        return abs(Fraction(self.theory - self.measured, self.measured)) <= TOLERANCE


@dataclass
class RunResult:
    arch: str
    config: str
    rows: list[Row]
    measured_peak: Moment
    theory_peak_phase: str
    theory_peak_per_category: dict[str, int]
    seconds: float
    notes: list[str]


def compare(model_type: str, run_name: str, impl: str = "hf", batch: int = BATCH, seq_len: int = SEQ_LEN) -> RunResult:
    """Run one architecture in one configuration for real and set it beside the theory."""
    import torch

    torch.set_num_threads(1)
    run = CONFIGS[run_name]
    hf_config, model = build_model(model_type, run)
    arch, arch_note = architecture_for(model_type, hf_config)
    if run.mode == "train":
        measured = measure_training(model, run, batch, seq_len)
        categories = TRAIN_CATEGORIES
    else:
        measured = measure_inference(model, batch, seq_len)
        categories = INFERENCE_CATEGORIES
    attention = attention_used(model)
    theory = theory_for(arch, run, impl, batch, seq_len, attention)
    if attention != run.attention:
        measured.notes.insert(0, f"transformers runs {type(model).__name__} with {attention} attention, "
                                 f"not {run.attention}; the theory is asked for {attention}")
    rows = []
    for category in categories:
        if category == "parameters":
            rows.append(Row(model_type, run_name, category, measured.params, theory.params))
        elif category == "peak":
            rows.append(Row(model_type, run_name, category, measured.peak.bytes, theory.peak_bytes))
        else:
            rows.append(Row(model_type, run_name, category, measured.category_max.get(category, 0),
                            theory.categories.get(category, 0)))
    notes = ([arch_note] if arch_note else []) + measured.notes
    return RunResult(model_type, run_name, rows, measured.peak, theory.peak_phase, theory.peak_per_category,
                     measured.seconds, notes)


def summary(results: list[RunResult]) -> tuple[int, int]:
    rows = [row for result in results for row in result.rows]
    return sum(row.within for row in rows), len(rows)


def summary_line(results: list[RunResult]) -> str:
    within, total = summary(results)
    return f"{within} of {total} categories within 10% ({100 * within / max(total, 1):.0f}%)"


def phase_line(results: list[RunResult]) -> str:
    same = sum(r.measured_peak.phase == r.theory_peak_phase for r in results)
    return f"peak phase: theory names the measured phase in {same} of {len(results)} runs"


# ---------------------------------------------------------------------------------------------
# Output.


def _kib(n: int) -> str:
    return f"{n / 1024:,.1f}"


def _shares(per_category: dict[str, int]) -> str:
    total = sum(per_category.values()) or 1
    return ", ".join(f"{name} {n / total:.0%}" for name, n in sorted(per_category.items(), key=lambda kv: -kv[1]) if n)


def explain_peak(peak: Moment, limit: int = 12) -> list[str]:
    """The storages alive at the peak that are not model states, grouped by the op that made them."""
    groups: dict[tuple[str, str, str], list[int]] = {}
    for category, phase, op, n_bytes in peak.storages:
        if category not in ("weights", "gradients", "optimizer", "buffers"):
            groups.setdefault((category, phase, op), []).append(n_bytes)
    ranked = sorted(groups.items(), key=lambda item: -sum(item[1]))
    lines = [f"{category:<12} {sum(sizes) / 1024:>10,.1f} KiB  {len(sizes):>3} x  {op} ({phase})"
             for (category, phase, op), sizes in ranked[:limit]]
    if len(ranked) > limit:
        rest = sum(sum(sizes) for _, sizes in ranked[limit:])
        lines.append(f"{'(the rest)':<12} {rest / 1024:>10,.1f} KiB")
    return lines


def render_table(results: list[RunResult], explain: bool = False, batch: int = BATCH, seq_len: int = SEQ_LEN) -> str:
    """One side-by-side table per architecture (KiB; parameters as counts); explain: what is alive
    at each measured peak besides the model states, by the op that made it."""
    lines = []
    for arch in dict.fromkeys(r.arch for r in results):
        lines.append(f"\n== {arch} (batch {batch} x {seq_len} tokens; KiB, parameters as counts) ==")
        lines.append(f"{'config':<11} {'category':<12} {'measured':>12} {'theory':>12} {'theory/meas':>11}  flag")
        for result in (r for r in results if r.arch == arch):
            for row in result.rows:
                unit = (lambda n: f"{n:,}") if row.category == "parameters" else _kib
                ratio = "-" if row.ratio is None else f"{row.ratio:.3f}"
                flag = "" if row.within else "OFF >10%"
                lines.append(f"{result.config:<11} {row.category:<12} {unit(row.measured):>12} "
                             f"{unit(row.theory):>12} {ratio:>11}  {flag}")
            peak = result.measured_peak
            lines.append(f"{'':<11} peak phase: measured {peak.phase} (op {peak.op_index}, {peak.op}: "
                         f"{_shares(peak.per_category)}); theory {result.theory_peak_phase} "
                         f"({_shares(result.theory_peak_per_category)})")
            for note in result.notes:
                lines.append(f"{'':<11} note: {note}")
            if explain:
                lines += [f"{'':<11} at the peak: {line}" for line in explain_peak(peak)]
    return "\n".join(lines)


def results_json(results: list[RunResult], impl: str, batch: int = BATCH, seq_len: int = SEQ_LEN) -> dict:
    within, total = summary(results)
    return {
        "impl": impl, "batch": batch, "seq_len": seq_len, "tolerance": float(TOLERANCE),
        "rows": [{"arch": row.arch, "config": row.config, "category": row.category, "measured": row.measured,
                  "theory": row.theory, "ratio": row.ratio, "within": row.within}
                 for result in results for row in result.rows],
        "runs": [{"arch": r.arch, "config": r.config, "seconds": round(r.seconds, 3),
                  "measured_peak": {"bytes": r.measured_peak.bytes, "phase": r.measured_peak.phase,
                                    "op_index": r.measured_peak.op_index, "op": r.measured_peak.op,
                                    "per_category_bytes": r.measured_peak.per_category},
                  "theory_peak": {"phase": r.theory_peak_phase, "per_category_bytes": r.theory_peak_per_category},
                  "notes": r.notes} for r in results],
        "summary": {"within": within, "total": total, "share": within / max(total, 1),
                    "peak_phase_agrees": sum(r.measured_peak.phase == r.theory_peak_phase for r in results),
                    "runs": len(results)},
    }


def cross_check(model_type: str = "llama", run_name: str = "bf16") -> str:
    """This tracker's peak beside torch's MemTracker's for the same measured step."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from tutor.trace.memory_trace import token_ids

    torch.set_num_threads(1)
    run = CONFIGS[run_name]
    _, model = build_model(model_type, run)
    ours = measure_training(model, run)
    _, model = build_model(model_type, run)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = token_ids(model.config.vocab_size, BATCH, SEQ_LEN, seed=1)
    tracker = MemTracker()
    if run.recompute == "full":
        model.gradient_checkpointing_enable()
    tracker.track_external(model, optimizer, ids)
    with tracker:
        for step in range(2):
            if step == 1:
                tracker.reset_mod_stats()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=run.autocast):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del loss
    theirs = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    total = theirs.pop("Total")
    breakdown = ", ".join(f"{str(k).split('.')[-1]} {_kib(v)}" for k, v in theirs.items() if v)
    return (f"cross-check {model_type}/{run_name}: this tracker's peak {_kib(ours.peak.bytes)} KiB "
            f"({_shares(ours.peak.per_category)}); MemTracker's peak {_kib(total)} KiB ({breakdown} KiB); "
            f"ratio {total / ours.peak.bytes:.4f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", action="append", choices=sorted(ARCHITECTURES),
                        help="architecture (repeatable; default: all nine)")
    parser.add_argument("--config", action="append", choices=list(CONFIGS),
                        help="configuration (repeatable; default: all six)")
    parser.add_argument("--impl", choices=("hf", "fused"), default="hf",
                        help="the theory's implementation profile (fused: Korthikanti/Megatron figures)")
    parser.add_argument("--batch", type=int, default=BATCH, help=f"sequences per step (default {BATCH})")
    parser.add_argument("--seq", type=int, default=SEQ_LEN,
                        help=f"tokens per sequence (default {SEQ_LEN}; keep it above Gemma-2's window of 64)")
    parser.add_argument("--json", action="store_true", help="machine-readable rows on stdout")
    parser.add_argument("--explain", action="store_true",
                        help="list what is alive at each measured peak besides the model states, by op")
    parser.add_argument("--cross-check", action="store_true",
                        help="compare this tracker's peak with torch's MemTracker's (default llama/bf16; "
                             "--arch/--config pick others), then exit")
    options = parser.parse_args(argv)
    if options.batch < 1 or not 1 <= options.seq <= _COMMON["max_position_embeddings"]:
        parser.error(f"--batch must be >= 1 and --seq between 1 and {_COMMON['max_position_embeddings']}")
    import logging
    import warnings

    import torch
    import transformers

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*gradient_checkpointing_enable.*deprecated", category=FutureWarning)
    transformers.logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    if options.cross_check:
        for arch in options.arch or ["llama"]:
            for config in options.config or ["bf16"]:
                if CONFIGS[config].mode != "train":
                    parser.error("--cross-check compares training steps: pick a training --config")
                print(cross_check(arch, config))
        return 0
    archs = options.arch or list(ARCHITECTURES)
    configs = options.config or list(CONFIGS)
    results = []
    started = time.perf_counter()
    for arch in archs:
        for config in configs:
            print(f"[{time.perf_counter() - started:6.1f}s] {arch} / {config} ...", file=sys.stderr, flush=True)
            results.append(compare(arch, config, impl=options.impl, batch=options.batch, seq_len=options.seq))
    if options.json:
        print(json.dumps(results_json(results, options.impl, options.batch, options.seq), indent=2))
    else:
        print(f"fit (impl {options.impl}) vs transformers {transformers.__version__}, torch {torch.__version__}, "
              f"CPU, {math.prod((options.batch, options.seq)):,} tokens per step")
        print(render_table(results, explain=options.explain, batch=options.batch, seq_len=options.seq))
        print(f"\n{phase_line(results)}")
        print(f"{summary_line(results)}  [{time.perf_counter() - started:.0f} s]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
