"""The offline GPU kit: its time budget, the image manifest it is built against, its summary's ratios, suite
counts and package lists, and a clear stop without a wheelhouse. The kit itself runs in CI as
benchmarks/gpu_kit_dry_run.sh (wheelhouse, a stand-in image with the manifest's versions, offline install,
"no CUDA GPU")."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIRST_RUN = ROOT / "benchmarks" / "gpu_first_run.sh"
WHEELS = ROOT / "benchmarks" / "gpu_wheels.sh"
MANIFEST = ROOT / "benchmarks" / "gpu_image.txt"


def _summary_module():
    spec = importlib.util.spec_from_file_location("gpu_summary", ROOT / "benchmarks" / "gpu_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _steps(text: str) -> list[tuple[str, int]]:
    return [(name, int(n)) for name, n in re.findall(r"^\s*step (\w+) (\d+) ", text, flags=re.M)]


def test_the_gpu_steps_come_first_and_the_whole_suite_last_within_one_call() -> None:
    text = FIRST_RUN.read_text()
    multi = text[text.index('if [ "$GPUS" -ge 2 ]'):]
    # what runs on one GPU: up to the GPU check, then from "torch sees" on (the no-GPU branch is the dry run's)
    single = text[:text.index("GPUS=$(")] + text[text.index('say "torch sees'):text.index('if [ "$GPUS" -ge 2 ]')]
    gpu = [(name, limit) for name, limit in _steps(single) if name != "pytest_full"]
    # Limits, not times (the last run's steps took 154 s of their 470): BUDGET_S clamps each to what is left.
    assert len(gpu) >= 14 and sum(limit for _, limit in gpu) < 520, gpu
    suite = dict(_steps(text))["pytest_full"]
    budget = int(re.search(r"BUDGET_S=\$\{BUDGET_S:-(\d+)\}", text).group(1))
    # every step is clamped to what is left of the budget; the device allows 600 s a call, the summary some more
    assert 200 <= suite and budget <= 560
    assert _steps(multi)
    # the suite runs after everything else: its call is the last thing before the final finish
    tail = text[text.index('if [ "$GPUS" -ge 2 ]'):]
    assert re.search(r"^suite$", tail, flags=re.M) and tail.rindex("\nsuite\n") > tail.rindex("step lab_moe")
    # and it is stopped before its step's limit, so pytest still writes the JUnit XML
    assert "timeout -s INT" in text and "--junitxml" in text


def test_the_per_test_timeout_comes_with_the_test_extra() -> None:
    test_extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert "--timeout" in FIRST_RUN.read_text()
    assert any(r.startswith("pytest-timeout") for r in test_extra)


def _manifest() -> dict[str, str | None]:
    pins = {}
    for line in MANIFEST.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name] = version or None
    return pins


def test_the_manifest_holds_the_image_s_versions_and_the_kit_ships_every_pytest_plugin() -> None:
    image = _manifest()
    assert image["pytest"] == "9.1.1" and image["transformers"] == "5.17.0" and image["rich"] == "15.0.0"
    assert image["torch"].startswith("2.11.0")
    runner = re.search(r'KIT_RUNNER=\$\{KIT_RUNNER:-"([^"]+)"\}', WHEELS.read_text()).group(1).split()
    test_extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    plugins = {re.match(r"[A-Za-z0-9_.-]+", r).group(0) for r in test_extra if r.startswith("pytest")}
    # the project's pytest and every plugin in the kit, so no image version of them can break the install
    assert plugins <= set(runner) and "pytest" in runner and "syrupy" in runner


def test_the_wheelhouse_build_refuses_an_image_version_outside_the_project_s_range(tmp_path) -> None:
    """The shipped kit failed on the GPU (syrupy needs pytest<9, the image has 9.1.1): taken from the image,
    pytest must meet pytest>=8,<9, so the build stops here, before any index is asked."""
    manifest = tmp_path / "image.txt"
    manifest.write_text("torch==2.11.0+cu130\npytest==9.1.1\nrich==15.0.0\n")
    env = {**os.environ, "IMAGE_MANIFEST": str(manifest), "WHEELHOUSE": str(tmp_path / "wh"),
           "PYTHON": sys.executable, "KIT_RUNNER": "pytest-xdist pytest-randomly pytest-timeout pytest-textual-snapshot syrupy",
           "PIP_NO_INDEX": "1"}
    done = subprocess.run(["bash", str(WHEELS)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1
    assert "pytest 9.1.1 (the project wants pytest>=8,<9)" in done.stderr
    assert not (tmp_path / "wh").exists()


def test_the_wheelhouse_is_ignored_by_git() -> None:
    assert "benchmarks/wheelhouse/" in (ROOT / ".gitignore").read_text().split()


def test_the_summary_sets_each_figure_beside_its_plain_reference() -> None:
    summary = _summary_module()
    outputs = {
        "bench_quick": {"results": [
            {"kind": "matmul", "device": "cuda:0", "dtype": "bf16", "tflops_best": 600.0},
            {"kind": "matmul", "device": "cuda:0", "dtype": "bf16", "tflops_best": 650.0, "backend": "other"},
            {"kind": "bandwidth", "device": "cuda:0", "op": "copy", "gbps_best": 4000.0}]},
        "bench_transfer": {"results": [{"kind": "transfer", "op": "h2d", "memory": "pinned", "gbps_best": 50.0}]},
        "ref_matmul": {"matmul": {"bf16": {"tflops": 700.0}, "fp8": {"error": "no fp8 here"}}},
        "ref_memory": {"copy_gbps": 4000.0, "h2d_gbps": 55.0, "d2h_gbps": 54.0},
        "fit_device_0": {"device": {"capacity_bytes": 140 * 2**30, "source": "free now (NVML)"}},
        "ref_free": {"torch_free_bytes": 140 * 2**30, "nvml_free_bytes": 141 * 2**30},
        "fit_trace": {"trace": {"vs_formula": {"peak": {"traced_bytes": 90 * 2**30, "formula_bytes": 99 * 2**30}}}},
        "ref_step": {"max_memory_allocated_bytes": 100 * 2**30},
        "sampler": {"seconds": 10, "ours": {"samples": 40, "utilization_pct": 99.0},
                    "plain": {"samples": 40, "utilization_pct": 100.0}},
    }
    rows = {r["what"]: r for r in summary.comparisons(outputs)}
    assert rows["matmul bf16"]["ours"] == 650.0 and rows["matmul bf16"]["ratio"] == pytest.approx(650 / 700, abs=1e-3)
    assert rows["matmul fp8"]["ratio"] is None and rows["matmul fp8"]["note"] == "no fp8 here"
    assert rows["HBM device copy"]["ratio"] == 1.0
    assert rows["H2D pinned"]["ratio"] == pytest.approx(50 / 55, abs=1e-3)
    assert rows["fit --trace peak vs real bf16 step (max_memory_allocated)"]["ratio"] == 0.9
    assert rows["fit formula peak vs real bf16 step (max_memory_allocated)"]["ratio"] == 0.99
    assert rows["live sampler under load: mean utilization_pct"]["ratio"] == 0.99
    assert "matmul tf32" not in rows  # nothing on either side: no row


def test_the_summary_sets_time_beside_the_real_steps_it_predicts() -> None:
    """`time --device 0` (eager and graphs rows) beside ref_step's real eager loop, and each family of time_vs_real."""
    summary = _summary_module()
    outputs = {
        "ref_step": {"train": {"median_s": 0.486}, "prefill": {"median_s": 0.063},
                     "decode": {"1": {"median_step_s": 0.0559}, "8": {"median_step_s": 0.0629}}},
        "time_8b": {"prefill": {"seconds": 0.056},
                    "decode": [{"batch": 1, "engine": "eager", "bound": "host", "seconds_per_step": 0.0559},
                               {"batch": 8, "engine": "eager", "bound": "host", "seconds_per_step": 0.05},
                               {"batch": 1, "engine": "graphs", "bound": "memory", "seconds_per_step": 0.007}]},
        "time_verify": {"verify": {"model": "Llama-3.1-8B", "device": "cuda:0", "scaled": "full size",
                                   "predicted_s": 0.42, "measured_s": 0.486,
                                   "phases": {"optimizer": {"predicted_s": 0.075, "measured_s": 0.097}},
                                   "prefill": {"predicted_s": 0.056, "measured_s": 0.063},
                                   "decode_engines": [{"engine": "graphs", "batch": 1, "predicted_s": 0.007,
                                                       "measured_s": 0.008}]}},
        "time_vs_real": {"size": "gpu", "models": [{"model": "mixtral-8x7b", "measured": {"decode@1": 0.03},
                                                    "predicted": {"decode@1": 0.025}}]},
    }
    rows = {r["what"]: r for r in summary.comparisons(outputs)}
    assert rows["time --device 0 decode @1, eager (host) vs real eager step"]["ratio"] == 1.0
    assert rows["time --device 0 decode @8, eager (host) vs real eager step"]["ratio"] == pytest.approx(0.05 / 0.0629,
                                                                                                       abs=1e-3)
    assert "graphs should sit below" in rows["time --device 0 decode @1, graphs (memory) vs real eager step"]["note"]
    assert rows["time --device 0 prefill vs real"]["ratio"] == pytest.approx(0.056 / 0.063, abs=1e-3)
    step = "time --verify training step (Llama-3.1-8B on cuda:0, full size): predicted vs measured"
    assert rows[step]["ratio"] == pytest.approx(0.42 / 0.486, abs=1e-3)
    assert rows["time --verify optimizer: predicted vs measured"]["ratio"] == pytest.approx(0.075 / 0.097, abs=1e-3)
    assert rows["time --verify decode @1, graphs: predicted vs measured"]["ratio"] == pytest.approx(0.875, abs=1e-3)
    assert rows["time --device 0 decode@1 vs transformers (mixtral-8x7b, gpu size)"]["ratio"] == pytest.approx(0.833,
                                                                                                               abs=1e-3)


