"""Packaging like a well-kept CLI: the license the metadata names, no stray files in the wheel, textual
pinned for the tests only, -V, a --help that says what a bare command does, and fit/models/env
usable where torch is missing (the measuring commands then say how to get it in one line)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.cli_runner import run
from tutor import __version__

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT, BUILD_BACKEND = PYPROJECT["project"], PYPROJECT["build-system"]["build-backend"]


def test_the_license_file_is_the_license_the_metadata_names() -> None:
    assert PROJECT["license"] == "MIT"
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert any(c.startswith("Programming Language :: Python :: 3.1") for c in PROJECT["classifiers"])


def test_the_shipped_lessons_folder_holds_only_lessons() -> None:
    # pyproject force-includes lessons/ as tutor/_lessons: every file there ends up in the wheel.
    stray = [p.relative_to(ROOT).as_posix() for p in (ROOT / "lessons").rglob("*")
             if p.is_file() and p.suffix not in (".md", ".toml")]
    assert not stray, f"would ship in the wheel: {stray}"


def _wheel_names(tmp_path: Path) -> list[str]:
    """The wheel `pip wheel .` would build, built in-process by the build backend pyproject names."""
    wheel = pytest.importorskip("hatchling.builders.wheel")  # the test extra brings it
    assert BUILD_BACKEND == "hatchling.build"
    (path,) = wheel.WheelBuilder(str(ROOT)).build(directory=str(tmp_path), versions=["standard"])
    with zipfile.ZipFile(path) as built:
        return built.namelist()


def test_the_wheel_holds_the_license_the_lessons_and_no_stray_files(tmp_path: Path) -> None:
    names = _wheel_names(tmp_path)
    info = f"tensor_tutor-{__version__}.dist-info"
    assert f"{info}/licenses/LICENSE" in names
    assert "tutor/cli.py" in names and "tutor/_lessons/README.md" in names
    shipped_lessons = {p.relative_to(ROOT / "lessons").as_posix() for p in (ROOT / "lessons").rglob("*.toml")}
    assert shipped_lessons <= {n.removeprefix("tutor/_lessons/") for n in names}
    # The GPU card records are package data the spec table is read from at import.
    shipped_cards = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tutor" / "hardware" / "cards").glob("*.json")}
    assert shipped_cards and shipped_cards <= set(names)
    stray = [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".gitkeep", "~", ".orig", ".rej"))
             or n.split("/")[0] not in ("tutor", info)]
    assert not stray, f"stray files in the wheel: {stray}"


def _pins(requirements: list[str], name: str) -> list[str]:
    return [r for r in requirements if re.match(rf"{name}\s*[=<>!~]", r)]


def test_textual_is_exact_only_in_the_test_extra() -> None:
    runtime = _pins(PROJECT["dependencies"], "textual")
    assert runtime and not any("==" in r for r in runtime), runtime
    assert any("==" in r for r in _pins(PROJECT["optional-dependencies"]["test"], "textual"))


def test_the_long_description_has_no_relative_images_or_links() -> None:
    readme = (ROOT / PROJECT["readme"]).read_text()
    targets = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)", readme) + re.findall(r'src="([^"]+)"', readme)
    relative = [t for t in targets if not re.match(r"(https?:|#|mailto:)", t)]
    assert not relative, f"break on an index page: {relative}"


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version_flags(flag: str) -> None:
    code, out, _ = run([flag])
    assert code == 0 and __version__ in out


def test_help_says_a_bare_command_opens_the_app() -> None:
    code, out, _ = run(["--help"])
    assert code == 0 and "no command to open the tutor app" in " ".join(out.split())
    assert "data" in out


def _without_torch(argv: list[str]) -> subprocess.CompletedProcess:
    code = ("import sys; sys.modules['torch'] = None\n"  # an import of torch now fails as if it were not installed
            "from tutor.cli import main\n"
            f"main({argv!r})")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.mark.parametrize("argv", [["fit", "llama-3.1-8b", "--json"], ["models", "--json"], ["env", "--json"],
                                  ["data", "--json"], ["lessons", "--json"]])
def test_quick_commands_run_without_torch(argv: list[str]) -> None:
    done = _without_torch(argv)
    assert done.returncode == 0, done.stderr[-500:]


def test_a_measuring_command_without_torch_says_how_to_get_it() -> None:
    done = _without_torch(["bench", "matmul", "--budget", "1"])
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "pip install torch" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
