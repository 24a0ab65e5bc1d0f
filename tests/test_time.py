"""`tensor-tutor time`: the step counted op by op, published anchors, sourced ceilings, the CLI, and --verify."""

from __future__ import annotations

import json
import re

import pytest

from tests.cli_runner import run
from tutor.formatting import format_rate
from tutor.answers.time import DECODE_BATCHES
from tutor.bench.ceilings import card_ceilings, measured_ceilings
from tutor.bench.notebook import append_run, read_notebook
from tutor.errors import UserError
from tutor.hardware.specs import SPECS_BY_KEY
from tutor.files.models import resolve_model
from tutor.theory.fit import FitRequest
from tutor.theory.models import count_parameters
from tutor.theory.lora import lora_trainable_params
from tutor.theory.step_operations import GEMM, backward_of, layer_forward, PassShape, training_operations
from tutor.theory.step_time import (
    collective_seconds,
    decode_compute_bound_batch,
    decode_step,
    model_flops_per_token,
    training_run,
    training_step_time,
)

LLAMA3_PAPER_FLOPS = 3.8e25          # Llama 3 paper (arXiv 2407.21783) §3: 405B trained with 3.8 x 10^25 FLOPs
LLAMA31_405B_GPU_HOURS = 30.84e6     # Llama-3.1-405B model card: 30.84M H100-80GB GPU-hours
LLAMA3_MFU = 0.38                    # Llama 3 paper Table 4: 38% BF16 MFU (16K GPUs, context parallel)
LLAMA3_TOKENS = 15_600_000_000_000   # Llama 3 paper: 15.6T tokens


def arch(name: str):
    return resolve_model(name)[0]


# ---------------------------------------------------------------------------------------------- anchors


def test_llama_405b_flops_land_within_5_percent_of_the_paper() -> None:
    flops = model_flops_per_token(arch("llama-3.1-405b"), seq_len=8192) * LLAMA3_TOKENS
    assert abs(flops / LLAMA3_PAPER_FLOPS - 1) < 0.05


def test_llama_405b_gpu_hours_at_38_percent_mfu_land_within_15_percent_of_the_model_card() -> None:
    model = arch("llama-3.1-405b")
    ceilings = card_ceilings(SPECS_BY_KEY["h100-sxm"], "bf16")
    assert ceilings.peak_flops is not None and abs(ceilings.peak_flops.value - 989.4e12) < 1e9
    request = FitRequest(mode="train", batch=1, seq_len=8192, dp=128, tp=8, pp=16, microbatches=16)
    step = training_step_time(model, request, ceilings, mfu=LLAMA3_MFU)
    train = training_run(step, tokens=LLAMA3_TOKENS, price_per_device_hour=2.0)
    assert abs(train.device_hours / LLAMA31_405B_GPU_HOURS - 1) < 0.15
    assert train.cost == pytest.approx(train.device_hours * 2.0)
    assert step.mfu(989.4e12) == pytest.approx(LLAMA3_MFU)


# ---------------------------------------------------------------------------------------------- theory


def test_every_linear_gemm_costs_twice_its_forward_in_the_backward() -> None:
    model = arch("llama-3.2-1b")
    forward = layer_forward(model, moe_layer=False, shape=PassShape(2, 128, 128), tp=1, ep=1, e=2,
                            attention="eager", calls=1, training=True)
    backward = backward_of(forward, "eager")
    linear = [op for op in forward if op.kind == GEMM and not op.name.startswith("attention")]
    for op in linear:
        grads = [b for b in backward if b.name in (f"{op.name} dX", f"{op.name} dW")]
        assert sum(b.flops for b in grads) == 2 * op.flops


def test_flash_attention_counts_half_the_causal_square_and_recomputes_in_the_backward() -> None:
    model = arch("llama-3.2-1b")
    eager = layer_forward(model, moe_layer=False, shape=PassShape(1, 512, 512), tp=1, ep=1, e=2,
                          attention="eager", calls=1, training=True)
    sdpa = layer_forward(model, moe_layer=False, shape=PassShape(1, 512, 512), tp=1, ep=1, e=2,
                         attention="sdpa", calls=1, training=True)
    score = lambda ops: next(op for op in ops if op.name.startswith("attention scores"))  # noqa: E731
    assert score(sdpa).flops * 2 == score(eager).flops
    back = next(op for op in backward_of(sdpa, "sdpa") if op.name.startswith("attention scores"))
    assert back.flops == pytest.approx(2.5 * score(sdpa).flops)


def test_the_optimizer_step_reads_and_writes_every_parameter_as_torch_does() -> None:
    model = arch("gpt2")
    params = count_parameters(model).total
    request = FitRequest(mode="train", recipe="fp32", optimizer="adamw", batch=1, seq_len=64)
    ops = training_operations(model, request, params_on_device=params)
    (optimizer,) = ops.phase("optimizer")
    assert optimizer.bytes == params * 20 * 4  # 20 element accesses of fp32 (torch _single_tensor_adam)
    sharded = training_operations(model, FitRequest(mode="train", recipe="fp32", optimizer="adamw", batch=1,
                                                    seq_len=64, dp=4, zero=1), params_on_device=params)
    assert sharded.phase("optimizer")[0].bytes == pytest.approx(optimizer.bytes / 4, rel=1e-6)


