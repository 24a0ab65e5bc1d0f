"""The design document ships with the project: docs/architecture.md names every part of `tutor`, and
the README points there, never to a file outside the project."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def test_architecture_names_every_package_and_module_of_tutor() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    parts = [p for p in (ROOT / "tutor").iterdir()
             if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").exists()]
    assert len(parts) > 10
    missing = [p.name for p in parts if f"tutor/{p.name}" + ("" if p.suffix else "/") not in text]
    assert not missing, f"docs/architecture.md does not say what these hold: {missing}"


def test_the_readme_points_to_the_architecture_and_nothing_outside_the_project() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "docs/architecture.md" in readme
    shipped = [ROOT / "README.md", ARCHITECTURE, *(ROOT / "lessons").rglob("*.md"), *(ROOT / "tutor").rglob("*.py")]
    outside = [str(path.relative_to(ROOT)) for path in shipped if "../shared" in path.read_text(encoding="utf-8")]
    assert not outside, outside


NUMBER_WORDS = {"three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}


def test_the_readme_counts_the_lessons_tracks_and_presets_that_ship() -> None:
    import re

    from tutor.lessons.loader import load_curriculum
    from tutor.files.models import list_presets

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    lessons, tracks = re.search(r"The tutor: (\d+) lessons in (\w+) tracks", readme).groups()
    curriculum = load_curriculum()
    assert (int(lessons), NUMBER_WORDS[tracks]) == (len(curriculum.lessons), len(curriculum.tracks))
    presets = re.search(r"The (\d+) bundled model presets", readme).group(1)
    assert int(presets) == len(list_presets())
