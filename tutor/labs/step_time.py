"""step-time: predict a real model's training step, prefill and decode from this machine's ceilings, then run it.

The lab behind `tensor-tutor time --verify` (tutor.trace.step_verify): a preset's architecture
scaled down, its ceilings (matmul at its own GEMM shapes, its memory-bound ops, the framework's
per-layer cost) measured just before in the same process, the step predicted operation by operation
(tutor.theory.step_operations / step_time), then real steps timed. Rows: measured beside predicted.
"""

from __future__ import annotations

import threading

from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import Param, make_probe

MODELS = ("llama-3.2-1b", "gpt2", "qwen3-0.6b", "mistral-7b", "qwen2.5-1.5b", "olmo-2-7b")
SIZES = ("tiny", "small", "medium", "large")
METRICS = ("step_s", "predicted_step_s", "step_ratio", "forward_s", "backward_s", "optimizer_s",
           "predicted_forward_s", "predicted_backward_s", "predicted_optimizer_s", "prefill_s", "predicted_prefill_s",
           "decode_tokens_per_s", "predicted_decode_tokens_per_s")
PARAMS = (
    Param("model", "str", "llama-3.2-1b", "the preset whose architecture is scaled down", choices=MODELS),
    Param("size", "str", "small", "how far it is scaled down (tiny: about a second in all)", choices=SIZES),
)


def _step_time(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    if cancel.is_set():
        return ProbeResult("step-time", (), {}, "cancelled", True, "cpu")
    progress(0.0, "loading torch and transformers")
    from tutor.trace.step_verify import run_verification
    from tutor.files.models import read_model_config

    progress(0.1, f"measuring the ceilings and the steps of {params['model']} ({params['size']})")
    result = run_verification(read_model_config(params["model"]).config, params["size"])
    phases = result["phases"]
    metrics = {"step_s": result["measured_s"], "predicted_step_s": result["predicted_s"],
               "step_ratio": result["measured_s"] / result["predicted_s"],
               "prefill_s": result["prefill"]["measured_s"], "predicted_prefill_s": result["prefill"]["predicted_s"],
               "decode_tokens_per_s": result["decode"]["measured_tokens_per_second"],
               "predicted_decode_tokens_per_s": result["decode"]["predicted_tokens_per_second"]}
    for name, row in phases.items():
        metrics[f"{name}_s"] = row["measured_s"]
        metrics[f"predicted_{name}_s"] = row["predicted_s"]
    source = "predicted from ceilings measured just before (tutor.theory.step_time)"
    rows = [Measurement(f"{name} (CPU time)", row["measured_s"], "s", row["predicted_s"], source)
            for name, row in phases.items()]
    rows.append(Measurement("training step (CPU time)", result["measured_s"], "s", result["predicted_s"], source,
                            note=f"wall-clock {result['measured_wall_s']:.3g} s on this shared machine"))
    rows.append(Measurement("prefill", result["prefill"]["measured_s"], "s", result["prefill"]["predicted_s"], source))
    rows.append(Measurement("decode", result["decode"]["measured_tokens_per_second"], "tokens/s",
                            result["decode"]["predicted_tokens_per_second"], source, rate=False))
    progress(1.0, "done")
    from tutor.formatting import format_percent

    summary = (f"{result['model']}: training step measured {format_percent(metrics['step_ratio'])} of the prediction; "
               f"{result['scaled']}")
    return ProbeResult("step-time", tuple(rows), metrics, summary, False, "cpu",
                       details={"verify": {k: v for k, v in result.items() if k != "sources"},
                                "sources": result["sources"]})


STEP_TIME = make_probe(
    name="step-time", title="How long a step takes: predicted, then measured",
    description="Scale a preset down, measure this machine's ceilings at its shapes, predict its training step, "
                "prefill and decode operation by operation, then run them with transformers.",
    needs_torch=True, params=PARAMS, metrics=METRICS, body=_step_time)