def test_communication_is_nothing_on_one_rank_and_overlap_changes_what_is_exposed() -> None:
    assert collective_seconds("all_reduce", 10**9, 1, calls=1, busbw=1e9, latency=1e-5) == 0
    ring = collective_seconds("all_reduce", 10**9, 8, calls=1, busbw=1e9, latency=1e-5)
    assert ring == pytest.approx(1.0 + 6 * 1e-5)  # the tree's 2 log2(8) latency steps, fewer than the ring's 14
    # 16,384 ranks: 28 latency steps a call, not a ring's 32,766 (30,965 bucket calls would wait 51 min at 3 us).
    wide = collective_seconds("all_reduce", 10**9, 16384, calls=30965, busbw=1e9, latency=3e-6)
    assert wide == pytest.approx(1.0 + 30965 * 28 * 3e-6)
    assert collective_seconds("all_gather", 10**9, 8, calls=1, busbw=1e9, latency=1e-5) == pytest.approx(1.0 + 7e-5)
    model = arch("llama-3.1-8b")
    ceilings = card_ceilings(SPECS_BY_KEY["h100-sxm"], "bf16")
    request = FitRequest(mode="train", batch=1, seq_len=4096, dp=64)
    hidden = training_step_time(model, request, ceilings, overlap=1.0)
    exposed = training_step_time(model, request, ceilings, overlap=0.0)
    (dp,) = exposed.collectives
    assert dp.exposed_seconds == pytest.approx(dp.seconds) and dp.link == "inter_node_link"
    assert exposed.phases["communication"] > hidden.phases["communication"]
    assert exposed.seconds > hidden.seconds


def test_decode_is_memory_bound_at_batch_one_and_turns_compute_bound_at_a_larger_batch() -> None:
    model = arch("llama-3.1-8b")
    ceilings = card_ceilings(SPECS_BY_KEY["h100-sxm"], "bf16")
    # A paged cache (--impl fused) reads the KV cache once per step; transformers' DynamicCache also copies it.
    request = FitRequest(mode="inference", batch=1, seq_len=128, impl="fused")
    one = decode_step(model, request, ceilings, batch=1, context=128)
    assert one.bound == "memory"
    crossover = decode_compute_bound_batch(model, request, ceilings, context=128)
    assert crossover is not None and 100 < crossover < 2000  # ridge 794.5 TFLOP/s / 2.8 TB/s = 284 FLOP/B
    assert decode_step(model, request, ceilings, batch=crossover, context=128).bound == "compute"
    copied = decode_compute_bound_batch(model, FitRequest(mode="inference", batch=1, seq_len=128), ceilings,
                                        context=128)
    assert copied is None or copied > crossover
    # A long context's KV cache grows as fast as the FLOPs: it stays memory-bound at any batch.
    assert decode_compute_bound_batch(model, request, ceilings, context=8192) is None
    # Batch 1 reads the weights once: close to bytes / bandwidth (Pope et al.), never faster.
    weights = count_parameters(model).total * 2
    assert one.seconds >= weights / ceilings.bandwidth_points[0].bytes_per_s


# ---------------------------------------------------------------------------------------------- ceilings


def _bench_run(data_dir) -> None:
    header = {"date": "2026-12-01T10:00:00Z", "cancelled": False}
    sweep = [{"m": s, "n": s, "k": s, "tflops_median": 0.02 * s / 1024, "tflops_best": 0.03} for s in (256, 512, 1024)]
    results = [
        {"kind": "matmul", "device": "cpu", "dtype": "bf16", "backend": "torch/mkl", "m": 1024, "n": 1024, "k": 1024,
         "tflops_median": 0.02, "peak_tflops": 0.5, "peak_source": "CPU formula: cores x FLOP/cycle x clock",
         "sweep": sweep, "headline": True},
        {"kind": "bandwidth", "device": "cpu", "op": "triad", "bytes": 3 * 2**27, "gbps_median": 9.5},
    ]
    assert append_run(header, results, data_dir / "results.jsonl") is None


def test_measured_ceilings_use_the_whole_sweep_and_name_the_run(tmp_path) -> None:
    _bench_run(tmp_path)
    ceilings = measured_ceilings("cpu", "bf16", read_notebook(tmp_path / "results.jsonl"))
    assert len(ceilings.gemm_points) == 3
    assert {p.flops_per_s for p in ceilings.gemm_points} == {0.02e12 * s / 1024 for s in (256, 512, 1024)}
    for source in (ceilings.gemm_source, ceilings.bandwidth_source):
        assert "bench run 1 (2026-12-01T10:00:00Z)" in source


