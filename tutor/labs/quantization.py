"""quant-error: absmax INT8/INT4 quantization of a weight matrix, per tensor against per row/group.

The matrix is initialised as transformers initialises a linear layer (normal, std 0.02, the
`initializer_range` default); no pretrained weights are downloaded. `outliers` input columns are
scaled by `outlier_scale`, the few large feature dimensions LLM.int8() reports in real LLMs
(Dettmers et al. 2022, arXiv 2208.07339 §3). Each scheme is symmetric absmax (§2.1 of that paper):
scale = absmax / qmax per group, code = round(w / scale). The measured error is read against the
uniform quantization-noise model, error variance = step^2 / 12 per weight.
"""

from __future__ import annotations

import math
import threading
import time

from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import Param, budget_param, make_probe
from tutor.formatting import format_number, format_percent

INIT_STD = 0.02
# (metric name, bits, group): group 0 = the whole tensor, -1 = one scale per output row.
SCHEMES = (("int8_tensor", 8, 0), ("int8_row", 8, -1), ("int4_tensor", 4, 0), ("int4_group", 4, None))


def quantization_noise_variance(step: float) -> float:
    """Variance of round-to-nearest error with step `step`, error uniform on [-step/2, step/2]:
    step^2 / 12 (Bennett 1948, "Spectra of quantized signals"; Widrow & Kollar, "Quantization
    Noise", 2008, §4.3). Holds when the values span many steps; a value below step/2 rounds to 0
    and its error is the value itself, which the model does not describe."""
    return step * step / 12.0


def absmax_qmax(bits: int) -> int:
    """Largest code of symmetric absmax quantization: 2^(bits-1) - 1 (127 for INT8, 7 for INT4);
    the most negative code is unused (LLM.int8(), arXiv 2208.07339 §2.1)."""
    return 2 ** (bits - 1) - 1


def _quant_error(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    progress(0.0, "loading torch")
    import torch

    start = time.perf_counter()  # the budget is for quantizing, not for loading torch
    torch.manual_seed(params["seed"])
    rows_n, cols_n, group = params["rows"], params["cols"], params["group_size"]
    if cols_n % group:
        from tutor.errors import UserError

        raise UserError(f"quant-error: cols ({cols_n}) must be a multiple of group_size ({group})")
    weight = torch.randn(rows_n, cols_n, dtype=torch.float64) * INIT_STD
    outlier_cols = torch.randperm(cols_n)[: params["outliers"]]
    weight[:, outlier_cols] *= params["outlier_scale"]
    inputs = torch.randn(64, cols_n, dtype=torch.float64)
    reference = inputs @ weight.T
    norm = weight.norm().item()
    metrics: dict[str, float] = {}
    rows: list[Measurement] = []
    cancelled = False
    for index, (name, bits, grouping) in enumerate(SCHEMES):
        if cancel.is_set() or time.perf_counter() - start > params["budget_s"]:
            cancelled = cancel.is_set()
            break
        progress(index / len(SCHEMES), f"quantizing: {name}")
        size = group if grouping is None else (cols_n if grouping == -1 else rows_n * cols_n)
        groups = weight.reshape(-1, size)
        qmax = absmax_qmax(bits)
        step = groups.abs().amax(dim=1, keepdim=True) / qmax
        codes = torch.clamp(torch.round(groups / step), -qmax, qmax)
        dequantized = (codes * step).reshape(rows_n, cols_n)
        error = (dequantized - weight).norm().item() / norm
        theory = math.sqrt(sum(size * quantization_noise_variance(s) for s in step.flatten().tolist())) / norm
        zeros = (codes == 0).double().mean().item()
        output_error = ((inputs @ dequantized.T) - reference).norm().item() / reference.norm().item()
        scales = groups.shape[0]
        bits_per_weight = bits + 16 * scales / (rows_n * cols_n)
        metrics[f"rel_error_{name}"] = error
        metrics[f"theory_rel_error_{name}"] = theory
        metrics[f"zero_fraction_{name}"] = zeros
        metrics[f"output_rel_error_{name}"] = output_error
        metrics[f"bits_per_weight_{name}"] = bits_per_weight
        how = {0: "one scale for the tensor", -1: "one scale per row", None: f"one scale per {group} weights"}[grouping]
        rows.append(Measurement(
            f"INT{bits}, {how}: relative weight error", error, "relative RMS", theory,
            "step^2/12 per weight, step = absmax/qmax of each group (Bennett 1948)",
            f"{format_percent(zeros)} of weights rounded to 0; output error {format_number(output_error)}; "
            f"{format_number(bits_per_weight)} bits/weight with 16-bit scales"
            + ("; far from the noise model: most weights lie below half a step, so each error is the "
               "weight itself, not a uniform step^2/12" if abs(error / theory - 1) > 0.25 else "")))
    if "rel_error_int4_tensor" in metrics and "rel_error_int4_group" in metrics:
        metrics["int4_tensor_over_group"] = metrics["rel_error_int4_tensor"] / metrics["rel_error_int4_group"]
        rows.append(Measurement("INT4 error, per tensor / group-wise", metrics["int4_tensor_over_group"], "x",
                                metrics["theory_rel_error_int4_tensor"] / metrics["theory_rel_error_int4_group"],
                                "ratio of the two theory errors"))
    if not rows and not cancelled:
        from tutor.errors import UserError

        raise UserError(f"quant-error: the budget of {params['budget_s']:g} s ran out before the first scheme was "
                        "measured; give a larger budget_s or fewer rows and cols")
    progress(1.0, "done")
    summary = ", ".join(f"{name} {format_number(metrics[f'rel_error_{name}'])}" for name, _, _ in SCHEMES
                        if f"rel_error_{name}" in metrics)
    return ProbeResult(probe="quant-error", rows=tuple(rows), metrics=metrics,
                       summary=f"relative weight error of a {rows_n}x{cols_n} matrix: {summary}",
                       cancelled=cancelled, device="cpu")


_KINDS = ("rel_error", "theory_rel_error", "zero_fraction", "output_rel_error", "bits_per_weight")
QUANT_ERROR = make_probe(
    name="quant-error",
    title="Quantization error of a weight matrix",
    description="Quantizes a weight matrix (std 0.02, with a few outlier columns) with symmetric absmax to "
                "INT8 and INT4, one scale per tensor, per row or per group, and sets the measured error beside "
                "the step^2/12 noise model.",
    needs_torch=True,
    params=(
        Param("rows", "int", 512, "output rows of the matrix", minimum=8, maximum=4096),
        Param("cols", "int", 512, "input columns of the matrix", minimum=8, maximum=4096),
        Param("group_size", "int", 128, "weights per scale for the group-wise scheme", minimum=2, maximum=4096),
        Param("outliers", "int", 4, "input columns made large (outlier features)", minimum=0, maximum=4096),
        Param("outlier_scale", "float", 20.0, "how much larger the outlier columns are", minimum=1.0, maximum=1e4),
        Param("seed", "int", 0, "random seed", minimum=0),
        budget_param(3.0),
    ),
    metrics=tuple(f"{kind}_{name}" for name, _, _ in SCHEMES for kind in _KINDS) + ("int4_tensor_over_group",),
    body=_quant_error,
)
