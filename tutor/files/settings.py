"""The learner's settings (theme, live-pane sample rate, measuring device), kept in settings.json.

Unknown keys are ignored, and kept when the file is saved (a newer version may have written them); a
known key with a bad value falls back to its default with a warning, so one typo never resets the others.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tutor.files.lock import locked
from tutor.files.storage import data_dir, read_json, write_json_atomic
from tutor.files.untrusted import shown_value

SETTINGS_FILE = "settings.json"
SAMPLE_HZ_RANGE = (1.0, 4.0)  # the live pane samples at 1 to 4 Hz
_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


@dataclass(frozen=True)
class Settings:
    """What the learner chose; every field has a default that works on any machine."""

    theme: str = "textual-dark"
    """A Textual theme name (the app checks it against its registered themes)."""
    sample_hz: float = 2.0
    """How often the live pane samples utilization, memory, clocks: 1 to 4 per second."""
    device: str = "auto"
    """Where measure blocks run: auto (first GPU, else CPU), cpu, cuda:N or mps."""


def settings_path() -> Path:
    """data_dir()/settings.json."""
    return data_dir() / SETTINGS_FILE


def _valid_theme(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 64 and value.strip() == value


def _valid_sample_hz(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and SAMPLE_HZ_RANGE[0] <= value <= SAMPLE_HZ_RANGE[1])


def _valid_device(value: object) -> bool:
    return isinstance(value, str) and _DEVICE.fullmatch(value) is not None


_VALIDATORS = {"theme": _valid_theme, "sample_hz": _valid_sample_hz, "device": _valid_device}
_EXPECTED = {"theme": "a theme name", "sample_hz": "a number from 1 to 4", "device": "auto, cpu, cuda:N or mps"}


def settings_from_json(data: dict[str, Any]) -> tuple[Settings, list[str]]:
    """Settings from a parsed settings.json object, and one line per key that had to be reset."""
    values: dict[str, Any] = {}
    problems = []
    for field in dataclasses.fields(Settings):
        if field.name not in data:
            continue
        value = data[field.name]
        if _VALIDATORS[field.name](value):
            values[field.name] = float(value) if field.name == "sample_hz" else value
        else:
            problems.append(f"{field.name} = {shown_value(value)} is not {_EXPECTED[field.name]}; "
                            f"using {field.default!r}")
    return Settings(**values), problems


def load_settings(path: Path | None = None) -> tuple[Settings, str | None]:
    """The saved settings, or defaults, and a warning line when something had to be ignored."""
    path = settings_path() if path is None else Path(path)
    empty: dict[str, Any] = {}
    data, warning = read_json(path, empty)
    settings, problems = settings_from_json(data)
    if problems:
        problem_text = f"{path.name}: " + "; ".join(problems)
        warning = f"{warning}; {problem_text}" if warning else problem_text
    return settings, warning


def save_settings(settings: Settings, path: Path | None = None) -> str | None:
    """Write settings.json atomically, keeping keys it does not know; returns a warning line instead of
    raising when it cannot."""
    for name, value in dataclasses.asdict(settings).items():
        if not _VALIDATORS[name](value):
            from tutor.errors import UserError

            raise UserError(f"setting {name} = {value!r} is not {_EXPECTED[name]}")
    path = settings_path() if path is None else Path(path)
    try:
        with locked(path) as moved:
            empty: dict[str, Any] = {}
            on_disk, warning = read_json(path, empty)
            # Keys this version does not know (a newer version wrote them) are kept, not dropped.
            write_json_atomic(path, {**on_disk, **dataclasses.asdict(settings)})
    except OSError as error:
        return f"could not save settings to {path} ({error.strerror or error}); they last until you quit"
    # A lock link or a settings.json moved aside since the settings were loaded: said once, here.
    return "; ".join(filter(None, (moved, warning))) or None
