"""A fit request traced: the real transformers model, at full size, on fake tensors (`fit --trace`).

The fit request becomes the setup a user would run with transformers on one device (the recipe's
dtype and autocast, the attention implementation, full recompute as gradient checkpointing); one
training step or prefill runs on fake tensors under tutor.trace.memory_trace, and the traced
categories and peak are compared with the formula's (tutor.commands.fit_trace shows them). Needs the optional extra tensor-tutor[trace];
torch and transformers are imported only when --trace is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tutor.errors import UserError
from tutor.theory.fit import Attention, Mode, Recipe, Recompute

if TYPE_CHECKING:  # at run time memory_trace is imported only when --trace is given
    from tutor.trace.memory_trace import MemoryTrace, TraceSetup

TRAIN_RECIPES = {Recipe.FP32: ("fp32", False), Recipe.BF16: ("bf16", False), Recipe.HF_AMP: ("fp32", True)}
INFERENCE_DTYPES = ("fp32", "bf16", "fp16")
ONE_DEVICE = "--trace traces one device without parallelism (dp, tp, pp, ep 1, ZeRO 0, no --sp)"
MIXED_IS_NOT_TRACED = (
    "--trace cannot run --recipe mixed (fit's default for training): 16-bit weights plus an fp32 master copy, as "
    "DeepSpeed and Megatron keep them, which transformers does not build; transformers' Trainer with bf16=True runs "
    "fp32 weights under autocast: trace that with --recipe hf-amp, or pure bf16 with --recipe bf16")
# The traced categories beside fit's components (fit names the optimizer states "optimizer").
ROWS = (("weights", "weights"), ("buffers", "buffers"), ("gradients", "gradients"), ("optimizer_states", "optimizer"),
        ("optimizer_temporaries", "optimizer_temporaries"), ("activations", "activations"),
        ("kv_cache", "kv_cache"))
LABELS = {"optimizer_states": "opt. states", "optimizer_temporaries": "opt. temps", "kv_cache": "KV cache"}


@dataclass(frozen=True)
class TracedFit:
    """A traced step for a fit request: the trace, the device the answer is for, and what to know."""

    trace: MemoryTrace
    target_device: str             # "cuda" (a GPU answer) or "cpu"
    notes: tuple[str, ...] = field(default=())


def load_model_config(model: str | None) -> dict:
    """The config.json dict of a preset, a config.json path or a model folder (as `fit` resolves it)."""
    from tutor.files.models import read_model_config

    if not model or not isinstance(model, str):
        raise UserError("--trace needs a model: a preset, a config.json or a model folder (not --params)")
    return read_model_config(model).config  # the same reading, and one-line messages, as `fit`


def trace_setup(request) -> tuple[TraceSetup, tuple[str, ...]]:
    """The transformers setup that runs `request` on one device, and notes on what differs; UserError
    (one line) for what --trace cannot run."""
    from tutor.trace.memory_trace import OPTIMIZERS, TraceSetup

    layout = {"dp": request.dp, "tp": request.tp, "pp": request.pp, "ep": request.ep, "zero": request.zero}
    parallel = [f"{name} {value}" for name, value in layout.items() if value != (0 if name == "zero" else 1)]
    if request.sequence_parallel:
        parallel.append("--sp")
    if parallel:
        raise UserError(f"{ONE_DEVICE}; got {', '.join(parallel)}")
    notes: list[str] = []
    attention = getattr(request, "attention", "sdpa")
    if attention == Attention.FLASH:
        attention = Attention.SDPA.value
        notes.append("flash_attention_2 needs a CUDA GPU and the flash-attn package: traced SDPA instead")
    if request.mode == Mode.TRAIN:
        if request.recipe == Recipe.MIXED:
            raise UserError(MIXED_IS_NOT_TRACED)
        if request.recipe not in TRAIN_RECIPES:
            raise UserError(f"--trace builds transformers' own training setups: --recipe {', '.join(TRAIN_RECIPES)}; "
                            f"--recipe {request.recipe} is not one of them")
        if request.optimizer not in OPTIMIZERS:
            raise UserError(f"--trace runs the torch optimizers {', '.join(OPTIMIZERS)}; got {request.optimizer!r}")
        if request.recompute == Recompute.SELECTIVE:
            raise UserError("transformers has no selective recompute: use --recompute none or full with --trace")
        dtype, autocast = TRAIN_RECIPES[request.recipe]
        recompute = request.recompute == Recompute.FULL
    else:
        if request.dtype not in INFERENCE_DTYPES:
            raise UserError(f"--trace runs unquantized weights ({', '.join(INFERENCE_DTYPES)}); "
                            f"got --dtype {request.dtype}")
        if request.kv_dtype not in (None, request.dtype):
            raise UserError(f"--trace keeps the KV cache in the weights' dtype ({request.dtype}); "
                            f"drop --kv-dtype {request.kv_dtype}")
        dtype, autocast, recompute = request.dtype, False, False
    # A GPU runs torch's optimizers multi-tensor (foreach) by default; a CPU runs them one tensor at a time.
    foreach = True if request.gpu and request.mode == Mode.TRAIN else None
    setup = TraceSetup(mode=request.mode, dtype=dtype, autocast=autocast, recompute=recompute, attention=attention,
                       optimizer=request.optimizer,
                       batch=request.batch, seq_len=request.seq_len, foreach=foreach)
    return setup, tuple(notes)


MAX_TRACED_LAYERS = 512
"""The most decoder layers --trace builds: the deepest published LLMs have under 200 (tutor.theory.checks
MAX_LAYERS), and the real model is built module by module, so a hand-made 10,000-layer config would run
for hours before its first op."""


def check_traceable_layers(layers: int) -> None:
    """UserError (one line) for a model too deep to build and trace (MAX_TRACED_LAYERS)."""
    if layers > MAX_TRACED_LAYERS:
        raise UserError(f"--trace builds at most {MAX_TRACED_LAYERS:,} layers (published models have under 200); "
                        f"this config has {layers:,}: drop --trace for the formula's answer")


def traced_fit(model_arg: str | None, request, config: dict | None = None, layers: int | None = None) -> TracedFit:
    """Trace one step of `model_arg` (a preset, config.json or folder) as `request` describes it; `config`
    is its config.json when already read, `layers` its decoder layers when known (checked first)."""
    from tutor.trace.memory_trace import trace_step

    if layers is not None:
        check_traceable_layers(layers)
    if config is None:
        config = load_model_config(model_arg)
    setup, notes = trace_setup(request)
    trace = trace_step(config, setup)
    target = "cuda" if request.gpu else "cpu"
    if target == "cuda" and trace.device_traced != "cuda":
        notes += ("traced on fake CPU tensors (autograd on fake CUDA tensors aborts a CPU-only torch, so --trace "
                  "always traces CPU tensors): the optimizer runs foreach as torch does on CUDA, but SDPA's kernel "
                  "choice and autocast's op lists follow the CPU's rules",)
    return TracedFit(trace=trace, target_device=target, notes=notes + tuple(trace.notes))


def _formula_peak(estimate) -> tuple[int, str, dict[str, int], str]:
    """(bytes, phase, per category, formula) of fit's peak; the sum of categories where fit has no peak."""
    stage = estimate.worst
    peak = getattr(stage, "peak", None)
    if peak is not None:
        return peak.bytes, peak.phase, dict(peak.per_category), peak.formula
    per = {c.name: c.bytes for c in stage.components if c.name != "overhead"}
    return sum(per.values()), "", per, "every category at its own maximum at once"


