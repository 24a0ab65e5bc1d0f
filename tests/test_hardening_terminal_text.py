"""Strings from files never drive the terminal: no ANSI escapes sent, no Rich markup obeyed,
no hyperlinks made, and `my-model[v2]` printed as written."""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path

import pytest

from tests.cli_runner import run
from tutor.commands.safe_text import as_text, markup_safe, plain

HOSTILE = "evil[/bold] [link=http://x]a[/link] \x1b[31mred my-model[v2]"
SHOWN = r"evil[/bold] [link=http://x]a[/link] \x1b[31mred my-model[v2]"
OSC8_HYPERLINK = "\x1b]8;"


def model_folder(tmp_path: Path, folder: str, name: str | None) -> Path:
    config = json.loads(resources.files("tutor.presets").joinpath("gpt2.json").read_text())
    if name is None:
        config.pop("_name_or_path", None)
    else:
        config["_name_or_path"] = name
    path = tmp_path / folder
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(params=[False, True], ids=["pipe", "terminal"])
def terminal(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Rich writes plain text into a pipe and styles (and hyperlinks) into a terminal: both are checked."""
    monkeypatch.delenv("NO_COLOR", raising=False)
    if request.param:
        monkeypatch.setenv("FORCE_COLOR", "1")
        monkeypatch.setenv("COLUMNS", "300")
    else:
        monkeypatch.delenv("FORCE_COLOR", raising=False)
        monkeypatch.setenv("COLUMNS", "300")
    return request.param


def visible(text: str) -> str:
    """What a terminal shows: SGR style codes (Rich's own) removed; any other ESC stays and fails the test."""
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_fit_shows_a_hostile_name_as_written(tmp_path: Path, terminal: bool) -> None:
    folder = model_folder(tmp_path, "my-model[v2]", HOSTILE)
    code, out, err = run(["fit", str(folder), "--device", "80GiB"])
    assert code == 0, err
    shown = visible(out)
    assert "\x1b" not in shown and OSC8_HYPERLINK not in out
    assert SHOWN in shown and "my-model[v2]" in shown.split("\n")[1]  # the name, and the folder on the source line


def test_fit_shows_a_folder_name_with_brackets(tmp_path: Path, terminal: bool) -> None:
    folder = model_folder(tmp_path, "[bold]x[link=https:x]y", None)
    code, out, err = run(["fit", str(folder), "--device", "80GiB"])
    assert code == 0, err
    assert "[bold]x[link=https:x]y" in visible(out) and OSC8_HYPERLINK not in out


def test_env_shows_a_hostile_cpu_name(monkeypatch: pytest.MonkeyPatch, terminal: bool) -> None:
    from tutor.commands import env as env_command
    from tutor.hardware import detect_machine

    machine = detect_machine()
    hostile = dataclasses.replace(machine, cpu=dataclasses.replace(machine.cpu, model_name=HOSTILE))
    monkeypatch.setattr(env_command, "detect_machine", lambda: hostile)
    code, out, err = run(["env"])
    assert code == 0, err
    assert "\x1b" not in visible(out) and OSC8_HYPERLINK not in out and "my-model[v2]" in visible(out)


@pytest.mark.parametrize(("raw", "expected"), [
    ("my-model[v2]", "my-model[v2]"), ("\x1b[31m", r"\x1b[31m"), ("a\nb\tc\x07", r"a\nb\tc\x07"), ("plain", "plain"),
])
def test_plain_writes_control_characters_as_escapes(raw: str, expected: str) -> None:
    assert plain(raw) == expected
    assert as_text(raw).plain == expected


def test_markup_safe_round_trips_through_rich() -> None:
    from rich.text import Text

    assert Text.from_markup(f"[bold]{markup_safe(HOSTILE)}[/bold]").plain == SHOWN
