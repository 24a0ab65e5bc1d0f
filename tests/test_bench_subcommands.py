"""`bench SUB --help` lists only SUB's options; `bench collective` (and its torchrun form) prints one JSON
object and honours its budget; a real `bench matmul` measures the fixed-size fp32 case that compares."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tutor.commands.bench import bench

from tests.machines import recorded_machine
from tests.subprocess_env import pythonpath

ROOT = Path(__file__).resolve().parents[1]
EVERY_RUN_OPTION = {"--quick", "--device", "--dtype", "--budget", "--ranks", "--ops", "--sizes", "--json"}


def options_in_help(*args: str) -> set[str]:
    result = CliRunner().invoke(bench, [*args, "--help"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return set(re.findall(r"^\s+(--[a-z-]+)", result.stdout, flags=re.M)) & EVERY_RUN_OPTION


@pytest.mark.parametrize(("sub", "expected"), [
    ("matmul", {"--dtype", "--device", "--budget", "--json"}),
    ("bandwidth", {"--device", "--budget", "--json"}),
    ("transfer", {"--device", "--budget", "--json"}),
    ("collective", {"--ranks", "--ops", "--sizes", "--budget", "--json"}),
])
def test_each_subcommand_help_lists_only_its_own_options(sub: str, expected: set[str]) -> None:
    assert options_in_help(sub) == expected


def test_bench_help_descriptions_are_whole() -> None:
    result = CliRunner().invoke(bench, ["--help"], env={"COLUMNS": "80"}, catch_exceptions=False)
    commands = result.stdout.split("Commands:")[1]
    assert "..." not in commands
    words = " ".join(commands.split())
    assert "Host-to-device and device-to-host GB/s, pinned and pageable (needs CUDA)." in words
    assert "all_reduce, all_gather, reduce_scatter algbw/busbw across local ranks." in words
    assert options_in_help() == {"--quick", "--device", "--dtype", "--budget", "--ranks", "--json"}


@pytest.mark.parametrize(("argv", "message"), [
    (["bench", "collective", "--ops", "broadcastx"], "unknown collective 'broadcastx'"),
    (["bench", "collective", "--sizes", "lots"], "lots"),
    (["bench", "bandwidth", "--dtype", "fp32"], "No such option '--dtype'"),
])
def test_bad_collective_options_are_one_line_exit_2(argv: list[str], message: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from tutor.cli import main

    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_collective_module_help_documents_every_option_without_importing_torch() -> None:
    script = ("import sys\nfrom tutor.bench.collective import main\ntry:\n    main(['--help'])\n"
              "except SystemExit:\n    pass\nprint('torch imported:', 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": pythonpath(ROOT)})
    assert "torch imported: False" in done.stdout, done.stdout + done.stderr
    for option in ("--ops", "--sizes", "--budget", "--json"):
        assert option in done.stdout


def test_bench_collective_json_is_one_object_and_a_spent_budget_skips_the_larger_sizes(tmp_path: Path) -> None:
    # A budget far below the ranks' start-up: the first size is measured (MIN_ITERS), the larger one is
    # skipped and the run says so, instead of measuring it past the budget.
    env = {**os.environ, "TENSOR_TUTOR_DATA_DIR": str(tmp_path), "PYTHONPATH": pythonpath(ROOT)}
    done = subprocess.run([sys.executable, "-m", "tutor", "bench", "collective", "--ranks", "2", "--ops", "all_reduce",
                           "--sizes", "256M,64K", "--budget", "0.01", "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)  # one object: json.loads fails on a second one ("Extra data")
    assert set(payload) == {"device", "results"}
    states = [(r["op"], r["bytes"], r["state"]) for r in payload["results"]]
    assert states == [("all_reduce", 64 * 1000, "ok"), ("all_reduce", 256 * 10**6, "skipped")]
    assert "budget spent" in done.stderr and "256 MB not measured" in done.stderr
    stored = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(stored) == 1 and stored[0]["results"] == payload["results"] and stored[0]["status"] == "complete"


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not installed")
def test_the_torchrun_form_prints_one_json_object(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": pythonpath(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["torchrun", "--standalone", "--nproc-per-node", "2", "-m", "tutor.bench.collective",
                           "--ops", "all_reduce,all_gather", "--sizes", "64K", "--budget", "2", "--json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    import torch

    # Two ranks on this node: NCCL only with a GPU for each (gloo on one GPU, or none).
    backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= 2 else "gloo"
    assert payload["device"]["ranks"] == 2 and payload["device"]["backend"] == backend
    assert [(r["op"], r["state"]) for r in payload["results"]] == [("all_reduce", "ok"), ("all_gather", "ok")]


def test_a_real_matmul_run_measures_the_fixed_size_case_and_two_runs_compare_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, measure_on_cpu: None) -> None:
    # The CPU's fixed size: the default device is the CPU here (measure_on_cpu), as on the recorded machine.
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    monkeypatch.setattr("tutor.bench.environment.load_machine", lambda: recorded_machine())
    from tutor.bench.matmul import fixed_matmul_size

    size = fixed_matmul_size("cpu")
    for _ in range(2):
        result = CliRunner().invoke(bench, ["matmul", "--dtype", "fp32", "--budget", "2", "--json"],
                                    catch_exceptions=False)
        assert result.exit_code == 0, result.output
        fixed = [r for r in json.loads(result.stdout)["results"] if r.get("fixed_size")]
        assert [(r["m"], r["n"], r["k"], r["dtype"]) for r in fixed] == [(size, size, size, "fp32")]
        assert fixed[0]["tflops_median"] > 0
    compared = CliRunner().invoke(bench, ["history", "--compare", "1", "2", "--json"], catch_exceptions=False)
    cases = {case["case"]: case for case in json.loads(compared.stdout)["cases"]}
    fixed_case = next(case for name, case in cases.items() if name.endswith(f"fixed {size}²"))
    assert fixed_case["sizes_differ"] is False and fixed_case["ratio"] > 0