def formula_optimizer_step(estimate) -> tuple[int, str]:
    """(bytes of optimizer temporaries, formula) at the theory's optimizer.step() moment.

    fit counts AdamW's temporaries only at that moment (tutor/theory/fit.py `_optimizer_temporaries`:
    single-tensor on a CPU, foreach on a GPU, as `request.gpu` says); its peak shows them when the
    peak is that moment. Otherwise they come from the same request with one token: they do not
    depend on the batch or the sequence, and with one token the step peaks in optimizer.step().
    """
    from dataclasses import replace

    from tutor.theory import fit as fitting

    peak = getattr(estimate.worst, "peak", None)
    if estimate.request.mode != Mode.TRAIN or peak is None:
        return 0, ""
    if peak.phase != "optimizer" and estimate.arch is not None:
        peak = fitting.estimate(estimate.arch, replace(estimate.request, batch=1, seq_len=1)).worst.peak
    if peak.phase != "optimizer":
        return 0, ""
    return peak.per_category.get("optimizer_temporaries", 0), peak.formula


def comparison(result: TracedFit, estimate) -> dict:
    """Traced against formula: at the peak, each category's own maximum, and the ratios."""
    trace = result.trace
    stage = estimate.worst
    peak_bytes, peak_phase, peak_per, _ = _formula_peak(estimate)
    rows = {}
    for traced_name, fit_name in ROWS:
        formula_max = stage.component(fit_name) if fit_name else 0
        if fit_name == "optimizer_temporaries":
            formula_max = formula_optimizer_step(estimate)[0]
        rows[traced_name] = {
            "traced_at_peak": trace.peak.per_category_bytes.get(traced_name, 0),
            "formula_at_peak": peak_per.get(fit_name, 0) if fit_name else 0,
            "traced_max": trace.max_per_category.get(traced_name, 0),
            "formula_max": formula_max,
        }
    return {"peak": {"traced_bytes": trace.peak.bytes, "formula_bytes": peak_bytes, "traced_phase": trace.peak.phase,
                     "formula_phase": peak_phase, "ratio": traced_over_formula(trace.peak.bytes, peak_bytes)},
            "categories": rows}