def test_measured_ceilings_name_the_threads_they_predict_for_and_flag_a_busy_run(tmp_path, monkeypatch) -> None:
    sweep = [{"m": s, "n": s, "k": s, "tflops_median": 0.02} for s in (256, 512)]
    busy = {"busy": True, "other_share": 0.4, "own_share": 0.6}
    assert append_run({"date": "2026-12-02T10:00:00Z", "cancelled": False, "torch_threads": 2}, [
        {"kind": "matmul", "device": "cpu", "dtype": "bf16", "backend": "torch/mkl", "m": 512, "n": 512, "k": 512,
         "tflops_median": 0.02, "sweep": sweep, "headline": True, "busy": busy},
        {"kind": "bandwidth", "device": "cpu", "op": "triad", "bytes": 3 * 2**27, "gbps_median": 9.5},
    ], tmp_path / "results.jsonl") is None
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    notes = measured_ceilings("cpu", "bf16", read_notebook(tmp_path / "results.jsonl")).notes
    assert any("on 2 thread(s)" in note for note in notes)
    assert any("other processes took 40%" in note for note in notes)
    assert not any("a new process here" in note for note in notes)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    notes = measured_ceilings("cpu", "bf16", read_notebook(tmp_path / "results.jsonl")).notes
    assert any("a new process here would run torch on 1 thread(s)" in note for note in notes)


def test_measured_ceilings_take_the_bench_run_made_on_the_threads_a_step_runs_on(tmp_path, monkeypatch) -> None:
    for date, threads, rate in (("2026-12-03T10:00:00Z", 1, 0.01), ("2026-12-04T10:00:00Z", 2, 0.02)):
        sweep = [{"m": 512, "n": 512, "k": 512, "tflops_median": rate}]
        assert append_run({"date": date, "cancelled": False, "torch_threads": threads}, [
            {"kind": "matmul", "device": "cpu", "dtype": "bf16", "backend": "torch/mkl", "m": 512, "n": 512, "k": 512,
             "tflops_median": rate, "sweep": sweep, "headline": True},
            {"kind": "bandwidth", "device": "cpu", "op": "triad", "bytes": 3 * 2**27, "gbps_median": 9.5},
        ], tmp_path / "results.jsonl") is None
    book = read_notebook(tmp_path / "results.jsonl")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the older run, the one made on one thread
    one = measured_ceilings("cpu", "bf16", book)
    assert one.max_matmul_flops == pytest.approx(0.01e12) and "bench run 1 " in one.gemm_source
    assert not any("a new process here" in note for note in one.notes)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert measured_ceilings("cpu", "bf16", book).max_matmul_flops == pytest.approx(0.02e12)
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # no run on 4 threads: the newest, said to differ
    four = measured_ceilings("cpu", "bf16", book)
    assert "bench run 2 " in four.gemm_source and any("run torch on 4 thread(s)" in note for note in four.notes)


def test_a_cpu_training_step_pays_the_framework_code_measured_for_its_family(tmp_path, monkeypatch) -> None:
    """On a CPU the framework's own code runs on the cores that do the work: each decoder layer's forward and
    backward code, and the model's, are added to the step (tutor.trace.host_costs' training rows); a GPU, a card
    by name and a LoRA step are left as they were."""
    from tutor.answers import time as answers_time
    from tutor.theory.step_operations import LAYER_CODE, MODEL_CODE
    from tutor.theory.step_time import HostCosts
    from tutor.trace import host_costs

    _bench_run(tmp_path)
    ceilings = measured_ceilings("cpu", "bf16", read_notebook(tmp_path / "results.jsonl"))
    rows = (("train-forward", LAYER_CODE, 1, 1e-3), ("train-forward", MODEL_CODE, 1, 2e-3),
            ("train-backward", LAYER_CODE, 1, 3e-3), ("train-backward", MODEL_CODE, 1, 4e-3))
    monkeypatch.setattr(host_costs, "host_costs_for", lambda config, device, on_measure=None: HostCosts(rows, "probe"))
    model = arch("llama-3.2-1b")
    request = FitRequest(mode="train", batch=1, seq_len=128)
    with_code = answers_time.with_training_host_code(ceilings, {"model_type": "llama"}, request)
    assert with_code.framework_source == "probe"
    before = training_step_time(model, request, ceilings).phases
    after = training_step_time(model, request, with_code).phases
    assert after["forward"] - before["forward"] == pytest.approx(model.num_layers * 1e-3 + 2e-3)
    assert after["backward"] - before["backward"] == pytest.approx(model.num_layers * 3e-3 + 4e-3)
    lora = FitRequest(mode="train", batch=1, seq_len=128, recipe="lora")
    assert answers_time.with_training_host_code(ceilings, {"model_type": "llama"}, lora) is ceilings
    card = card_ceilings(SPECS_BY_KEY["h100-sxm"], "bf16")
    assert answers_time.with_training_host_code(card, {"model_type": "llama"}, request) is card


def test_no_bench_run_is_one_line_offering_bench_quick(tmp_path) -> None:
    with pytest.raises(UserError, match="bench --quick"):
        measured_ceilings("cpu", "bf16", read_notebook(tmp_path / "results.jsonl"))


# ---------------------------------------------------------------------------------------------- the command

TRAIN_KEYS = ("flops_per_step", "step", "tokens_per_second", "mfu", "train", "sources")
CITATION = re.compile(r"https?://|arXiv|datasheet|stas00/|NVIDIA/|bench run \d+ \(|measured now|formula")


def _time_json(argv: list[str]) -> dict:
    code, out, err = run(["time", *argv, "--json"])
    assert code == 0, err
    return json.loads(out)


