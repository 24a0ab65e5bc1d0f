"""fp8-scaling: the error of FP8 training recipes' scaling schemes, simulated with torch's float8 casts.

torch's float8 dtypes (float8_e4m3fn, float8_e5m2) cast on a CPU too, so the recipes can be simulated
exactly here: multiply by a scale, saturate at the format's largest finite value (as Transformer
Engine's casts do), cast, cast back and divide. The matmul itself is not run in FP8 (that needs an
FP8 tensor core); what the recipes change, which values survive the cast, is what this measures.

The activations: a rows x cols matrix of N(0, 1) values with `outliers` channels (columns) scaled by
`outlier_scale`, the few large feature dimensions LLMs develop (Dettmers et al., LLM.int8(), arXiv
2208.07339 §3). The schemes, all E4M3 (the forward format of Micikevicius et al., arXiv 2209.05433):
- unscaled: the values cast as they are;
- tensor: one scale per tensor from its own amax ("current" scaling, tutor.theory.formats.fp8_scale);
- delayed: one scale per tensor from the max amax of `history` earlier steps (Transformer Engine's
  DelayedScaling), while this step's outliers grew by `growth`;
- tile: one scale per 1 x 128 tile, DeepSeek-V3's activations (arXiv 2412.19437 §3.3.2);
- block: one scale per 128 x 128 block, DeepSeek-V3's weights;
- mx: one power-of-two scale per 32 values (OCP MX v1.0, mx_scale_exponent).
Then gradients: values of log-normal magnitude spread over many powers of two, per-tensor scaled, cast
to E4M3 and to E5M2, the backward format of the same paper.
"""

from __future__ import annotations

import threading
import time

from tutor.formatting import format_number, format_percent
from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import Param, budget_param, make_probe

SCHEMES = ("unscaled", "tensor", "delayed", "tile", "block", "mx")
GRADIENT_FORMATS = ("e4m3", "e5m2")
_KINDS = ("error", "ordinary_error", "underflow", "clipped")
# Gradients: magnitudes exp(N(0, sigma)) around a typical size; sigma in natural-log units.
GRADIENT_CENTER = 1e-4


def _cast(torch, values, fmt_name: str):
    """`values` (float64) saturated at the format's largest finite value, cast to FP8 and back to float64,
    and how many were saturated."""
    from tutor.theory.formats import format_by_name

    fmt = format_by_name(fmt_name)
    limit = float(fmt.max_finite)
    dtype = torch.float8_e4m3fn if fmt.name == "fp8-e4m3" else torch.float8_e5m2
    clipped = int((values.abs() > limit).sum())
    cast = values.clamp(-limit, limit).to(torch.float32).to(dtype).to(torch.float64)
    return cast, clipped


