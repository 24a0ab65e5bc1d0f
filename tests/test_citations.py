"""Code and shipped data cite sources a reader can open: a paper, a datasheet, a repository file,
never the team's reference notes (../shared/reference/*.md), which do not ship with the package."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTES = re.compile(r"(benchmarking|memory-and-models|tui-and-tutors)\.md|reference/|\breference §|\(reference [§a-z]")


def test_the_package_cites_no_unshipped_reference_notes() -> None:
    shipped = [p for p in (ROOT / "tutor").rglob("*") if p.suffix in (".py", ".json", ".toml", ".md", ".tcss")]
    shipped += [p for p in (ROOT / "lessons").rglob("*") if p.suffix in (".md", ".toml")]
    assert len(shipped) > 100
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in shipped
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if NOTES.search(line)]
    assert found == []