def test_time_json_has_the_step_the_run_and_the_sources() -> None:
    report = _time_json(["llama-3.1-8b", "--mode", "train", "--device", "h100", "--dp", "16", "--tp", "8",
                         "--tokens", "1T", "--price", "2.5"])
    for key in TRAIN_KEYS:
        assert key in report
    assert set(report["step"]["phases"]) >= {"forward", "backward", "optimizer", "communication"}
    assert report["step"]["seconds"] == pytest.approx(sum(report["step"]["phases"].values()))
    assert set(report["train"]) >= {"tokens", "flops", "seconds", "device_hours", "cost"}
    assert report["train"]["tokens"] == 10**12 and report["train"]["cost"] == pytest.approx(
        report["train"]["device_hours"] * 2.5)
    assert report["request"]["devices"] == 128
    product = 1.0
    for rung in report["waterfall"][1:]:
        product *= rung["factor"]
    assert product * report["waterfall"][0]["flops_per_s"] == pytest.approx(report["waterfall"][-1]["flops_per_s"])


def test_a_layout_that_cannot_fit_is_timed_and_said_not_to_fit() -> None:
    # 405B by data parallelism alone: every device holds all weights, gradients and AdamW states (over 6 TB).
    argv = ["llama-3.1-405b", "--mode", "train", "--device", "h100", "--devices", "1024"]
    memory = _time_json(argv)["memory"]
    assert memory["fits"] is False and memory["per_device_bytes"] > 6e12 > memory["capacity_bytes"] > 0
    code, out, _ = run(["time", *argv])
    assert code == 0 and out.count("does not fit:") == 1 and "tensor-tutor fit" in out
    # An 8B model over tp 8 fits, and the report says nothing of memory.
    fitted = _time_json(["llama-3.1-8b", "--mode", "train", "--device", "h100", "--dp", "16", "--tp", "8"])["memory"]
    assert fitted["fits"] is True and fitted["per_device_bytes"] <= fitted["capacity_bytes"]
    code, out, _ = run(["time", "llama-3.1-8b", "--mode", "train", "--device", "h100", "--dp", "16", "--tp", "8"])
    assert code == 0 and "does not fit" not in out


def test_every_efficiency_and_bandwidth_in_the_output_carries_a_source() -> None:
    report = _time_json(["llama-3.1-70b", "--mode", "train", "--device", "a100", "--dp", "8", "--tp", "8", "--pp", "2"])
    sources = report["sources"]
    for name in ("matmul", "memory_bandwidth", "peak_flops", "intra_node_link", "inter_node_link", "link_latency"):
        assert CITATION.search(sources[name]), (name, sources[name])
    for collective in report["communication"]:
        assert collective["link"] in sources
    for rung in report["waterfall"]:
        assert rung["source"]