def test_the_summary_files_and_their_count(tmp_path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    (work / "steps.tsv").write_text("install\t3\t60\tok\nenv\t2\t15\tFAILED (rc 1)\n")
    (work / "env.out").write_text(json.dumps({"gpus": []}))
    done = subprocess.run([os.environ.get("PYTHON", "python"), str(ROOT / "benchmarks" / "gpu_summary.py"), str(work),
                           str(out), "470"], capture_output=True, text=True, check=True)
    report = json.loads((out / "summary.json").read_text())
    assert report["passed"] is False and report["seconds_total"] == 5 and report["timeouts_total_s"] == 75
    assert sorted(p.name for p in out.iterdir()) == ["outputs.json", "summary.json", "summary.txt"]
    assert "FAILED (rc 1)" in done.stdout


def test_without_a_wheelhouse_the_first_run_says_how_to_build_one(tmp_path) -> None:
    env = {**os.environ, "WHEELHOUSE": str(tmp_path / "none"), "OUT": str(tmp_path / "out"),
           "PYTHON": os.environ.get("PYTHON", "python3")}
    done = subprocess.run(["bash", str(FIRST_RUN), "--dry-run"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1
    log = (tmp_path / "out" / "steps.log").read_text()
    assert "gpu_wheels.sh" in log and "did not install" in done.stderr
    assert len(list((tmp_path / "out").iterdir())) <= 8
    # what the machine's Python has is recorded before the install, so a failed one still leaves it
    listed = json.loads((tmp_path / "out" / "image-packages.json").read_text())
    assert "pytest" in {row["name"].lower() for row in listed["packages"]}


def _summarize(work: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([os.environ.get("PYTHON", "python"), str(ROOT / "benchmarks" / "gpu_summary.py"), str(work),
                           str(out), "540", *extra], capture_output=True, text=True, check=True)


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" failures="1"
skipped="1" tests="5"><testcase classname="tests.test_a" name="test_ok" time="0.1"/>
<testcase classname="tests.test_a" name="test_ok_too" time="0.1"/>
<testcase classname="tests.test_a" name="test_skip"><skipped type="pytest.skip" message="needs 2 GPUs"/></testcase>
<testcase classname="tests.test_b" name="test_ratio"><failure message="assert 1.16 &lt; 1.1">def test_ratio():
&gt;       assert ratio &lt; 1.1
E       assert 1.16 &lt; 1.1
tests/test_b.py:9: AssertionError</failure></testcase>
<testcase classname="tests.test_c" name="test_fixture"><error message="failed on setup">E   OSError: no GPU</error></testcase>
<testcase time="30.0"/></testsuite></testsuites>"""


def test_the_summary_counts_the_whole_suite_from_its_junit_xml(tmp_path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    (work / "steps.tsv").write_text("pytest_gpu\t30\t60\tok\npytest_full\t200\t240\tFAILED (rc 1)\n")
    (out / "pytest-junit.xml").write_text(JUNIT)
    done = _summarize(work, out)
    report = json.loads((out / "summary.json").read_text())
    # the nameless testcase is the one pytest was running when stopped: not a pass
    assert report["suite"] == {"passed": 2, "failed": 1, "errors": 1, "skipped": 1}
    assert "whole suite: 2 passed, 1 failed, 1 errors, 1 skipped" in done.stdout
    failures = (out / "pytest-failures.txt").read_text()
    assert "FAILED tests.test_b::test_ratio" in failures and "E       assert 1.16 < 1.1" in failures
    assert "ERRORS tests.test_c::test_fixture" in failures and "OSError: no GPU" in failures


def test_a_suite_stopped_before_its_xml_says_so(tmp_path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    (work / "steps.tsv").write_text("pytest_full\t240\t240\ttimed out after 240 s\n")
    done = _summarize(work, out)
    assert "no JUnit XML" in done.stdout and json.loads((out / "summary.json").read_text())["suite"] is None


def test_the_summary_sets_the_image_beside_its_manifest_and_names_what_the_kit_shadows(tmp_path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    (work / "steps.tsv").write_text("install\t3\t45\tok\n")
    def listing(rows):
        return json.dumps({"packages": [{"name": n, "version": v, "location": loc, "imported": first}
                                        for n, v, loc, first in rows]})
    (out / "image-packages.json").write_text(listing([("pytest", "9.1.1", "/img", True), ("rich", "15.0.0", "/img", True),
                                                      ("numpy", "2.5.3", "/img", True)]))
    (out / "kit-packages.json").write_text(listing([("pytest", "8.4.2", "/kit", True), ("pytest", "9.1.1", "/img", False),
                                                    ("rich", "15.0.0", "/img", True), ("textual", "8.2.8", "/kit", True)]))
    manifest = tmp_path / "image.txt"
    manifest.write_text("# the image\npytest==9.1.1\nrich==15.0.0\nnumpy==2.5.2\nclick\n")
    done = _summarize(work, out, str(manifest))
    packages = json.loads((out / "summary.json").read_text())["packages"]
    assert packages["kit_shadows"] == ["pytest 9.1.1 -> 8.4.2"]
    assert packages["image_vs_manifest"] == ["click missing (expected present)", "numpy 2.5.3 (expected 2.5.2)"]
    assert "the kit's venv shadows: pytest 9.1.1 -> 8.4.2" in done.stdout


def test_text_steps_keep_their_last_lines(tmp_path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    (work / "steps.tsv").write_text("pytest_gpu\t30\t60\tok\n")
    (work / "pytest_gpu.out").write_text("....\n\n12 passed, 3 skipped in 20.1s\n")
    subprocess.run([os.environ.get("PYTHON", "python"), str(ROOT / "benchmarks" / "gpu_summary.py"), str(work),
                    str(out), "470"], capture_output=True, text=True, check=True)
    report = json.loads((out / "summary.json").read_text())
    assert report["text_tails"]["pytest_gpu"][-1] == "12 passed, 3 skipped in 20.1s"
    assert "12 passed, 3 skipped" in (out / "summary.txt").read_text()
