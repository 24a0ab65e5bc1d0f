"""The shipped curriculum's index kept between launches (tutor.lessons.index_cache): a launch whose
lesson files did not change reads no TOML, and any change, damage or unwritable folder means the
files are parsed and checked as before."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tutor.errors import UserError
from tutor.lessons import index_cache, loader
from tutor.lessons.loader import LESSONS_DIR_ENV, lessons_root, load_curriculum


@pytest.fixture()
def lessons(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the shipped lessons, named by $TENSOR_TUTOR_LESSONS_DIR as an install's own would be."""
    copy = tmp_path / "lessons"
    shutil.copytree(lessons_root(), copy, ignore=shutil.ignore_patterns("*.md"))
    monkeypatch.setenv(LESSONS_DIR_ENV, str(copy))
    return copy


def no_toml(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Record every TOML file the loader parses from now on."""
    parsed: list[Path] = []
    real = loader._read_toml

    def recording(path: Path, root: Path):
        parsed.append(path)
        return real(path, root)

    monkeypatch.setattr(loader, "_read_toml", recording)
    return parsed


def test_an_unchanged_curriculum_is_read_from_the_index(lessons: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = load_curriculum()
    assert index_cache.cache_path().is_file()
    parsed = no_toml(monkeypatch)
    again = load_curriculum()
    assert parsed == []
    assert again.tracks == first.tracks and again.infos == first.infos and again.root == first.root
    assert list(again.infos) == list(first.infos)  # curriculum order kept


def test_an_edit_of_the_same_size_is_parsed_afresh(lessons: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    load_curriculum()
    lesson_toml = lessons / "precision" / "bits-of-a-float" / "lesson.toml"
    text = lesson_toml.read_text(encoding="utf-8")
    edited = text.replace("minutes = 10", "minutes = 12")
    assert edited != text and len(edited) == len(text)  # same size: only the content tells
    lesson_toml.write_text(edited, encoding="utf-8")
    parsed = no_toml(monkeypatch)
    assert load_curriculum().info("precision/bits-of-a-float").minutes == 12
    assert parsed  # the files were read, and the index rewritten from them
    parsed.clear()
    assert load_curriculum().info("precision/bits-of-a-float").minutes == 12 and parsed == []


def test_a_broken_lesson_file_is_still_refused_after_a_cached_launch(lessons: Path) -> None:
    load_curriculum()
    (lessons / "precision" / "bits-of-a-float" / "lesson.toml").write_text("id = [", encoding="utf-8")
    with pytest.raises(UserError, match="not valid TOML"):
        load_curriculum()


@pytest.mark.parametrize("damage", ["{not json", json.dumps({"format": index_cache.FORMAT, "tracks": 3}),
                                    json.dumps([1, 2]), ""])
def test_a_damaged_index_is_ignored_and_rewritten(lessons: Path, monkeypatch: pytest.MonkeyPatch, damage: str) -> None:
    expected = load_curriculum()
    index_cache.cache_path().write_text(damage, encoding="utf-8")
    parsed = no_toml(monkeypatch)
    assert load_curriculum().infos == expected.infos and parsed
    parsed.clear()
    assert load_curriculum().infos == expected.infos and parsed == []


def test_control_characters_in_a_tampered_index_never_reach_the_screen(lessons: Path) -> None:
    load_curriculum()
    path = index_cache.cache_path()
    stored = json.loads(path.read_text(encoding="utf-8"))
    stored["lessons"][0]["title"] = "evil\x1b[2Jtitle"
    path.write_text(json.dumps(stored), encoding="utf-8")
    title = load_curriculum().lessons[0].title
    assert "\x1b" not in title


def test_an_unwritable_cache_folder_only_costs_the_parse(lessons: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the data folder should be", encoding="utf-8")
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(blocked))
    assert len(load_curriculum().lessons) == len(load_curriculum().lessons) > 0


def test_crlf_lesson_files_are_read_from_the_index_too(lessons: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for path in lessons.rglob("*.toml"):
        path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    first = load_curriculum()
    parsed = no_toml(monkeypatch)
    assert load_curriculum().infos == first.infos and parsed == []


def test_a_curriculum_named_by_its_folder_is_never_cached(lessons: Path) -> None:
    load_curriculum(lessons)  # lint and tests name their folder: always parsed and checked
    assert not index_cache.cache_path().exists()


def test_the_index_keeps_each_lessons_completing_blocks_and_reads_an_edited_page_afresh(lessons: Path) -> None:
    # The fixture's copy has no pages: a page added is a change, and one edited is read again.
    lesson_id = "precision/range-vs-precision"
    page = lessons / lesson_id / "lesson.md"
    assert load_curriculum().info(lesson_id).blocks == ()
    shutil.copyfile(Path(__file__).resolve().parents[1] / "lessons" / lesson_id / "lesson.md", page)
    shipped = load_curriculum()
    blocks = shipped.info(lesson_id).blocks
    parsed = tuple(block.id for block in shipped.lesson(lesson_id).blocks
                   if block.directive in ("quiz", "predict", "measure", "exercise"))
    assert blocks == parsed and len(blocks) >= 2  # the page's own ids, as opening the lesson names them
    page.write_text(page.read_text(encoding="utf-8") + '\n```quiz\nid = "added"\nquestion = "?"\nkind = "text"\n'
                    'answer = "x"\n```\n', encoding="utf-8")
    assert load_curriculum().info(lesson_id).blocks == (*blocks, "added")