def _block_scales(torch, x, block_rows: int, block_cols: int, scale_of) -> object:
    """A scale for every element: scale_of(amax) of its block_rows x block_cols block (tutor.theory)."""
    rows, cols = x.shape
    amax = x.abs().reshape(rows // block_rows, block_rows, cols // block_cols, block_cols).amax(dim=(1, 3))
    scales = torch.tensor([[scale_of(value) for value in row] for row in amax.tolist()], dtype=torch.float64)
    return scales.repeat_interleave(block_rows, 0).repeat_interleave(block_cols, 1)


def _errors(torch, x, q, clipped: int, ordinary) -> dict[str, float]:
    """Relative RMS error over the whole tensor and over its ordinary (non-outlier) channels; the share
    of nonzero values flushed to zero; the share saturated."""
    diff = q - x
    nonzero = x != 0
    return {"error": float(diff.norm() / x.norm()),
            "ordinary_error": float(diff[:, ordinary].norm() / x[:, ordinary].norm()),
            "underflow": float(((q == 0) & nonzero).sum()) / max(1, int(nonzero.sum())),
            "clipped": clipped / x.numel()}


def _fp8_scaling(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    from tutor.errors import UserError

    rows, cols = params["rows"], params["cols"]
    tile_cols, block = 128, 128
    if rows % block or cols % block:
        raise UserError(f"fp8-scaling: rows and cols must be multiples of {block} (the 128 x 128 blocks), "
                        f"got {rows} x {cols}")
    if params["outliers"] >= cols:
        raise UserError(f"fp8-scaling: outliers ({params['outliers']}) must be fewer than cols ({cols})")
    from tutor.labs.limits import check_lab_fits

    # float64 activations, their scales, the scaled, cast and dequantized copies, and the gradients:
    # about ten tensors of rows x cols alive at once.
    check_lab_fits("fp8-scaling", memory_bytes=10 * 8 * rows * cols,
                   memory_what=f"about ten float64 copies of a {rows} x {cols} tensor", fix="lower rows or cols")
    progress(0.0, "loading torch")
    import torch

    from tutor.theory.formats import (
        DEEPSEEK_BLOCK,
        DEEPSEEK_TILE,
        FP8_FORWARD_FORMAT,
        FP8_GRADIENT_FORMAT,
        MX_BLOCK_SIZE,
        delayed_amax,
        format_by_name,
        fp8_scale,
        mx_scale_exponent,
        scale_count,
    )

    start = time.perf_counter()
    generator = torch.Generator().manual_seed(params["seed"])
    outlier_cols = torch.randperm(cols, generator=generator)[: params["outliers"]]
    ordinary = torch.ones(cols, dtype=torch.bool)
    ordinary[outlier_cols] = False

    def activations(growth: float):
        x = torch.randn(rows, cols, generator=generator, dtype=torch.float64)
        x[:, outlier_cols] *= params["outlier_scale"] * growth
        return x

    history = [float(activations(1.0).abs().max()) for _ in range(params["history"])]
    x = activations(params["growth"])
    forward = format_by_name(FP8_FORWARD_FORMAT)
    bound = float(forward.epsilon) / 2
    scale_of = {
        "unscaled": (rows, cols, lambda amax: 1.0),
        "tensor": (rows, cols, fp8_scale),
        "delayed": (rows, cols, lambda amax: fp8_scale(delayed_amax(history))),
        "tile": (*DEEPSEEK_TILE, fp8_scale),
        "block": (*DEEPSEEK_BLOCK, fp8_scale),
        "mx": (1, MX_BLOCK_SIZE, lambda amax: 2.0 ** -mx_scale_exponent(amax)),
    }
    how = {"unscaled": "no scale", "tensor": "one scale per tensor, from its own amax",
           "delayed": f"one scale per tensor, from the largest amax of {params['history']} earlier steps",
           "tile": "one scale per 1 x 128 tile (DeepSeek-V3 activations)",
           "block": "one scale per 128 x 128 block (DeepSeek-V3 weights)",
           "mx": f"one power-of-two scale per {MX_BLOCK_SIZE} values (OCP MX)"}
    metrics: dict[str, float] = {}
    rows_out: list[Measurement] = []
    cancelled = False
    source = f"E4M3 round-to-nearest bound 2^-(m+1) = {format_number(bound)}, every value in the normal range"
    for index, scheme in enumerate(SCHEMES):
        if cancel.is_set():
            cancelled = True
            break
        if time.perf_counter() - start > params["budget_s"]:
            break
        progress(index / (len(SCHEMES) + 1), f"casting to FP8: {scheme}")
        block_rows, block_cols, rule = scale_of[scheme]
        scales = _block_scales(torch, x, block_rows, block_cols, rule)
        cast, clipped = _cast(torch, x * scales, FP8_FORWARD_FORMAT)
        found = _errors(torch, x, cast / scales, clipped, ordinary)
        for kind, value in found.items():
            metrics[f"{kind}_{scheme}"] = value
        count = 0 if scheme == "unscaled" else scale_count(rows, cols, block_rows, block_cols)
        rows_out.append(Measurement(
            f"E4M3, {how[scheme]}: error on the ordinary channels", found["ordinary_error"], "relative RMS",
            bound, source,
            f"whole tensor {format_number(found['error'])}; {format_percent(found['underflow'])} of values "
            f"flushed to 0, {format_percent(found['clipped'])} saturated; {count:,} scales"))
    if cancelled or len(rows_out) < len(SCHEMES):
        progress(1.0, "stopped")
    else:
        progress(len(SCHEMES) / (len(SCHEMES) + 1), "casting gradients to E4M3 and E5M2")
        magnitude = torch.exp(torch.randn(rows, cols, generator=generator, dtype=torch.float64)
                              * params["gradient_spread"]) * GRADIENT_CENTER
        signs = torch.where(torch.rand(rows, cols, generator=generator) < 0.5, -1.0, 1.0).to(torch.float64)
        grad = magnitude * signs
        for name, fmt_name in zip(GRADIENT_FORMATS, (FP8_FORWARD_FORMAT, FP8_GRADIENT_FORMAT), strict=True):
            fmt = format_by_name(fmt_name)
            scale = fp8_scale(float(grad.abs().max()), fmt)
            cast, clipped = _cast(torch, grad * scale, fmt_name)
            found = _errors(torch, grad, cast / scale, clipped, torch.ones(cols, dtype=torch.bool))
            metrics[f"grad_error_{name}"] = found["error"]
            metrics[f"grad_underflow_{name}"] = found["underflow"]
            rows_out.append(Measurement(
                f"gradients in {fmt_name.upper().replace('FP8-', '')}, one scale per tensor: values flushed to 0",
                found["underflow"], "fraction", None, "",
                f"relative RMS error {format_number(found['error'])}; the format spans "
                f"{format_number(fmt.dynamic_range_decades)} decades from its smallest subnormal to its max"))
        progress(1.0, "done")
    if "ordinary_error_tile" in metrics:
        metrics["tensor_over_tile"] = metrics["ordinary_error_tensor"] / metrics["ordinary_error_tile"]
    if not rows_out and not cancelled:
        raise UserError(f"fp8-scaling: the budget of {params['budget_s']:g} s ran out before the first scheme; "
                        "give a larger budget_s or fewer rows and cols")
    summary = ", ".join(f"{scheme} {format_number(metrics[f'ordinary_error_{scheme}'])}" for scheme in SCHEMES
                        if f"ordinary_error_{scheme}" in metrics)
    return ProbeResult(probe="fp8-scaling", rows=tuple(rows_out), metrics=metrics,
                       summary=f"E4M3 error on the ordinary channels of a {rows}x{cols} tensor with "
                               f"{params['outliers']} outlier channels: {summary}",
                       cancelled=cancelled, device="cpu",
                       details={"history_amax": history, "outlier_columns": sorted(outlier_cols.tolist())})


FP8_SCALING = make_probe(
    name="fp8-scaling",
    title="FP8 scaling recipes: per tensor, delayed and per block",
    description="Casts activations with outlier channels to FP8 E4M3 with each recipe's scales (none, per "
                "tensor, delayed, 1x128 tiles, 128x128 blocks, MX 32-value blocks) and measures the error, the "
                "values flushed to zero and those saturated; then gradients in E4M3 against E5M2.",
    needs_torch=True,
    params=(
        Param("rows", "int", 256, "rows (tokens) of the activation matrix, a multiple of 128", minimum=128,
              maximum=4096),
        Param("cols", "int", 1024, "columns (channels), a multiple of 128", minimum=128, maximum=8192),
        Param("outliers", "int", 2, "channels made large (outlier features)", minimum=0, maximum=8191),
        Param("outlier_scale", "float", 1e4, "how much larger the outlier channels are", minimum=1.0,
              maximum=1e6),
        Param("history", "int", 16, "earlier steps whose amax delayed scaling uses", minimum=1, maximum=1024),
        Param("growth", "float", 2.0, "how much this step's outliers grew over the earlier steps'", minimum=0.01,
              maximum=1e3),
        Param("gradient_spread", "float", 2.0, "spread of the gradients' magnitudes, sigma of their natural log",
              minimum=0.0, maximum=10.0),
        Param("seed", "int", 0, "random seed", minimum=0),
        budget_param(5.0),
    ),
    metrics=tuple(f"{kind}_{scheme}" for scheme in SCHEMES for kind in _KINDS)
    + tuple(f"grad_{kind}_{name}" for name in GRADIENT_FORMATS for kind in ("error", "underflow"))
    + ("tensor_over_tile",),
    body=_fp8_scaling,
)
