"""What a CPU core pays beyond an op's bytes: transcendental functions evaluated per element (timed at their measured
rates, the op bound by the slower roof) and memory written on freshly mapped pages (page faults, counted by glibc's
rules and checked against the faults a real AdamW step takes)."""

from __future__ import annotations

import platform
import resource
import sys

import pytest

from tutor.bench.ceilings import measured_ceilings
from tutor.bench.notebook import append_run, read_notebook
from tutor.files.models import resolve_model
from tutor.theory.fit import FitRequest
from tutor.theory.step_operations import (
    ADAMW_TEMPORARIES,
    ELEMENTWISE_FUNCTIONS,
    FRESH_MAPPING_BYTES,
    fresh_block,
    fresh_page_operations,
    parameter_tensors,
    training_operations,
)
from tutor.theory.models import count_parameters
from tutor.theory.step_time import BandwidthPoint, Ceilings, GemmPoint, Sourced, operation_seconds

TRAIN = FitRequest(mode="train", recipe="fp32", dtype="fp32", optimizer="adamw", batch=4, seq_len=128, gpu=False)


def _ceilings(**extra) -> Ceilings:
    return Ceilings(device="cpu", dtype="fp32", gemm_points=(GemmPoint(512, 512, 512, 1e11),), gemm_source="test",
                    bandwidth_points=(BandwidthPoint(1 << 30, 40e9),), bandwidth_source="test", **extra)


def _ops(name: str, request: FitRequest = TRAIN):
    arch = resolve_model(name)[0]
    return arch, training_operations(arch, request, params_on_device=count_parameters(arch).total).operations


def test_each_op_names_the_functions_torch_evaluates_forward_and_backward() -> None:
    _, ops = _ops("gemma-2-2b")
    by = {(op.phase, op.name): op for op in ops}
    activation = next(op for (phase, name), op in by.items() if phase == "forward" and "(gate) * up" in name)
    assert [f for f, _ in activation.functions] == ["gelu tanh"]  # gemma-2: gelu_pytorch_tanh
    backward = by[("backward", activation.name)]
    assert [f for f, _ in backward.functions] == ["gelu tanh backward"]
    assert by[("forward", "cross-entropy (fp32 logits)")].functions[0][0] == "log_softmax"
    assert by[("backward", "cross-entropy (fp32 logits)")].functions[0][0] == "log_softmax backward"
    assert by[("forward", "logit soft-capping")].functions[0][0] == "tanh"
    assert by[("backward", "logit soft-capping")].functions == ()  # 1 - tanh², from the saved output: memory
    named = {f for op in ops for f, _ in op.functions}
    assert named <= set(ELEMENTWISE_FUNCTIONS)
    _, llama = _ops("llama-3.2-1b")
    assert {f for op in llama for f, _ in op.functions} == {"silu", "silu backward", "log_softmax",
                                                             "log_softmax backward"}


def test_an_elementwise_op_takes_the_longer_of_its_bytes_and_its_functions() -> None:
    _, ops = _ops("gemma-2-2b")
    capping = next(op for op in ops if op.name == "logit soft-capping" and op.phase == "forward")
    (_, elements), = capping.functions
    plain = _ceilings()
    slow = _ceilings(elementwise_rates=(("tanh", 0.5e9),), elementwise_source="test")
    fast = _ceilings(elementwise_rates=(("tanh", 1e15),), elementwise_source="test")
    assert operation_seconds(plain, capping) == pytest.approx(capping.calls * capping.bytes / 40e9)
    assert operation_seconds(slow, capping) == pytest.approx(capping.calls * elements / 0.5e9)
    assert operation_seconds(fast, capping) == operation_seconds(plain, capping)  # the bytes bound it
    assert "elementwise_functions" in slow.sources() and "elementwise_functions" not in plain.sources()


