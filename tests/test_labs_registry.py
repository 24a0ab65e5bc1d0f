"""tutor.labs: the registry, parameter checking, the result dataclasses and import hygiene."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from tutor import labs
from tutor.errors import UserError
from tutor.labs import Measurement, ProbeResult, get_probe

EXPECTED = ("matmul", "bandwidth", "cast-error", "activation-memory", "training-step", "moe-routing",
            "collective", "checkpoint-write", "fit", "kv-cache", "prefill-decode", "decode-engines", "ttft-tpot",
            "batch-decode", "kv-pages", "speculative", "host-overhead", "moe-alltoall",
            "quant-error", "fp8-scaling", "loss-scaling", "grad-accumulation", "fp64-cost", "checkpoint-interval",
            "moe", "ddp", "zero", "pipeline", "tensor", "profile-step", "exercise", "step-time", "evaluation", "time-to-train")


def test_registry_holds_exactly_the_agreed_probe_names() -> None:
    assert tuple(labs.PROBES) == EXPECTED
    for name, probe in labs.PROBES.items():
        assert probe.name == name
        assert probe.title and probe.description
        assert probe.metrics, name
        assert set(probe.params_schema) == set(probe.default_params), name


def test_importing_labs_imports_neither_torch_nor_numpy_nor_textual() -> None:
    code = ("import sys, tutor.labs; "
            "print([m for m in ('torch', 'numpy', 'textual') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_unknown_probe_is_a_user_error_with_a_suggestion_and_the_list() -> None:
    with pytest.raises(UserError, match=r"did you mean 'matmul'\?.*cast-error"):
        get_probe("matmull")


def test_unknown_parameter_suggests_the_close_one() -> None:
    with pytest.raises(UserError, match=r"moe-routing: unknown parameter 'top-k' \(did you mean 'top_k'\?\)"):
        get_probe("moe-routing").check_params({"top-k": 2})


@pytest.mark.parametrize(("probe", "params", "message"), [
    ("moe-routing", {"tokens": "many"}, "tokens must be a whole number"),
    ("moe-routing", {"tokens": True}, "tokens must be a whole number"),
    ("moe-routing", {"tokens": 0}, "tokens must be between 1"),
    ("moe-routing", {"skew": float("nan")}, "skew must be a number"),
    ("matmul", {"dtypes": ["fp32", "fp64"]}, "unknown dtypes 'fp64'"),
    ("matmul", {"dtypes": []}, "dtypes must be a non-empty list"),
    ("cast-error", {"values": [0.1, "abc"]}, "each of values must be a number"),
    ("collective", {"sizes": ["1XB"]}, "not a memory size"),
    ("activation-memory", {"attention": "flash3"}, "unknown attention 'flash3'"),
    ("checkpoint-write", {"model": ""}, "model must be non-empty text"),
])
def test_bad_parameter_values_are_one_line_user_errors(probe: str, params: dict, message: str) -> None:
    with pytest.raises(UserError, match=message) as caught:
        get_probe(probe).check_params(params)
    assert "\n" not in str(caught.value)


def test_check_params_fills_defaults_and_normalises() -> None:
    checked = get_probe("matmul").check_params({"dtypes": "FP32, bf16", "budget_s": 2})
    assert checked == {"dtypes": ("fp32", "bf16"), "budget_s": 2.0, "device": "auto"}
    sizes = get_probe("collective").check_params({"sizes": ["1MiB", 4096]})["sizes"]
    assert sizes == (2**20, 4096)


def test_every_default_parameter_set_passes_its_own_check() -> None:
    for probe in labs.PROBES.values():
        checked = probe.check_params({})
        assert set(checked) == set(probe.default_params)


def test_matmul_metrics_name_every_dtype_and_every_ordered_pair() -> None:
    metrics = get_probe("matmul").metrics
    assert "tflops_bf16" in metrics and "speedup_bf16_over_fp32" in metrics and "speedup_fp32_over_bf16" in metrics
    assert "speedup_fp32_over_fp32" not in metrics
    assert len([m for m in metrics if m.startswith("speedup_")]) == 5 * 4


def test_cast_error_metrics_expand_the_dtype_pattern() -> None:
    metrics = get_probe("cast-error").metrics
    for dtype in ("fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2"):
        assert f"max_rel_error_{dtype}" in metrics
    assert "agree_fraction" in metrics


def test_percent_of_theory_and_comparisons() -> None:
    row = Measurement("x", 50.0, "GB/s", theory=200.0, rate=True)
    assert row.percent_of_theory == 25.0
    assert row.comparison == "25.0% of the theoretical peak"
    assert Measurement("x", None, "B", theory=1.0).percent_of_theory is None
    assert Measurement("x", 1.0, "B", theory=0.0).percent_of_theory is None
    assert Measurement("bytes", 120.0, "B", theory=100.0).comparison == "120.0% of theory"


def test_a_rate_above_its_peak_is_explained_never_shown_above_100_percent() -> None:
    row = Measurement("fp32 matmul", 1.3e12, "FLOP/s", theory=1.0e12, rate=True)
    assert row.percent_of_theory == pytest.approx(130.0)
    assert "%" not in row.comparison
    assert "above the theoretical peak" in row.comparison


def test_results_serialise_to_json() -> None:
    result = ProbeResult("fit", (Measurement("a", 1.0, "B", 2.0),), {"m": 1.0}, "s")
    data = json.loads(json.dumps(result.to_json()))
    assert data["rows"][0]["percent_of_theory"] == 50.0
    assert data["metrics"] == {"m": 1.0} and data["cancelled"] is False


PURE_PYTHON_PARAMS = {
    "moe-routing": {"trials": 20},
    "fit": {"model": "gpt2", "capacity": "1GiB"},
}


@pytest.mark.parametrize("name", list(PURE_PYTHON_PARAMS))
def test_pure_python_probes_report_progress_and_only_declared_metrics(name: str) -> None:
    seen: list[tuple[float, str]] = []
    result = labs.run_probe(name, PURE_PYTHON_PARAMS[name], progress=lambda f, m: seen.append((f, m)))
    assert seen and seen[-1][0] == 1.0
    assert all(0.0 <= fraction <= 1.0 for fraction, _ in seen)
    assert set(result.metrics) <= set(get_probe(name).metrics)
    assert not get_probe(name).needs_torch


def test_a_preset_cancel_event_stops_the_router_at_once() -> None:
    cancel = threading.Event()
    cancel.set()
    result = get_probe("moe-routing").run({}, lambda f, m: None, cancel)
    assert result.cancelled and result.rows == ()


TINY_PARAMS = {
    "matmul": {"dtypes": ["fp32"], "device": "cpu"},
    "bandwidth": {"ops": ["copy"], "device": "cpu"},
    "cast-error": {"count": 10},
    "activation-memory": {"seq": 4, "batch": 1, "hidden": 16, "heads": 2},
    "training-step": {"hidden": 16, "heads": 2, "layers": 1, "vocab": 16, "seq": 4, "batch": 1},
    "moe-routing": {"trials": 10},
    "collective": {"sizes": ["4KiB"], "backend": "gloo"},
    "checkpoint-write": {"size_mb": 1},
    "fit": {"model": "gpt2", "capacity": "1GiB"},
    "quant-error": {"rows": 16, "cols": 16, "group_size": 8, "outliers": 1},
    "fp8-scaling": {"rows": 128, "cols": 128, "outliers": 1},
    "loss-scaling": {"hidden": 8, "batch": 4, "steps": 2},
    "grad-accumulation": {"batch": 4, "micro_batches": 2, "hidden": 8, "layers": 1},
    "fp64-cost": {"size": 16, "count": 1000},
    "checkpoint-interval": {"model": "gpt2", "size_mb": 1, "work_hours": 1, "runs": 1},
    "kv-cache": {"layers": 1, "hidden": 16, "heads": 2, "kv_heads": 1, "prompt": 2, "tokens": 2},
    "prefill-decode": {"hidden": 64, "layers": 1, "prompt": 4, "budget_s": 0.1, "device": "cpu"},
    "decode-engines": {"layers": 1, "hidden": 16, "heads": 2, "kv_heads": 1, "prompt": 2, "tokens": 2, "device": "cpu"},
    "ttft-tpot": {"layers": 1, "hidden": 16, "heads": 2, "kv_heads": 1, "prompt": 4, "tokens": 2, "device": "cpu"},
    "batch-decode": {"layers": 1, "hidden": 16, "heads": 2, "kv_heads": 1, "prompt": 2, "batches": "1,2", "steps": 3,
                     "device": "cpu"},
    "kv-pages": {"requests": 4, "prompt_max": 8, "output_max": 8, "max_len": 32},
    "speculative": {"layers": 2, "hidden": 16, "heads": 2, "kv_heads": 1, "prompt": 2, "tokens": 6, "device": "cpu"},
    "host-overhead": {"layers": 1, "heads": 2, "kv_heads": 1, "budget_s": 0.2},
    "moe-alltoall": {"tokens": 4, "experts": 4, "top_k": 2, "ep": 2, "hidden": 8, "steps": 1},
    "moe": {"experts": 4, "hidden": 8, "ffn": 8, "tokens": 8, "steps": 1},
    "pipeline": {"microbatches": 2, "hidden": 8, "microbatch_tokens": 4, "steps": 2},
    "tensor": {"hidden": 8, "heads": 2, "seq": 2, "batch": 1},
    "ddp": {"hidden": 8, "layers": 1, "batch": 1, "seq": 4, "steps": 1},
    "zero": {"hidden": 8, "layers": 1, "batch": 1, "seq": 4},
    "evaluation": {"steps": 4, "eval_every": 2, "eval_batches": 2, "train_batches": 2, "batch": 4, "hidden": 8,
                   "layers": 1},
    "profile-step": {"hidden": 16, "layers": 1, "seq": 8, "batch": 2, "vocab": 32, "steps": 1, "device": "cpu"},
    "exercise": {"check": "expert-placement", "answer": "rank 0: 0 7\nrank 1: 1 6\nrank 2: 2 5\nrank 3: 3 4"},
    "step-time": {"model": "llama-3.2-1b", "size": "tiny"},
    "time-to-train": {"model": "llama-3.2-1b", "tokens": "1B", "devices": 8, "tp": 1, "pp": 1, "seq": 1024},
}


def test_tiny_params_cover_every_probe() -> None:
    assert set(TINY_PARAMS) == set(EXPECTED)


@pytest.mark.parametrize("name", EXPECTED)
def test_every_probe_returns_at_once_when_cancelled_before_it_starts(name: str) -> None:
    if get_probe(name).needs_torch:
        import torch  # noqa: F401  (a hard dependency: missing is a failure, not a skip)
    cancel = threading.Event()
    cancel.set()
    result = get_probe(name).run(dict(TINY_PARAMS[name]), lambda f, m: None, cancel)
    assert isinstance(result, ProbeResult) and result.probe == name
    assert result.cancelled


@pytest.mark.parametrize("name", ["matmul", "cast-error", "moe-routing"])
def test_a_long_probe_stops_within_a_second_of_a_cancel(name: str) -> None:
    if get_probe(name).needs_torch:
        import torch  # noqa: F401  (imported here so the timing below measures the probe alone)
    long_run = {"matmul": {"dtypes": ["fp32", "bf16", "fp16"], "budget_s": 60, "device": "cpu"},
                "cast-error": {"count": 200_000, "budget_s": 60},
                "moe-routing": {"tokens": 32, "trials": 30_000, "budget_s": 60}}[name]
    cancel = threading.Event()
    timer = threading.Timer(0.5, cancel.set)
    timer.start()
    import time

    start = time.perf_counter()
    result = get_probe(name).run(long_run, lambda f, m: None, cancel)
    timer.join()
    assert result.cancelled
    assert time.perf_counter() - start < 0.5 + 1.5


@pytest.mark.parametrize("name", ["matmul", "cast-error", "activation-memory", "training-step", "moe-routing",
                                  "checkpoint-write", "fit"])
def test_a_run_reports_exactly_the_metrics_its_params_promise(name: str, tmp_path) -> None:
    probe = get_probe(name)
    if probe.needs_torch:
        import torch  # noqa: F401  (a hard dependency: missing is a failure, not a skip)
    params = dict(TINY_PARAMS[name])
    if name == "matmul":
        params.update(dtypes=["fp32", "bf16"], budget_s=0.3)
    if name == "checkpoint-write":
        params.update(dir=str(tmp_path), model="gpt2", budget_s=0.5)
    result = probe.run(params, lambda f, m: None, threading.Event())
    assert set(result.metrics) == set(probe.metrics_for(params))
    assert set(probe.metrics_for(params)) <= set(probe.metrics)


def test_metrics_for_follows_the_params() -> None:
    assert get_probe("matmul").metrics_for({"dtypes": ["fp32", "fp16"]}) == (
        "tflops_fp32", "tflops_fp16", "speedup_fp32_over_fp16", "speedup_fp16_over_fp32")
    assert get_probe("cast-error").metrics_for({"dtype": "fp8-e4m3"})[-1] == "unit_roundoff_fp8_e4m3"
    assert "model_checkpoint_write_s" not in get_probe("checkpoint-write").metrics_for({})
    with pytest.raises(UserError):
        get_probe("matmul").metrics_for({"dtypes": ["int3"]})
