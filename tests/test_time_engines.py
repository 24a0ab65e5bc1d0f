"""Inference under each engine: eager (the host's code beside or before the device's work) and CUDA graphs (the
device's work, each kernel at least the graph's floor); the host's costs measured per family and kept; the
matrix-vector bandwidth a decode step's matmuls stream at."""

from __future__ import annotations

import json
import math

import pytest

from tests.cli_runner import run
from tutor.trace import host_costs
from tutor.bench.ceilings import measured_ceilings
from tutor.bench.notebook import append_run, read_notebook
from tutor.files.models import read_model_config, resolve_model
from tutor.theory.fit import FitRequest
from tutor.theory.step_operations import DEQUANTIZE, LAYER_CODE, MODEL_CODE, gemm, inference_operations
from tutor.theory.step_time import (
    BandwidthPoint,
    Ceilings,
    GemmPoint,
    HostCosts,
    Sourced,
    decode_step,
    engine_steps,
    operation_seconds,
)


def _ceilings(**extra) -> Ceilings:
    return Ceilings(device="test", dtype="bf16", gemm_points=(GemmPoint(4096, 4096, 4096, 500e12),),
                    gemm_source="test", bandwidth_points=(BandwidthPoint(1 << 30, 3e12),), bandwidth_source="test",
                    **extra)


HOST = HostCosts((("decode", LAYER_CODE, 1, 1e-3), ("decode", LAYER_CODE, 8, 2e-3), ("decode", MODEL_CODE, 1, 5e-3),
                  ("prefill", LAYER_CODE, 1, 1e-3), ("prefill", MODEL_CODE, 1, 0.0)), "test host")


def _decode_ops(batch: int = 1):
    model = resolve_model("llama-3.1-8b")[0]
    return inference_operations(model, FitRequest(mode="inference", batch=batch, seq_len=1024), queries=1, context=1024)


def test_host_costs_interpolate_in_batch_and_hold_beyond_the_measured_batches() -> None:
    assert HOST.seconds("decode", LAYER_CODE, 1) == 1e-3
    assert HOST.seconds("decode", LAYER_CODE, 4) == pytest.approx(1e-3 + 1e-3 * 3 / 7)
    assert HOST.seconds("decode", LAYER_CODE, 128) == 2e-3
    assert HOST.seconds("decode", MODEL_CODE, 32) == 5e-3
    assert HOST.seconds("train", LAYER_CODE, 1) is None


def test_on_a_cpu_the_eager_step_is_the_device_work_plus_the_host_code() -> None:
    (eager,) = engine_steps(_ceilings(host=HOST), _decode_ops(), mode="decode", batch=1)
    assert eager.host_seconds == pytest.approx(32 * 1e-3 + 5e-3)
    assert eager.seconds == pytest.approx(eager.device_seconds + eager.host_seconds)
    assert eager.bound == ("host" if eager.host_seconds > eager.device_seconds else "memory")


def test_on_a_gpu_the_host_queues_ahead_so_eager_is_the_longer_and_graphs_drop_the_host() -> None:
    ceilings = _ceilings(host=HOST, host_overlaps=True, graph_kernel=Sourced(3e-6, "s", "test floor"))
    eager, graphs = engine_steps(ceilings, _decode_ops(), mode="decode", batch=1)
    assert eager.seconds == pytest.approx(max(eager.device_seconds, eager.host_seconds))
    assert eager.bound == "host"  # 37 ms of Python against ~5 ms of weights at 3 TB/s
    assert graphs.engine == "graphs" and graphs.host_seconds == 0 and graphs.bound == "memory"
    # Every kernel pays at least the floor: the step is above the roofline's device work without launches.
    no_launch = sum(operation_seconds(ceilings, op) for op in _decode_ops() if op.kernels)
    assert no_launch < graphs.seconds < eager.seconds
    kernels = sum(op.calls * op.kernels for op in _decode_ops())
    assert graphs.seconds >= kernels * 3e-6
    # A larger floor, a slower graph.
    slower = engine_steps(_ceilings(host=HOST, host_overlaps=True, graph_kernel=Sourced(6e-6, "s", "x")),
                          _decode_ops(), mode="decode", batch=1)[1]
    assert slower.seconds > graphs.seconds