def test_blocks_on_fresh_pages_follow_glibcs_thresholds() -> None:
    assert fresh_block(FRESH_MAPPING_BYTES, largest_other=1 << 40)  # always mapped fresh from 32 MiB
    assert fresh_block(8 << 20, largest_other=4 << 20)  # the step's largest block: the heap's top is trimmed
    assert not fresh_block(4 << 20, largest_other=8 << 20)  # a larger block keeps the heap's top mapped
    # A large model: every weight matrix from 32 MiB up has its AdamW temporaries on fresh pages; its gradient is
    # its dW GEMM's output, counted on the GEMM.
    arch, ops = _ops("llama-3.1-8b", FitRequest(mode="train", recipe="fp32", dtype="fp32", optimizer="adamw",
                                                batch=1, seq_len=2048, gpu=False))
    (temporaries,) = [op for op in ops if op.phase == "optimizer"]
    per_tensor = [4 * n * count for _, n, count in parameter_tensors(arch) if 4 * n >= FRESH_MAPPING_BYTES]
    assert temporaries.fresh_bytes == ADAMW_TEMPORARIES * sum(per_tensor) > 0
    gate = next(op for op in ops if op.name == "gate_proj dW")
    assert gate.fresh_bytes == 4096 * 14336 * 4  # the gradient, a new block of 224 MiB
    lm_head = next(op for op in ops if op.name == "lm_head" and op.phase == "forward")
    assert lm_head.fresh_bytes == 2048 * 128256 * 4  # the logits
    touch = _ceilings(first_touch=Sourced(3e9, "B/s", "test"))
    assert operation_seconds(touch, temporaries) == pytest.approx(operation_seconds(_ceilings(), temporaries)
                                                                  + temporaries.fresh_bytes / 3e9)
    assert fresh_page_operations(arch, FitRequest(mode="train", recipe="lora", dtype="fp32", batch=1, seq_len=64,
                                                  gpu=False), [], fused=False) == ([], 0)


ADAMW_FAULTS = """
import resource, sys, torch
elements = int(sys.argv[1]) // 4
param = torch.nn.Parameter(torch.zeros(elements))
param.grad = torch.ones(elements)
optimizer = torch.optim.AdamW([param], lr=1e-4)
optimizer.step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
optimizer.step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc rules")
def test_a_real_adamw_step_faults_in_the_temporaries_counted_for_a_32_mib_tensor() -> None:
    """In a process of its own, as a training run is (a long-lived process may have moved malloc's thresholds)."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", ADAMW_FAULTS, str(FRESH_MAPPING_BYTES)], capture_output=True,
                          text=True, timeout=120, check=True)
    pages = ADAMW_TEMPORARIES * FRESH_MAPPING_BYTES // resource.getpagesize()
    assert 0.9 * pages <= int(done.stdout.split()[-1]) <= 1.2 * pages


