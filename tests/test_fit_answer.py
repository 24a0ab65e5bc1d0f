"""One fit answer (tutor.answers.fit) under every front end: the CLI, the calculators and export, lessons, the lab."""

from __future__ import annotations

import json
import re

import pytest
from tests.cli_runner import run
from click.testing import CliRunner
from tests.ui_fakes import fake_machine

from tutor.commands.group import cli
from tutor.answers.fit import FitAnswer, FitInputs, answer_fit, change_flags
from tutor.theory import fit as fitting


def cli_json(*argv: str) -> dict:
    code, out, err = run(["fit", *argv, "--json"])
    assert code == 0, err
    return json.loads(out)


def cli_text(*argv: str) -> str:
    result = CliRunner().invoke(cli, ["fit", *argv], env={"COLUMNS": "240"}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_the_answer_is_frozen_and_its_json_is_the_commands() -> None:
    inputs = FitInputs.from_command("llama-3.1-70b", None, "h100", mode="train", seq_len=8192, recompute="full")
    answer = answer_fit(inputs)
    assert isinstance(answer, FitAnswer)
    with pytest.raises(AttributeError):
        answer.name = "other"  # type: ignore[misc]
    assert answer.request.recompute is fitting.Recompute.FULL and answer.request.mode is fitting.Mode.TRAIN
    assert answer.to_json() == cli_json("llama-3.1-70b", "--mode", "train", "--device", "h100", "--seq", "8192",
                                        "--recompute", "full")
    assert answer.fits is False and answer.suggestions
    assert answer.to_json()["suggestions"][0]["change"] == change_flags(answer.suggestions[0])


def test_the_calculators_values_give_the_commands_answer() -> None:
    values = {"model": "llama-3.1-8b", "mode": "train", "device": "rtx-4090", "seq": "8k", "zero": 0,
              "recipe": "qlora", "lora_rank": 8, "lora_targets": ["q", "v"]}
    ours = answer_fit(FitInputs.from_values(values, fake_machine())).to_json()
    assert ours == cli_json("llama-3.1-8b", "--mode", "train", "--device", "rtx-4090", "--seq", "8192",
                            "--recipe", "qlora", "--lora-rank", "8", "--lora-targets", "q,v")


def test_a_lesson_value_and_the_command_name_the_same_change() -> None:
    from tutor.lessons.values import evaluate

    capacity = evaluate("reference_gpu.memory_bytes")
    lesson = [evaluate(f'flags(fit.suggestions(preset("llama-3.1-8b"), fit.FitRequest(mode="train", seq_len=4096), '
                       f'reference_gpu.memory_bytes)[{i}])') for i in range(2)]
    report = cli_json("llama-3.1-8b", "--mode", "train", "--device", f"{capacity}B")
    assert [s["change"] for s in report["suggestions"][:2]] == lesson


def test_a_goal_and_the_lab_count_what_the_answer_counts() -> None:
    from tutor.hardware.memory_budget import given_budget
    from tutor.labs import run_probe
    from tutor.lessons.goals import check_goal
    from tutor.lessons.model import Calc, Goal

    calc = Calc(kind="parallel", model="llama-3.1-70b", fields=("dp", "tp", "zero"), id="g",
                values={"model": "llama-3.1-70b", "mode": "train", "seq": 4096},
                goal=Goal(device="h100", devices_max=64))
    verdict = check_goal(calc, {"dp": 8, "tp": 8, "zero": 3})
    answer = answer_fit(FitInputs.from_values({"model": "llama-3.1-70b", "mode": "train", "dp": 8, "tp": 8, "zero": 3,
                                               "gpu": True}, budget=given_budget("h100")))
    assert verdict.worst_bytes == answer.worst.total and verdict.met == answer.fits
    lab = run_probe("fit", {"model": "llama-3.1-8b", "mode": "train", "seq": 1024, "capacity": "80GB"})
    same = answer_fit(FitInputs.from_values({"model": "llama-3.1-8b", "mode": "train", "seq": 1024,
                                             "attention": "flash", "device": "80GB"}))
    assert lab.metrics["total_bytes"] == same.worst.total and lab.metrics["capacity_bytes"] == same.capacity


def _gib_cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("│").split("│")]


def _number(cell: str) -> float:
    return float(cell.replace(",", "").replace("[bold]", "").replace("[/bold]", ""))