def test_without_host_costs_eager_is_the_device_work_and_says_the_host_is_not_counted() -> None:
    (eager,) = engine_steps(_ceilings(), _decode_ops(), mode="decode", batch=1)
    assert eager.host_seconds is None and eager.seconds == eager.device_seconds
    assert "not" in eager.source and "framework" in eager.source


def test_decode_matmuls_stream_at_the_measured_matrix_vector_bandwidth() -> None:
    plain = _ceilings()
    skinny = _ceilings(decode_matmul=((1, 1 << 20, 0.5e12), (1, 1 << 30, 1e12), (8, 1 << 30, 0.5e12)),
                       decode_matmul_source="test")
    one = gemm("q_proj", "forward", 1, 4096, 4096, calls=1, element_bytes=2)
    four = gemm("q_proj", "forward", 4, 4096, 4096, calls=1, element_bytes=2)
    tall = gemm("q_proj", "forward", 1024, 4096, 4096, calls=1, element_bytes=2)
    # 32 MiB of weights, between the 1 MiB and 1 GiB points: log-log between 0.5 and 1 TB/s.
    between = 0.5e12 * (1e12 / 0.5e12) ** ((math.log(one.bytes) - math.log(1 << 20)) / (math.log(1 << 30) - math.log(1 << 20)))
    assert operation_seconds(skinny, one) == pytest.approx(one.bytes / between)
    small = gemm("q_proj", "forward", 1, 256, 256, calls=1, element_bytes=2)
    assert operation_seconds(skinny, small) == pytest.approx(small.bytes / 0.5e12)  # below the smallest: flat
    assert operation_seconds(plain, one) == pytest.approx(one.bytes / 3e12)
    four_rate = between + (0.5e12 - between) * 3 / 7  # linear in m from m = 1 to m = 8, at its own bytes
    assert operation_seconds(skinny, four) == pytest.approx(four.bytes / four_rate, rel=1e-3)
    assert operation_seconds(skinny, tall) == operation_seconds(plain, tall)  # a prefill's GEMM: the curve
    step = decode_step(resolve_model("llama-3.2-1b")[0], FitRequest(mode="inference", batch=1, seq_len=512),
                       skinny, batch=1, context=512)
    assert step.seconds > decode_step(resolve_model("llama-3.2-1b")[0], FitRequest(mode="inference", batch=1,
                                      seq_len=512), plain, batch=1, context=512).seconds


def _bench_run_with_decode_figures(data_dir, device: str = "cpu") -> None:
    header = {"date": "2026-12-04T10:00:00Z", "cancelled": False}
    results = [
        {"kind": "matmul", "device": device, "dtype": "bf16", "backend": "torch/mkl", "m": 1024, "n": 1024,
         "k": 1024, "tflops_median": 0.5, "peak_tflops": 1.0, "peak_source": "test", "headline": True},
        {"kind": "bandwidth", "device": device, "op": "triad", "bytes": 3 * 2**27, "gbps_median": 40.0},
        {"kind": "decode_matmul", "device": device, "dtype": "bf16", "m": 1, "n": 2048, "k": 2048, "bytes": 2**23,
         "gbps_median": 15.0},
        {"kind": "decode_matmul", "device": device, "dtype": "bf16", "m": 8, "n": 2048, "k": 2048, "bytes": 2**23,
         "gbps_median": 9.0},
        {"kind": "decode_matmul", "device": device, "dtype": "fp32", "m": 1, "n": 2048, "k": 2048, "bytes": 2**24,
         "gbps_median": 1.0},
        {"kind": "decode_matmul", "device": device, "dtype": "bf16", "m": 1, "n": 2048, "k": 2048, "gbps_median": 1.0},
        {"kind": "launch", "device": device, "eager_launch_s": 6e-6, "graph_kernel_s": 2.5e-6, "kernels": 500},
    ]
    assert append_run(header, results, data_dir / "results.jsonl") is None