LINEAR_FAULTS = """
import resource, sys, torch
rows, width = int(sys.argv[1]), int(sys.argv[2])
x, w = torch.randn(rows, width), torch.randn(width, width)
larger = torch.randn(max(rows, 4096), width)  # another op's larger output, as a step has
for _ in range(3):  # the heap grown to its steady state, as after a step's warm-up
    torch.nn.functional.linear(larger, w)
    torch.nn.functional.linear(x, w)
torch.nn.functional.linear(larger, w)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
y = torch.nn.functional.linear(x, w)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc rules")
def test_a_real_linear_faults_in_the_output_counted_for_it() -> None:
    """A GEMM's output of 32 MiB is a new block on fresh pages every call, as gemm counts it; a 1 MiB one beside a
    larger block comes back from the heap, counted as none."""
    import subprocess

    from tutor.theory.step_operations import gemm

    for rows, width in ((4096, 2048), (512, 512)):
        op = gemm("up_proj", "forward", rows, width, width, calls=1, element_bytes=4)
        done = subprocess.run([sys.executable, "-c", LINEAR_FAULTS, str(rows), str(width)], capture_output=True,
                              text=True, timeout=120, check=True)
        faults = int(done.stdout.split()[-1])
        pages = op.fresh_bytes // resource.getpagesize()
        assert 0.9 * pages <= faults <= 1.2 * pages + 16
    assert gemm("up_proj", "forward", 4096, 2048, 2048, calls=1, element_bytes=4).fresh_bytes == FRESH_MAPPING_BYTES


def test_fused_attention_runs_at_the_kernels_measured_rate_by_sequence_and_mlas_math_path_on_the_whole_square() -> None:
    from tutor.theory.step_operations import SDPA_KERNEL, SDPA_MATH

    _, ops = _ops("mistral-7b", FitRequest(mode="train", recipe="fp32", dtype="fp32", optimizer="adamw", batch=1,
                                           seq_len=1024, attention="sdpa", gpu=False))
    scores = next(op for op in ops if op.name.startswith("attention scores") and op.phase == "forward")
    backward = next(op for op in ops if op.name.startswith("attention scores") and op.phase == "backward")
    assert scores.kernel == backward.kernel == SDPA_KERNEL and scores.m == 1024
    curve = (("forward", 128, 30e9), ("forward", 2048, 60e9), ("backward", 128, 20e9), ("backward", 2048, 40e9))
    measured = _ceilings(attention_rates=curve, attention_source="test")
    between = 30e9 * 2 ** 0.75  # log-log: 1024 is 3/4 of the way from 128 to 2048 in log2, the rate doubles over it
    assert operation_seconds(measured, scores) == pytest.approx(scores.calls * scores.flops / between)
    assert operation_seconds(measured, backward) == pytest.approx(backward.calls * backward.flops / (between * 2 / 3))
    assert operation_seconds(_ceilings(), scores) == pytest.approx(scores.calls * scores.flops / 1e11)  # the curve
    assert "attention_kernel" in measured.sources()
    # DeepSeek-V3's MLA (query/key 192 wide, values 128): SDPA falls back to its math path, the whole square.
    _, mla = _ops("deepseek-v3", FitRequest(mode="train", recipe="fp32", dtype="fp32", optimizer="adamw", batch=1,
                                            seq_len=256, attention="sdpa", gpu=False))
    square = next(op for op in mla if op.name.startswith("attention scores") and op.phase == "forward")
    assert square.kernel == SDPA_MATH and square.flops == 2 * 256 * 256 * 192 * square.batch
    assert operation_seconds(measured, square) == operation_seconds(_ceilings(), square)  # plain bmm: the curve
    assert any(op.name == "sdpa math: mask + softmax" for op in mla)


def test_the_bench_times_the_attention_kernel_forward_and_backward_by_sequence(tmp_path) -> None:
    from tutor.bench.attention import SEQUENCES, attention_rates

    assert attention_rates("cuda:0") == []
    results = [r.to_json() for r in attention_rates("cpu")]
    assert sorted((r["phase"], r["seq"]) for r in results) == sorted(
        (phase, seq) for phase in ("forward", "backward") for seq in SEQUENCES)
    header = {"date": "2026-12-05T10:00:00Z", "cancelled": False}
    base = [{"kind": "matmul", "device": "cpu", "dtype": "fp32", "backend": "torch/mkl", "m": 512, "n": 512, "k": 512,
             "tflops_median": 0.1, "peak_tflops": 0.2, "peak_source": "test", "headline": True},
            {"kind": "bandwidth", "device": "cpu", "op": "triad", "bytes": 3 * 2**27, "gbps_median": 40.0}]
    assert append_run(header, base + results, tmp_path / "results.jsonl") is None
    ceilings = measured_ceilings("cpu", "fp32", read_notebook(tmp_path / "results.jsonl"))
    assert len(ceilings.attention_rates) == 2 * len(SEQUENCES) and "bench run 1" in ceilings.attention_source