@pytest.mark.parametrize("argv", [
    ("llama-3.1-70b", "--mode", "train", "--device", "h100"),          # the optimizer step peaks: temporaries
    ("llama-3.1-8b", "--mode", "train", "--recipe", "lora", "--device", "h100"),  # the backward pass peaks
    ("llama-3.1-8b", "--device", "h100"),                               # inference: every category at once
])
def test_the_printed_memory_table_adds_up(argv: tuple[str, ...]) -> None:
    text = cli_text(*argv)
    rows = [_gib_cells(line) for line in text.splitlines() if line.startswith("│") and not line.startswith("│  ")]
    rows = [row for row in rows if row[0]]
    header = next(_gib_cells(line.replace("┃", "│")) for line in text.splitlines() if line.startswith("┃"))
    gib, at_peak = header.index("GiB"), header.index("at peak, GiB") if "at peak, GiB" in header else None
    categories = [row for row in rows if row[0] not in ("sum of categories", "must fit")]
    summed = next(row for row in rows if row[0] == "sum of categories")
    must_fit = next(row for row in rows if row[0] == "must fit")
    slack = 0.005 * (len(categories) + 1)  # each printed figure is rounded to 0.01
    own_maxima = [_number(row[gib]) for row in categories if row[gib] != "-"]
    assert sum(own_maxima) == pytest.approx(_number(summed[gib]), abs=slack)
    if at_peak is None:  # inference: everything is alive at once, so the sum is what must fit
        assert _number(summed[gib]) == pytest.approx(_number(must_fit[gib]), abs=0.005)
        return
    alive = [_number(row[at_peak]) for row in categories]
    assert sum(alive) == pytest.approx(_number(must_fit[at_peak]), abs=slack)
    assert _number(must_fit[at_peak]) == _number(must_fit[gib])
    if "optimizer temporaries" in [row[0] for row in categories]:  # the 70B case: it is what tips the sum
        assert _number(must_fit[gib]) > _number(summed[gib])


def test_nothing_fits_says_what_was_tried_not_single_changes() -> None:
    text = " ".join(cli_text("gpt2", "--device", "1GiB", "--dtype", "int4", "--attention", "eager").split())
    assert "No single change" not in text
    assert "Nothing tried here makes it fit, alone or combined" in text and "tp up to 64" in text
    train = answer_fit(FitInputs.from_command("llama-3.1-405b", None, "1GiB", mode="train"))
    assert train.nothing_fits and "full recompute with ZeRO-3 on up to 1,024 devices" in train.nothing_fits_text()
    bare = " ".join(cli_text("--params", "7B", "--mode", "train", "--device", "80GB").split())
    assert "No changes are searched for a bare parameter count" in bare


def test_adapter_and_cpu_formulas_say_what_they_count() -> None:
    qlora = answer_fit(FitInputs.from_command("llama-3.1-8b", None, "24GiB", mode="train", recipe="qlora"))
    optimizer = next(c for c in qlora.worst.components if c.name == "optimizer")
    assert optimizer.formula.endswith("[qlora: adapters in mixed precision + adam]")
    on_cpu = next(c.formula for c in answer_fit(FitInputs.from_command("llama-3.1-8b", None, "cpu", mode="train")
                                                ).worst.components if c.name == "overhead")
    assert "PEFT reserved/allocated" not in on_cpu and "assumed for CPU RAM: not measured there" in on_cpu
    on_gpu = next(c.formula for c in qlora.worst.components if c.name == "overhead")
    assert "PEFT reserved/allocated" in on_gpu and "CUDA context" in on_gpu


def test_flags_given_where_they_do_not_apply_are_noted_once() -> None:
    answer = answer_fit(FitInputs.from_command("gpt2", None, "24GiB", given=("zero", "kv_dtype"), zero=3,
                                               kv_dtype="fp8"))
    assert answer.flag_notes == ("--zero: ignored here; these flags only apply to training (--mode train)",)
    assert answer.notes[-1] == answer.flag_notes[0]


def test_bad_input_is_a_user_error() -> None:
    from tutor.errors import UserError

    with pytest.raises(UserError, match="either MODEL or --params"):
        answer_fit(FitInputs(model="gpt2", params="7B", device="24GiB"))
    with pytest.raises(UserError, match="recompute must be one of"):
        FitInputs.from_values({"model": "gpt2", "recompute": "most", "device": "24GiB"})
    sized = answer_fit(FitInputs.from_values({"model": "gpt2", "memory": "24"}))  # a bare memory size is GB
    assert sized.capacity == 24 * 10**9 and re.search(r"\(24 GB\) device", sized.budget.name)
