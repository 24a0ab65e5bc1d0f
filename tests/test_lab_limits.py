"""Labs refuse, with the numbers, what this machine cannot hold or finish: the estimate
against the memory available now and against the rate `bench matmul` measured here, else the peak."""

from __future__ import annotations

import time

import pytest

import tutor.labs.limits
from tutor.bench.notebook import Notebook, Run, last_matmul_tflops
from tutor.errors import UserError
from tutor.labs import run_probe
from tutor.labs.limits import ComputeRate, check_lab_fits, lab_compute_rate

from tests.cli_runner import run
from tests.machines import recorded_machine

MACHINE = recorded_machine()


def matmul_run(number: int, tflops: float, *, date: str = "2025-03-01T10:00:00+00:00", cancelled: bool = False,
               machine=MACHINE, dtype: str = "fp32") -> Run:
    header = {"date": date, "machine": machine.to_json(), **({"cancelled": True} if cancelled else {})}
    results = ({"kind": "matmul", "device": "cpu", "dtype": dtype, "tflops_median": tflops, "headline": True},
               {"kind": "matmul", "device": "cpu", "dtype": dtype, "tflops_median": 99.0, "headline": False})
    return Run(number, header, results)


def test_a_matmul_measured_while_the_machine_was_busy_is_not_the_rate_a_lab_is_refused_at() -> None:
    busy = matmul_run(2, 1e-4, date="2025-02-01T00:00:00+00:00")
    busy.results[0]["busy"] = {"busy": True, "other_share": 0.9, "own_share": 0.1}
    notebook = Notebook(runs=(matmul_run(1, 0.05, date="2025-01-01T00:00:00+00:00"), busy), corrupt_lines=0)
    assert last_matmul_tflops(notebook, device="cpu", dtype="fp32", machine=MACHINE) == (0.05, "2025-01-01T00:00:00+00:00")
    quiet = matmul_run(3, 0.06, date="2025-03-01T00:00:00+00:00")
    quiet.results[0]["busy"] = {"busy": False, "other_share": 0.01, "own_share": 1.0}
    notebook = Notebook(runs=(*notebook.runs, quiet), corrupt_lines=0)
    assert last_matmul_tflops(notebook, device="cpu", dtype="fp32", machine=MACHINE) == (0.06, "2025-03-01T00:00:00+00:00")


def test_the_last_finished_matmul_of_this_machine_is_the_measured_rate() -> None:
    other = recorded_machine(gpus=[])
    other = type(other)(cpu=type(other.cpu)(**{**other.cpu.__dict__, "model_name": "Other CPU"}), gpus=[],
                        nvml=other.nvml)
    notebook = Notebook(runs=(matmul_run(1, 0.05, date="2025-01-01T00:00:00+00:00"),
                              matmul_run(2, 0.07, date="2025-02-01T00:00:00+00:00"),
                              matmul_run(3, 0.5, cancelled=True), matmul_run(4, 9.0, machine=other),
                              matmul_run(5, 0.3, dtype="bf16")), corrupt_lines=0)
    assert last_matmul_tflops(notebook, device="cpu", dtype="fp32", machine=MACHINE) == (0.07, "2025-02-01T00:00:00+00:00")
    assert last_matmul_tflops(notebook, device="cpu", dtype="fp16", machine=MACHINE) is None
    rate = lab_compute_rate("cpu", "fp32", MACHINE, notebook)
    assert rate == ComputeRate(0.07e12, "the fp32 rate `bench matmul` measured here on 2025-02-01", True)
    peak = lab_compute_rate("cpu", "fp32", MACHINE, Notebook(runs=(), corrupt_lines=0))
    assert peak is not None and not peak.measured and peak.flops_per_s == pytest.approx(0.33230336e12)


def test_a_measured_rate_says_about_and_a_peak_says_at_least() -> None:
    measured = ComputeRate(1e11, "the fp32 rate `bench matmul` measured here on 2025-02-01", True)
    with pytest.raises(UserError, match=r"about 40 s at 100 GFLOP/s \(the fp32 rate `bench matmul` measured here on "
                                        r"2025-02-01; a lab may take 30 s\)"):
        check_lab_fits("x", memory_bytes=1, memory_what="w", fix="f", available=2**30, flops=4e12, rate=measured)
    check_lab_fits("x", memory_bytes=1, memory_what="w", fix="f", available=2**30, flops=2e12, rate=measured)
    with pytest.raises(UserError, match=r"at least 20 s at this cpu's fp32 peak of 200 GFLOP/s"):
        check_lab_fits("x", memory_bytes=1, memory_what="w", fix="f", available=2**30, flops=4e12, peak=2e11)