def traced_over_formula(traced: int, formula: int) -> float | None:
    return round(traced / formula, 4) if formula else None


def trace_json(result: TracedFit, estimate=None) -> dict:
    """The `"trace"` object of `fit --json --trace`."""
    report = result.trace.to_json()
    report["target_device"] = result.target_device
    report["notes"] = list(result.notes)
    if estimate is not None:
        report["vs_formula"] = comparison(result, estimate)
    return report


def explanations(result: TracedFit, estimate) -> list[str]:
    """Why the traced step and the formula differ, from the numbers of both."""
    from tutor.formatting import format_bytes

    trace = result.trace
    table = comparison(result, estimate)
    peak = table["peak"]
    lines = []
    moment = trace.peak.per_category_bytes
    if trace.setup.mode == Mode.TRAIN:
        grads = moment.get("gradients", 0)
        lines.append(f"The traced peak falls in the {trace.peak.phase}, with {format_bytes(grads)} of gradients "
                     f"alive (of {format_bytes(trace.max_per_category.get('gradients', 0))} at most): "
                     "the categories do not peak together.")
    if peak["formula_phase"] and peak["formula_phase"] != peak["traced_phase"]:
        lines.append(f"The formula puts its peak in the {peak['formula_phase']}; the traced one is in the "
                     f"{peak['traced_phase']}.")
    for name, row in table["categories"].items():
        traced, formula = row["traced_max"], row["formula_max"]
        if max(traced, formula) < 0.01 * max(trace.peak.bytes, 1):
            continue
        if name == "optimizer_temporaries":
            if not formula or abs(traced / formula - 1) > 0.05:
                why = formula_optimizer_step(estimate)[1] or "no temporaries counted for this optimizer"
                lines.append(f"optimizer temporaries: traced {format_bytes(traced)} inside optimizer.step() "
                             f"({trace.optimizer_traced}); the formula's optimizer.step() moment has "
                             f"{format_bytes(formula)}: {why}.")
            continue
        if not formula:
            lines.append(f"{name.replace('_', ' ')}: {format_bytes(traced)} traced; the formula has no term for it.")
        elif abs(traced / formula - 1) > 0.05:
            lines.append(f"{name.replace('_', ' ')}: traced {format_bytes(traced)} at most, formula "
                         f"{format_bytes(formula)} ({traced / formula:.2f}x).")
    by_op = sorted(trace.peak.activations_by_op.items(), key=lambda item: -item[1])[:5]
    acts = moment.get("activations", 0)
    if by_op and acts:
        # Storages made before the step are registered with the tracker: for activations, the batch.
        shares = ", ".join(f"{'token ids and labels' if op == 'register' else op} {n / acts:.0%}" for op, n in by_op)
        lines.append(f"Activations alive at the traced peak, by the op that made them: {shares}.")
    return lines