def test_time_on_this_machine_names_the_bench_run(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    _bench_run(tmp_path)
    report = _time_json(["gpt2", "--mode", "train", "--device", "cpu", "--batch", "2", "--seq", "512"])
    assert "bench run 1 (2026-12-01T10:00:00Z)" in report["sources"]["matmul"]
    assert "bench run 1" in report["sources"]["memory_bandwidth"]
    assert report["mfu"]["datasheet"] is not None and report["tokens_per_second"] > 0


def test_inference_answers_prefill_and_decode_by_batch_for_each_engine() -> None:
    """A card by name (the H100's datasheet, the assumed host): eager and CUDA graphs rows at every batch."""
    report = _time_json(["llama-3.1-8b", "--device", "h100", "--seq", "1024"])
    assert report["prefill"]["seconds"] > 0 and report["prefill"]["engine"] == "eager"
    assert set(report["engines"]) == {"eager", "graphs"}
    for engine in ("eager", "graphs"):
        rows = [point for point in report["decode"] if point["engine"] == engine]
        assert [row["batch"] for row in rows] == list(DECODE_BATCHES)
        rates = [row["tokens_per_second"] for row in rows]
        assert rates == sorted(rates)  # more sequences per step, more tokens per second
    graphs = [point for point in report["decode"] if point["engine"] == "graphs"]
    assert graphs[0]["bound"] == "memory" and graphs[0]["host_seconds"] == 0
    eager = [point for point in report["decode"] if point["engine"] == "eager"]
    # Batch-1 eager decode of an 8B model waits on the host's code, not on the weights' bytes.
    assert eager[0]["bound"] == "host" and eager[0]["host_share"] > 0.5
    assert eager[0]["seconds_per_step"] > 3 * graphs[0]["seconds_per_step"]
    assert "measured by this project on an H200" in report["sources"]["framework"]
    assert CITATION.search(report["sources"]["graph_kernel"])


def test_h200_decode_at_batch_1_is_host_bound_eager_and_near_the_floor_with_graphs() -> None:
    """`time --device h200`: the eager row in the range a real H200 host gave (55.9 ms, this project's run), the
    graphs row between the bandwidth floor and the serving engines' published 6.4-7.6 ms on an H100 (slower HBM)."""
    report = _time_json(["llama-3.1-8b", "--device", "h200", "--seq", "2048"])
    one = {point["engine"]: point for point in report["decode"] if point["batch"] == 1}
    weights = count_parameters(arch("llama-3.1-8b")).total * 2
    floor = weights / 4.8e12  # the datasheet's bandwidth: no engine goes below it
    assert 0.02 < one["eager"]["seconds_per_step"] < 0.1 and one["eager"]["bound"] == "host"
    assert floor < one["graphs"]["seconds_per_step"] < 0.010


@pytest.mark.parametrize("argv, message", [
    (["no-such-model", "--mode", "train", "--device", "h100"], "no-such-model"),
    (["gpt2", "--mode", "train", "--device", "h100", "--mfu", "140%"], "--mfu"),
    (["gpt2", "--mode", "train", "--device", "h100", "--tp", "4", "--devices", "6"], "--devices"),
    (["gpt2", "--mode", "train", "--device", "nosuchgpu"], "unknown GPU"),
    (["gpt2", "--mode", "train", "--device", "h100", "--tokens", "lots"], "lots"),
    (["gpt2", "--mode", "train", "--device", "h100", "--overlap", "2"], "--overlap"),
    (["--params", "7B", "--mode", "train", "--device", "h100"], "architecture"),
])
def test_bad_input_is_one_line_and_exit_code_2(argv, message) -> None:
    code, out, err = run(["time", *argv])
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_no_bench_run_from_the_cli_offers_bench_quick(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    code, _out, err = run(["time", "gpt2", "--mode", "train", "--device", "cpu"])
    assert code == 2 and "bench --quick" in err


def test_the_text_view_shows_the_phases_and_the_sources() -> None:
    code, out, err = run(["time", "llama-3.1-8b", "--mode", "train", "--device", "h100", "--dp", "8"])
    assert code == 0, err
    for words in ("One training step", "backward", "Sources", "Waterfall", "device-hours"):
        assert words in out


# ---------------------------------------------------------------------------------------------- LoRA / QLoRA


def test_a_lora_step_has_no_base_weight_gradients_and_steps_only_the_adapters() -> None:
    model = arch("llama-3.2-1b")
    full = training_operations(model, FitRequest(mode="train", batch=1, seq_len=256),
                               params_on_device=count_parameters(model).total)
    lora = training_operations(model, FitRequest(mode="train", recipe="lora", batch=1, seq_len=256),
                               params_on_device=count_parameters(model).total)
    weight_grads = [op.name for op in lora.phase("backward") if op.name.endswith(" dW")]
    assert weight_grads and all(" lora_" in name for name in weight_grads)
    assert not any(op.name.startswith("embedding") for op in lora.phase("backward"))
    assert any(op.name == "q_proj lora_A" for op in lora.phase("forward"))
    (optimizer,) = lora.phase("optimizer")
    adapters = lora_trainable_params(model, rank=16)
    assert optimizer.bytes == pytest.approx(adapters * (20 + 1) * 4, rel=1e-6)  # fp32 adapters + the bf16 copy
    # The frozen base skips its dW (a third of full training's GEMM FLOPs) and the first layer's input grads.
    assert lora.flops("backward") < 0.6 * full.flops("backward")
    assert lora.flops("forward") > full.flops("forward")  # the adapters' own GEMMs


def test_qlora_dequantizes_every_base_weight_before_each_use() -> None:
    model = arch("llama-3.2-1b")
    request = FitRequest(mode="train", recipe="qlora", batch=1, seq_len=256)
    ops = training_operations(model, request, params_on_device=count_parameters(model).total)
    forward = [op for op in ops.phase("forward") if op.name.endswith("dequantize (4-bit to 16-bit)")]
    backward = [op for op in ops.phase("backward") if op.name.endswith("dequantize (4-bit to 16-bit)")]
    assert {op.name.split(" ")[0] for op in forward} == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                          "up_proj", "down_proj"}
    down = next(op for op in forward if op.name.startswith("down_proj"))
    assert down.bytes == pytest.approx(model.hidden_size * model.intermediate_size * (4.127 / 8 + 2), rel=1e-3)
    # dX needs the weight again; the first layer's q/k/v need no dX, so their calls are one layer fewer.
    q_back = next(op for op in backward if op.name.startswith("q_proj"))
    assert q_back.calls == model.num_layers - 1 and down.calls == model.num_layers


def test_time_answers_lora_and_qlora_from_the_cli() -> None:
    full = _time_json(["llama-3.1-8b", "--mode", "train", "--device", "h100", "--seq", "4096"])
    lora = _time_json(["llama-3.1-8b", "--mode", "train", "--recipe", "lora", "--device", "h100", "--seq", "4096"])
    qlora = _time_json(["llama-3.1-8b", "--mode", "train", "--recipe", "qlora", "--device", "h100", "--seq", "4096"])
    assert lora["step"]["seconds"] < full["step"]["seconds"]
    assert lora["step"]["phases"]["optimizer"] < 0.02 * full["step"]["phases"]["optimizer"]
    assert qlora["step"]["seconds"] > lora["step"]["seconds"]  # the dequantization is extra memory traffic
    params = count_parameters(arch("llama-3.1-8b")).total
    assert 4 < lora["model_flops_per_token"] / params < 4.6  # 2N forward + 2N dX + adapters and attention


# ---------------------------------------------------------------------------------------------- fit's suggestions


def test_fit_shows_what_each_suggestion_costs_in_seconds_per_step() -> None:
    code, out, err = run(["fit", "llama-3.1-70b", "--mode", "train", "--device", "h100", "--json"])
    assert code == 0, err
    suggestions = json.loads(out)["suggestions"]
    assert suggestions
    for suggestion in suggestions:
        assert suggestion["step_seconds"] > 0 and suggestion["step_kind"] == "training step"
        assert "H100" in suggestion["step_source"] and "mamf-finder" in suggestion["step_source"]
    from tutor.theory.fit import FitRequest as Request
    first = suggestions[0]
    changed = {c["field"]: c["value"] for c in first["changes"]}
    step = training_step_time(arch("llama-3.1-70b"), Request(mode="train", **changed),
                              card_ceilings(SPECS_BY_KEY["h100-sxm"], "bf16"))
    assert first["step_seconds"] == pytest.approx(step.seconds)
    # Suggestions change the global batch: tokens per second, the whole step's tokens over its time, compares them.
    assert first["tokens_per_second"] == pytest.approx(step.tokens_per_step / step.seconds)
    code, text, err = run(["fit", "llama-3.1-70b", "--mode", "train", "--device", "h100"])
    assert code == 0 and "per training step" in text and "seconds per step" in text
    assert f"({format_rate(first['tokens_per_second'], 'tokens/s')})" in " ".join(text.split())


def test_fit_says_what_bounds_each_suggested_decode_step_and_what_cuda_graphs_make_of_it(tmp_path) -> None:
    """Eager decode of a 14B model at batch 1 is bound by the host's code on a GPU (smaller weights do not
    shorten it); the same step in a CUDA graph is bound by the device, so there int4 beats fp8."""
    config = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 5120,
              "intermediate_size": 13824, "num_attention_heads": 40, "num_key_value_heads": 8,
              "num_hidden_layers": 48, "vocab_size": 152064, "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code, out, err = run(["fit", str(path), "--device", "rtx-4090", "--json"])
    assert code == 0, err
    by_dtype = {s["changes"][0]["value"]: s for s in json.loads(out)["suggestions"]
                if [c["field"] for c in s["changes"]] == ["dtype"]}
    assert {"fp8", "int4"} <= set(by_dtype)
    assert all(s["step_bound"] == "host" for s in by_dtype.values())
    assert by_dtype["int4"]["graphs_step_seconds"] < by_dtype["fp8"]["graphs_step_seconds"]
    code, text, err = run(["fit", str(path), "--device", "rtx-4090"])
    assert code == 0 and "eager, bound by the host; CUDA graphs:" in " ".join(text.split())


def test_fit_on_a_bare_memory_size_says_why_its_suggestions_are_not_timed() -> None:
    code, out, err = run(["fit", "llama-3.1-70b", "--mode", "train", "--device", "24GiB", "--json"])
    assert code == 0, err
    suggestions = json.loads(out)["suggestions"]
    assert suggestions and all(s["step_seconds"] is None and "not timed" in s["step_source"] for s in suggestions)


# ---------------------------------------------------------------------------------------------- the lessons' lab


def test_the_time_to_train_lab_reproduces_the_llama_405b_gpu_hours_from_public_figures() -> None:
    import threading

    from tutor.labs.registry import load_lab

    result = load_lab("time-to-train").run({}, lambda *_: None, threading.Event())
    assert abs(result.metrics["device_hours"] / LLAMA31_405B_GPU_HOURS - 1) < 0.15
    assert result.metrics["days"] == pytest.approx(result.metrics["device_hours"] / 16384 / 24)
    assert result.metrics["mfu"] == pytest.approx(LLAMA3_MFU)
    counted = load_lab("time-to-train").run({"mfu": 0.0}, lambda *_: None, threading.Event())
    assert counted.metrics["days"] != pytest.approx(result.metrics["days"])  # the counted step, not the stated MFU
    with pytest.raises(UserError, match="multiple"):
        load_lab("time-to-train").run({"devices": 1000}, lambda *_: None, threading.Event())


# ---------------------------------------------------------------------------------------------- --verify


@pytest.mark.slow
def test_verify_runs_a_tiny_real_model_and_compares_per_phase() -> None:
    pytest.importorskip("transformers")
    from tutor.trace.step_verify import run_verification
    from tutor.files.models import read_model_config

    result = run_verification(read_model_config("llama-3.2-1b").config, "tiny")
    assert result["predicted_s"] > 0 and result["measured_s"] > 0
    assert set(result["phases"]) == {"forward", "backward", "optimizer"}
    for phase in result["phases"].values():
        assert phase["predicted_s"] > 0 and phase["measured_s"] > 0
    assert result["decode"]["measured_tokens_per_second"] > 0 and result["prefill"]["predicted_s"] > 0
    assert "measured now" in result["sources"]["matmul"]


def _fake_verification(model: str, size: str, recipe: str = "fp32") -> dict:
    phases = {name: {"predicted_s": 0.1, "measured_s": 0.11} for name in ("forward", "backward", "optimizer")}
    return {"model": f"{model} scaled ({size})", "size": size, "scaled": "1 layer", "predicted_s": 0.3,
            "measured_s": 0.33, "measured_wall_s": 0.5, "phases": phases, "notes": [],
            "sources": {"matmul": "measured now (2026-12-02T00:00:00)"},
            "prefill": {"predicted_s": 0.05, "measured_s": 0.06},
            "decode": {"predicted_s": 0.01, "measured_s": 0.011, "predicted_tokens_per_second": 200.0,
                       "measured_tokens_per_second": 180.0, "batch": 2, "context": 32}}


def test_verify_joins_the_json_and_runs_even_without_a_bench_run(tmp_path, monkeypatch) -> None:
    import tutor.commands.time as time_command

    monkeypatch.setattr(time_command, "verify_model", _fake_verification)
    report = _time_json(["llama-3.2-1b", "--mode", "train", "--device", "h100", "--verify", "--verify-size", "tiny"])
    assert {"model", "predicted_s", "measured_s", "phases"} <= set(report["verify"])
    assert report["verify"]["size"] == "tiny" and "flops_per_step" in report
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    alone = _time_json(["llama-3.2-1b", "--mode", "train", "--verify"])
    assert alone["verify"]["phases"]["forward"]["measured_s"] == 0.11
    assert any("bench --quick" in note for note in alone["notes"])
    code, out, err = run(["time", "llama-3.2-1b", "--mode", "train", "--verify"])
    assert code == 0, err
    assert "Verified on this machine" in out and "predicted" in out


@pytest.mark.slow
def test_verify_runs_a_tiny_lora_model_with_frozen_base_and_adapters_only() -> None:
    pytest.importorskip("transformers")
    from tutor.trace.step_verify import run_verification
    from tutor.files.models import read_model_config

    result = run_verification(read_model_config("llama-3.2-1b").config, "tiny", recipe="lora")
    assert result["recipe"] == "lora" and "LoRA r=16" in result["scaled"]
    for phase in result["phases"].values():
        assert phase["predicted_s"] > 0 and phase["measured_s"] > 0
    assert "decode" not in result
    with pytest.raises(UserError, match="qlora"):
        run_verification(read_model_config("llama-3.2-1b").config, "tiny", recipe="qlora")


def test_decode_kv_append_rotates_both_ends_over_the_steps_reuse_distance() -> None:
    torch = pytest.importorskip("torch")
    from tutor.trace.step_verify import REUSE_LIMIT_BYTES, kv_append_call, rotation_copies

    per_call = 2 * 2 * 4 * 2 * 2 * 16 * 8  # keys and values, read and written, of a 2 x 2 x 16 x 8 fp32 cache
    assert rotation_copies(per_call * 10, per_call) == 10
    assert rotation_copies(10 * REUSE_LIMIT_BYTES, per_call) == REUSE_LIMIT_BYTES // per_call
    assert rotation_copies(per_call // 2, per_call, minimum=2) == 2  # a step that fits in the caches stays hot

    call, copies = kv_append_call(torch, 2, 2, 16, 8, reuse_bytes=per_call * 6)
    assert copies == 6
    written = [tuple(t.data_ptr() for t in call()) for _ in range(copies)]
    assert len(set(written)) == copies  # a new destination each call, not the block the allocator just freed
    keys, values = call()
    assert keys.shape == values.shape == (2, 2, 17, 8)


def test_optimizer_probe_steps_the_trained_tensors_own_shapes_with_fresh_gradients_and_zero_grad(monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    import tutor.trace.step_verify as step_verify

    calls: list[tuple[str, tuple]] = []

    class Recording(torch.optim.AdamW):
        def step(self, closure=None):
            params = self.param_groups[0]["params"]
            calls.append(("step", tuple(None if p.grad is None else p.grad.clone() for p in params)))
            return super().step(closure)

        def zero_grad(self, set_to_none: bool = True) -> None:
            calls.append(("zero_grad", ()))
            super().zero_grad(set_to_none)

    monkeypatch.setattr(torch.optim, "AdamW", Recording)
    arch = resolve_model("llama-3.2-1b")[0]
    request = FitRequest(mode="train", recipe="fp32", dtype="fp32", optimizer="adamw", gpu=False)
    op = training_operations(arch, request, params_on_device=count_parameters(arch).total).operations[-1]
    shapes = ((8, 4), (4,), (3, 8))
    name, rate = step_verify.optimizer_rate(torch, op, arch, request, shapes, reuse_bytes=4096)
    assert name == f"optimizer:{op.name}" and rate > 0
    steps = [grads for kind, grads in calls if kind == "step"]
    assert len(steps) == 1 + step_verify.OPTIMIZER_REPEATS  # one to create the moments, then the timed ones
    assert [kind for kind, _ in calls[1:]] == ["step", "zero_grad"] * step_verify.OPTIMIZER_REPEATS
    for grads in steps:  # every tensor of the model's own shapes, each with a gradient
        assert tuple(tuple(g.shape) for g in grads) == shapes
    for before, after in zip(steps[1:], steps[2:]):  # rewritten before each call, as a backward writes them
        assert not any(torch.equal(a, b) for a, b in zip(before, after))


def test_measuring_an_optimizer_step_needs_the_trained_tensors_shapes() -> None:
    pytest.importorskip("torch")
    from tutor.trace.step_verify import measure_ceilings, verify_setup
    from tutor.files.models import read_model_config

    setup = verify_setup(read_model_config("llama-3.2-1b").config, "tiny")
    optimizer = [op for op in training_operations(setup.arch, setup.request, params_on_device=1).operations
                 if op.phase == "optimizer"]
    with pytest.raises(ValueError, match="parameter_shapes"):
        measure_ceilings(optimizer, setup.arch, setup.request, queries=32, context=32, training=True)


def test_a_training_forwards_outputs_are_held_over_the_reuse_distance_and_inference_holds_none() -> None:
    torch = pytest.importorskip("torch")
    from tutor.trace.step_verify import evict_caches, held_outputs

    assert held_outputs(torch, 0, 4096) is None
    held = held_outputs(torch, 10 * 400, 400)
    assert held is not None and len(held) == held.maxlen == 10
    assert all(block.numel() == 100 for block in held)
    first = held[0]
    held.append(torch.ones(100))  # a new output takes the place of the oldest block, held 10 outputs ago
    assert len(held) == 10 and all(block is not first for block in held) and held[-1].sum() == 100
    assert len(held_outputs(torch, 100, 400)) == 1  # an output larger than the distance: one block of the distance

    buffer = torch.zeros(1000)
    evict_caches(buffer)
    assert bool((buffer == 1).all())  # every element read and written


def test_a_backward_probe_forgets_its_leaves_gradients_so_none_is_accumulated() -> None:
    torch = pytest.importorskip("torch")
    from tutor.trace.step_verify import drop_gradients

    x = torch.ones(4, requires_grad=True)
    for _ in range(2):
        drop_gradients([x])
        (x * 3).sum().backward()
    assert x.grad is not None and x.grad.tolist() == [3.0] * 4  # the last backward's gradient, not the sum of two
    drop_gradients([x])
    assert x.grad is None


def test_a_backward_is_timed_by_itself_on_a_fresh_forward_each_repeat() -> None:
    torch = pytest.importorskip("torch")
    from tutor.trace.step_verify import backward_seconds

    x = torch.ones(4, requires_grad=True)
    forwards = []

    def forward():
        forwards.append(1)
        return x * 2, "a second output, as the KV cache append returns"

    seconds = backward_seconds(forward, [x], torch.ones(4), 3)
    assert len(forwards) == 4  # one untimed warm-up, then a new graph for each timed backward
    assert x.grad is not None and x.grad.tolist() == [2.0] * 4  # each backward's gradient alone, none accumulated
    assert seconds > 0


def _fp32_bench_run(data_dir) -> None:
    """A bench run with an fp32 matmul and a triad on this machine's CPU (what `time --device cpu` reads)."""
    header = {"date": "2026-12-01T10:00:00Z", "cancelled": False}
    results = [{"kind": "matmul", "device": "cpu", "dtype": "fp32", "backend": "torch/mkl", "m": 1024, "n": 1024,
                "k": 1024, "tflops_median": 0.1, "peak_tflops": 0.2, "peak_source": "test", "headline": True},
               {"kind": "bandwidth", "device": "cpu", "op": "triad", "bytes": 3 * 2**27, "gbps_median": 20.0}]
    assert append_run(header, results, data_dir / "results.jsonl") is None


def test_every_time_example_of_the_readme_runs_as_printed_and_fits(tmp_path, monkeypatch) -> None:
    """The README's `tensor-tutor time` lines (continuations joined, --verify left to the verify tests), run as a user
    would after a bench run: each answers, and none is timed under a 'does not fit' line (the CPU example is held to
    that only where this machine's RAM holds it: about 14 GB)."""
    from pathlib import Path

    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    _fp32_bench_run(tmp_path)
    text = (Path(__file__).parent.parent / "README.md").read_text()
    section = text[text.index("### How long: `tensor-tutor time`"):]
    start = section.index("```bash") + len("```bash")
    lines = section[start:section.index("```", start)].replace("\\\n", " ").splitlines()
    examples = [line.split("#")[0].split()[1:] for line in lines if line.startswith("tensor-tutor time")]
    examples = [argv for argv in examples if "--verify" not in argv]
    assert len(examples) >= 4
    for argv in examples:
        code, out, err = run([*argv, "--json"])
        assert code == 0, (argv, err)
        memory = json.loads(out)["memory"]
        if "cpu" not in argv or memory["capacity_bytes"] >= memory["per_device_bytes"] * 1.1:
            assert memory["fits"] is True, (argv, memory)


@pytest.mark.parametrize("device", ["cpu", "h100"])
def test_time_s_memory_per_device_is_fit_s(device, tmp_path, monkeypatch) -> None:
    """One story: the bytes `time` checks a layout against are the ones `fit` shows for the same request on the same
    device (a CPU holds no CUDA context)."""
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    _fp32_bench_run(tmp_path)
    argv = ["llama-3.2-1b", "--mode", "train", "--recipe", "fp32", "--seq", "1024", "--device", device, "--json"]
    code, out, err = run(["fit", *argv])
    assert code == 0, err
    fitted = json.loads(out)
    timed = _time_json(argv[:-1])
    assert timed["memory"]["per_device_bytes"] == fitted["per_device_bytes"]["total"]