@pytest.fixture
def little_memory(monkeypatch: pytest.MonkeyPatch, measure_on_cpu: None) -> None:
    """4 MiB available, on the CPU the labs then run on (the refusals name it: "cpu has 4 MiB")."""
    monkeypatch.setattr(tutor.labs.limits, "available_memory_bytes", lambda device="cpu": 4 * 2**20)


def test_kv_cache_checks_memory_before_building_the_model(little_memory) -> None:
    with pytest.raises(UserError, match=r"kv-cache: needs about .*weights .*KV cache .*cpu has 4 MiB available"):
        run_probe("kv-cache", {"layers": 8, "hidden": 1024, "heads": 8, "kv_heads": 8, "prompt": 512, "tokens": 512})


def test_prefill_decode_refuses_the_largest_allowed_stack(monkeypatch: pytest.MonkeyPatch, measure_on_cpu: None) -> None:
    # The recorded machine's peak, not this one's: one core's share of an AMX CPU's bf16 peak runs the stack
    # below in under LAB_PEAK_SECONDS, and would (rightly) let it through. On the CPU: a GPU holds and runs
    # it (an H200 has the 129 GiB), and its lab is not one core's.
    monkeypatch.setattr("tutor.bench.environment.load_machine", lambda: MACHINE)
    # and a 64 GiB host's memory, not this one's: a server's RAM holds the 129 GiB stack.
    monkeypatch.setattr(tutor.labs.limits, "available_memory_bytes", lambda device="cpu": 64 * 2**30)
    start = time.perf_counter()
    with pytest.raises(UserError, match=r"prefill-decode: needs about 129 GiB .*weights 128 GiB"):
        run_probe("prefill-decode", {"hidden": 8192, "layers": 64})
    with pytest.raises(UserError, match=r"prefill-decode: about .* at (least .* at one core's share|.*one core's share)"):
        run_probe("prefill-decode", {"hidden": 4096, "layers": 2, "prompt": 4096, "dtype": "bf16"})
    assert time.perf_counter() - start < 10


def test_grad_accumulation_refuses_the_largest_allowed_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    # The recorded machine's peak, not this one's: the lab runs on the CPU, and 16 AVX-512 cores at 2.1 GHz
    # (the H200 machine's host) do its 9.9 TFLOP in about 5 s at peak, within LAB_PEAK_SECONDS.
    monkeypatch.setattr("tutor.bench.environment.load_machine", lambda: MACHINE)
    with pytest.raises(UserError, match=r"grad-accumulation: (needs|about) "):
        run_probe("grad-accumulation", {"batch": 8192, "hidden": 2048, "layers": 16, "micro_batches": 8})


def test_grad_accumulation_activation_estimate_is_what_autograd_keeps() -> None:
    from tutor.labs.grad_accumulation import mlp_saved_bytes

    result = run_probe("grad-accumulation", {"batch": 32, "hidden": 64, "layers": 3, "micro_batches": 4})
    assert result.metrics["activation_bytes_full"] == mlp_saved_bytes(32, 64, 3)


def test_moe_alltoall_refuses_a_first_step_longer_than_its_budget() -> None:
    start = time.perf_counter()
    with pytest.raises(UserError, match=r"moe-alltoall: one step of 1,024 ranks x 100,000 tokens .* takes about"):
        run_probe("moe-alltoall", {"tokens": 100_000, "experts": 1024, "top_k": 8, "ep": 1024, "budget_s": 1.0})
    assert time.perf_counter() - start < 5


def test_matmul_and_bandwidth_labs_check_their_buffers(little_memory, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UserError, match=r"matmul: needs about .*largest shape .*cpu has 4 MiB available"):
        run_probe("matmul", {"dtypes": ["fp32"], "budget_s": 0.5})
    monkeypatch.setattr("tutor.bench.bandwidth._free_bytes", lambda device: 2**20)  # below 3 fill blocks
    with pytest.raises(UserError, match=r"bandwidth: needs about .*three arrays of .*cpu has 1 MiB available"):
        run_probe("bandwidth", {"budget_s": 0.5})


def test_a_refused_lab_is_one_line_and_exit_2() -> None:
    code, out, err = run(["lab", "prefill-decode", "hidden=8192", "layers=64"])
    assert code == 2 and out == ""
    errors = [line for line in err.splitlines() if "error" in line]  # progress lines go to stderr too
    assert len(errors) == 1 and "needs about 129 GiB" in errors[0] and "Traceback" not in err
