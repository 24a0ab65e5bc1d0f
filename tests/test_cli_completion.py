"""Shell completion: preset names, lesson ids, lab names and parameters, devices (tutor.commands.completion)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from click.shell_completion import BashComplete

from tutor.commands.group import cli
from tutor.labs.registry import LABS
from tutor.lessons import load_curriculum
from tutor.files.models import preset_names


def completions(words: list[str], incomplete: str) -> list[str]:
    """What click offers after `tensor-tutor WORDS INCOMPLETE<TAB>`, through the real command group."""
    complete = BashComplete(cli, {}, "tensor-tutor", "_TENSOR_TUTOR_COMPLETE")
    return [item.value for item in complete.get_completions(words, incomplete)]


def test_fit_completes_preset_names() -> None:
    assert completions(["fit"], "") == preset_names()
    assert completions(["fit"], "llama-3.1-") == [name for name in preset_names() if name.startswith("llama-3.1-")]
    assert "llama-3.1-8b" in completions(["fit"], "llama-3.1-")


@pytest.mark.parametrize("command", [["learn"], ["serve"], ["lessons", "show"]])
def test_lesson_commands_complete_lesson_ids(command: list[str]) -> None:
    ids = [info.id for info in load_curriculum().lessons]
    assert completions(command, "") == ids
    first_track = ids[0].split("/")[0]
    assert completions(command, f"{first_track}/") == [i for i in ids if i.startswith(f"{first_track}/")]


def test_lab_completes_lab_names_and_then_their_parameters() -> None:
    assert completions(["lab"], "") == list(LABS)
    assert completions(["lab"], "moe") == ["moe-routing", "moe-alltoall", "moe"]
    assert completions(["lab", "matmul"], "") == ["dtypes=fp32,bf16", "budget_s=4.0", "device=auto"]
    assert completions(["lab", "matmul"], "dtypes=b") == ["dtypes=bf16"]
    # bash splits KEY=VALUE at '=': the value is then completed on its own
    assert completions(["lab", "matmul", "dtypes", "="], "f") == ["fp32", "fp16", "fp8"]
    assert "model=llama-3.1-8b" in completions(["lab", "fit"], "model=llama-3.1-8")
    assert completions(["lab", "no-such-lab"], "") == []


def test_device_options_complete_devices() -> None:
    for command in (["bench", "matmul"], ["bench"]):
        offered = completions(command + ["--device"], "")
        assert "cpu" in offered and set(offered) <= {"cpu", "cuda"} | {f"cuda:{i}" for i in range(64)}, offered
    fit = completions(["fit", "--device"], "h10")
    assert "h100" in fit and all(name.startswith("h10") for name in fit)
    assert "cpu" in completions(["fit", "--device"], "")
    assert completions(["lab", "matmul"], "device=c")[0] == "device=cpu"


def test_completion_through_the_shell_protocol_prints_names() -> None:
    """The way bash asks (the environment variable the README's `eval` line sets)."""
    env = dict(os.environ, _TENSOR_TUTOR_COMPLETE="bash_complete", COMP_WORDS="tensor-tutor lab dd", COMP_CWORD="2")
    done = subprocess.run([sys.executable, "-c", "from tutor.cli import main; main()"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["plain,ddp"]
    env.update(_TENSOR_TUTOR_COMPLETE="bash_source")
    script = subprocess.run([sys.executable, "-c", "from tutor.cli import main; main()"], env=env,
                            capture_output=True, text=True, timeout=60).stdout
    assert "complete -o nosort -F _tensor_tutor_completion tensor-tutor" in script