def test_a_bench_run_gives_the_decode_matmul_points_and_on_cuda_the_graph_floor(tmp_path) -> None:
    _bench_run_with_decode_figures(tmp_path)
    cpu = measured_ceilings("cpu", "bf16", read_notebook(tmp_path / "results.jsonl"))
    # a row without its bytes (a hand-edited notebook) is left out, not guessed
    assert cpu.decode_matmul == ((1, 2**23, 15e9), (8, 2**23, 9e9)) and "bench run 1" in cpu.decode_matmul_source
    assert cpu.graph_kernel is None and not cpu.host_overlaps  # a CPU runs no CUDA graphs; host and work are serial
    other = tmp_path / "gpu"
    other.mkdir()
    _bench_run_with_decode_figures(other, "cuda:0")
    gpu = measured_ceilings("cuda:0", "bf16", read_notebook(other / "results.jsonl"))
    assert gpu.host_overlaps and gpu.graph_kernel is not None and gpu.graph_kernel.value == 2.5e-6
    assert "bench run 1" in gpu.graph_kernel.source


def test_time_on_this_cpu_reports_eager_rows_only_with_the_measured_matrix_vector_source(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    _bench_run_with_decode_figures(tmp_path)
    code, out, err = run(["time", "llama-3.2-1b", "--device", "cpu", "--seq", "512", "--json"])
    assert code == 0, err
    report = json.loads(out)
    assert {row["engine"] for row in report["decode"]} == {"eager"}
    assert "bench run 1" in report["sources"]["decode_matmul"]
    # Measuring is off in tests and nothing is cached: the output says the host's code is not counted.
    assert report["decode"][0]["host_share"] is None and "not" in report["decode"][0]["source"]


def test_the_host_costs_of_a_family_are_measured_once_on_the_cpu_and_then_read_back(tmp_path, monkeypatch) -> None:
    """Measures on the CPU (device "cpu"), whatever else the machine has."""
    pytest.importorskip("transformers")
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    config = read_model_config("qwen3-0.6b").config
    assert host_costs.host_costs_for(config, "cpu") is None  # measuring is off (tests' default), nothing cached
    monkeypatch.setenv(host_costs.MEASURE_ENV, "1")
    costs = host_costs.host_costs_for(config, "cpu")
    assert costs is not None and "qwen3" in costs.source and "measured" in costs.source
    for mode, batch in (("prefill", 1), ("decode", 1), ("decode", 8)):
        assert costs.seconds(mode, LAYER_CODE, batch) > 0  # a decoder layer's code is never free
    assert host_costs.cache_path().is_file()

    def refuse(*args, **kwargs):
        raise AssertionError("measured again")

    monkeypatch.setattr(host_costs, "measure_host_costs", refuse)
    assert host_costs.host_costs_for(config, "cpu") == costs
    # Another family is another key: not in the cache, and measuring it now fails -> no host term, no traceback.
    assert host_costs.host_costs_for(read_model_config("gpt2").config, "cpu") is None


def test_a_damaged_host_costs_cache_is_only_a_miss(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    host_costs.cache_path().parent.mkdir(parents=True)
    for text in ("{not json", json.dumps({"format": 1, "entries": {"x": {"rows": [["decode", "a", 1, -1]]}}}), "[]"):
        host_costs.cache_path().write_text(text)
        assert host_costs.host_costs_for(read_model_config("gpt2").config, "cpu") is None


def test_the_decode_matmul_bench_measures_both_row_counts_on_the_cpu() -> None:
    """On the CPU (device "cpu"), with a tiny budget: each row count timed once at least."""
    pytest.importorskip("torch")
    from tutor.bench.decode_gemm import DECODE_ROWS, decode_matmul_bandwidth

    results = decode_matmul_bandwidth("cpu", "fp32", budget_s=0.01)
    assert [r.m for r in results] == list(DECODE_ROWS)[:len(results)] and results
    assert all(r.gbps_median > 0 and r.to_json()["kind"] == "decode_matmul" for r in results)


def test_an_mla_decode_step_re_projects_its_cached_latents_over_the_whole_context() -> None:
    """transformers' DeepseekV3Attention keeps the latent (kv_lora_rank + the RoPE key) and runs kv_b_proj over
    every cached token at each step; a prefill and a training step project their own tokens only."""
    model = resolve_model("deepseek-v3")[0]
    request = FitRequest(mode="inference", batch=2, seq_len=512)
    ops = inference_operations(model, request, queries=1, context=512)
    kv_b = [op for op in ops if op.name == "kv_b_proj"]
    assert kv_b and all(op.m == 2 * 512 and op.k == model.kv_lora_rank for op in kv_b)
    append = next(op for op in ops if op.name.startswith("KV cache append"))
    assert append.bytes == 2 * 512 * (model.kv_lora_rank + model.qk_rope_head_dim) * 2 * 2  # read + write, bf16
    assert any(op.name.startswith("keys assembled") for op in ops)
    prefill = inference_operations(model, request, queries=512, context=512)
    assert all(op.m == 2 * 512 for op in prefill if op.name == "kv_b_proj")
    assert not any(op.name.startswith("keys assembled") for op in prefill)


def test_quantized_linears_are_read_packed_and_bitsandbytes_dequantizes_several_rows() -> None:
    """Decode reads each block linear at its format's bytes (tutor.theory.memory, scales included); bitsandbytes
    4-bit multiplies one row from the packed weight, several rows after a dequantize; the LM head stays 16-bit."""
    from tutor.theory.memory import weight_format

    model = resolve_model("llama-3.1-8b")[0]
    plain = {op.name: op for op in inference_operations(model, FitRequest(mode="inference", batch=1, seq_len=1024),
                                                        queries=1, context=1024)}
    int4 = {op.name: op for op in inference_operations(
        model, FitRequest(mode="inference", batch=1, seq_len=1024, dtype="int4"), queries=1, context=1024)}
    packed = float(weight_format("int4").bits_per_weight) / 8
    q = int4["q_proj"]
    assert q.bytes == math.ceil(2 * (q.m * q.k + q.m * q.n) + packed * q.k * q.n) and q.bytes < plain["q_proj"].bytes / 3
    assert int4["lm_head"].bytes == plain["lm_head"].bytes
    one = inference_operations(model, FitRequest(mode="inference", batch=1, seq_len=1024, dtype="nf4"),
                               queries=1, context=1024)
    eight = inference_operations(model, FitRequest(mode="inference", batch=8, seq_len=1024, dtype="nf4"),
                                 queries=1, context=1024)
    assert not any("dequantize" in op.name for op in one)
    linears = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert {op.name for op in eight if "dequantize" in op.name} == {f"{name}{DEQUANTIZE}" for name in linears}


def test_time_decodes_int4_weights_faster_than_bf16_and_a_gptq_config_as_fit_reads_it(tmp_path) -> None:
    """A card by name (H100): batch-1 decode under CUDA graphs is bound by the weights' bytes; a config.json with
    a GPTQ quantization_config is timed with the format `fit` reads from it."""
    def graphs_one(argv):
        report = json.loads(run(["time", *argv, "--device", "h100", "--seq", "2048", "--json"])[1])
        return next(r for r in report["decode"] if r["engine"] == "graphs" and r["batch"] == 1), report

    bf16, _ = graphs_one(["llama-3.1-8b"])
    int4, report = graphs_one(["llama-3.1-8b", "--dtype", "int4"])
    assert int4["seconds_per_step"] < 0.75 * bf16["seconds_per_step"] and report["request"]["weights"] == "int4"
    config = dict(read_model_config("llama-3.1-8b").config,
                  quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 128})
    (tmp_path / "config.json").write_text(json.dumps(config))
    gptq, report = graphs_one([str(tmp_path / "config.json")])
    assert report["request"]["weights"] == "gptq-int4-g128"
    assert gptq["seconds_per_step"] == pytest.approx(int4["seconds_per_step"], rel=0.01)  # the same packed layout
    assert any("quantization_config" in note for note in report["notes"])
    fitted = json.loads(run(["fit", str(tmp_path / "config.json"), "--device", "h100", "--seq", "2048", "--json"])[1])
    assert report["memory"]["per_device_bytes"] == fitted["per_device_bytes"]["total"]
