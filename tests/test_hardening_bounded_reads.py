"""Every state and lesson read is bounded.

A FIFO or device in place of a state or lesson file must not hang the reader; nesting deeper than
tutor.files.storage.MAX_NESTING and files over their size limit are set aside with a warning (or, for a
lesson, one UserError line); a progress file with a bad quiz count is cleaned; a learner id that
cannot be saved is said once; control characters in lesson files never reach the terminal.

The cases that could block are run in a child interpreter with a timeout, so that a regression
fails the test instead of hanging the suite (the timeout is a guard, not a measured figure).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tutor.errors import UserError
from tutor.lessons import load_curriculum
from tutor.lessons.model import Prose
from tutor.lessons.progress import LEARNER_ID_NOT_SAVED, ProgressStore
from tutor.files.settings import load_settings
from tutor.files.storage import MAX_NESTING, STATE_FILE_LIMIT_BYTES, read_json

FIXTURE = Path(__file__).parent / "fixtures" / "lessons"
HANG_GUARD_S = 120
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")


def run_child(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter importing this tree; a hang is a failure, not a stuck suite."""
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                              timeout=HANG_GUARD_S, env={**os.environ, **env})
    except subprocess.TimeoutExpired:
        pytest.fail(f"the reader blocked for {HANG_GUARD_S} s on a file that is not a regular file")


def copy_fixture(tmp_path: Path) -> Path:
    root = tmp_path / "lessons"
    shutil.copytree(FIXTURE, root)
    return root


# ---- FIFOs and devices ------------------------------------------------------------------------


@needs_fifo
@pytest.mark.parametrize(("name", "code"), [
    ("progress.json", "from tutor.lessons.progress import ProgressStore; print(ProgressStore().warning)"),
    ("settings.json", "from tutor.files.settings import load_settings; print(load_settings()[1])"),
    ("results.jsonl", "from tutor.bench.notebook import read_notebook; print(read_notebook().warning)"),
])
def test_a_fifo_in_place_of_a_state_file_is_named_not_read(tmp_path: Path, name: str, code: str) -> None:
    os.mkfifo(tmp_path / name)
    result = run_child(code, TENSOR_TUTOR_DATA_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "not a regular file" in result.stdout
    assert (tmp_path / name).exists()  # left where it is: it holds no data to set aside


@needs_fifo
def test_a_fifo_in_place_of_lesson_md_is_one_clear_error(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path)
    page = root / "experts" / "routing" / "lesson.md"
    page.unlink()
    os.mkfifo(page)
    result = run_child("""
        from tutor.errors import UserError
        from tutor.lessons import load_curriculum
        try:
            load_curriculum().lesson("experts/routing")
        except UserError as error:
            print(error)
    """, TENSOR_TUTOR_LESSONS_DIR=str(root))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "lessons/experts/routing/lesson.md: cannot read (not a regular file)"


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_an_endless_device_in_place_of_progress_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "progress.json").symlink_to("/dev/zero")
    # The address-space cap turns an endless read into a MemoryError in the child, not a full machine.
    result = run_child("""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        from tutor.lessons.progress import ProgressStore
        store = ProgressStore()
        print(store.warning)
        print(store.last_lesson)
    """, TENSOR_TUTOR_DATA_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    # A link in the data folder is never followed: it is moved aside, still pointing at /dev/zero.
    warning, last = result.stdout.splitlines()
    assert warning.startswith("progress.json was a symbolic link to /dev/zero; moved it to progress.json.symlink-")
    assert warning.endswith("started fresh") and last == "None"
    assert [p.name.split("-")[0] for p in tmp_path.iterdir() if p.is_symlink()] == ["progress.json.symlink"]


@needs_fifo
def test_a_fifo_in_place_of_the_lock_file_costs_the_save_not_a_hang(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / ".progress.json.lock")
    store = ProgressStore(tmp_path / "progress.json")
    store.mark_block("experts/routing", "route")  # must return: the lock file is no lock
    assert not store.persistent
    assert "not a regular file" in store.warning
    assert store.lesson_state("experts/routing").done_blocks == {"route"}  # kept in memory


# ---- nesting and size ---------------------------------------------------------------------------


def deep_json(levels: int) -> str:
    return '{"lessons": ' + "[" * levels + "]" * levels + "}"


@pytest.mark.parametrize("levels", [MAX_NESTING + 5, 100_000])
def test_deeply_nested_progress_is_set_aside_with_a_warning(tmp_path: Path, levels: int) -> None:
    path = tmp_path / "progress.json"
    path.write_text(deep_json(levels))
    store = ProgressStore(path)
    assert store.warning.startswith(f"progress.json was unreadable (JSON nested deeper than {MAX_NESTING} levels)")
    assert not path.exists() and len(list(tmp_path.glob("progress.json.corrupt-*"))) == 1
    store.mark_block("experts/routing", "route")
    assert json.loads(path.read_text())["lessons"]["experts/routing"]["done_blocks"] == ["route"]


def test_deeply_nested_settings_fall_back_to_defaults(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text('{"theme": "nord", "x": ' + "[" * 50_000 + "]" * 50_000 + "}")
    settings, warning = load_settings(path)
    assert settings.theme == "textual-dark"
    assert "nested deeper than" in warning


def test_a_state_file_over_its_limit_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text('{"theme": "' + "x" * STATE_FILE_LIMIT_BYTES + '"}')
    value, warning = read_json(path, {})
    assert value == {}
    assert "over the 16,777,216-byte limit" in warning
    assert not path.exists()


def test_a_deeply_nested_notebook_tail_does_not_lose_the_new_run(tmp_path: Path) -> None:
    from tutor.bench.notebook import append_run, read_notebook

    path = tmp_path / "results.jsonl"
    assert append_run({"date": "first"}, [{"kind": "matmul"}], path) is None
    with path.open("a") as handle:
        handle.write("[" * 100_000 + "]" * 100_000 + "\n")
    note = append_run({"date": "second"}, [{"kind": "matmul"}], path)
    assert note is not None and "this run is saved after it" in note
    notebook = read_notebook(path)
    assert [run.date for run in notebook.runs] == ["first", "second"]


def test_a_deeply_nested_notebook_line_is_counted_not_raised(tmp_path: Path) -> None:
    from tutor.bench.notebook import read_notebook

    path = tmp_path / "results.jsonl"
    path.write_text('{"header": {"x": ' + "[" * 100_000 + "]" * 100_000 + '}, "results": []}\n'
                    '{"header": {"date": "kept"}, "results": []}\n')
    notebook = read_notebook(path)
    assert notebook.corrupt_lines == 1
    assert [run.date for run in notebook.runs] == ["kept"]


@pytest.mark.parametrize(("file", "old", "new"), [
    ("experts/routing/lesson.toml", "minutes = 6", "minutes = 6\nx = " + "[" * 5000 + "]" * 5000),
    ("curriculum.toml", "[[tracks]]", "x = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n[[tracks]]"),
])
def test_deeply_nested_toml_is_one_user_error(tmp_path: Path, file: str, old: str, new: str) -> None:
    root = copy_fixture(tmp_path)
    path = root / file
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(UserError, match=f"lessons/{file}: not valid TOML: nested deeper than {MAX_NESTING}"):
        load_curriculum(root)


def test_deeply_nested_toml_in_a_directive_is_one_user_error(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path)
    page = root / "experts" / "routing" / "lesson.md"
    page.write_text(page.read_text().replace('probe = "moe-routing"',
                                             'probe = "moe-routing"\nx = ' + "[" * 5000 + "]" * 5000))
    with pytest.raises(UserError, match=r"lesson.md:\d+: ```measure block is not valid TOML: nested deeper"):
        load_curriculum(root).lesson("experts/routing")


def test_a_lesson_page_over_its_limit_is_one_user_error(tmp_path: Path) -> None:
    from tutor.lessons.loader import PAGE_LIMIT_BYTES

    root = copy_fixture(tmp_path)
    page = root / "experts" / "routing" / "lesson.md"
    page.write_text(page.read_text() + "x" * PAGE_LIMIT_BYTES)
    with pytest.raises(UserError, match=r"lesson.md: cannot read \([\d,]+ bytes, over the 4,194,304-byte limit\)"):
        load_curriculum(root).lesson("experts/routing")


# ---- progress contents --------------------------------------------------------------------------


@pytest.mark.parametrize("attempts", ["3", 2.5, None, True, -4, 10**30, [1]])
def test_a_quiz_count_that_is_not_a_whole_number_is_cleaned(tmp_path: Path, attempts: object) -> None:
    path = tmp_path / "progress.json"
    answer = {"answer": "0.25", "correct": True, "attempts": attempts, "at": 7}
    path.write_text(json.dumps({"lessons": {"experts/routing": {"answers": {"active-fraction": answer}}}}))
    store = ProgressStore(path)
    record = store.answers("experts/routing")["active-fraction"]
    assert (record.answer, record.correct, record.attempts, record.at) == ("0.25", True, 1, "")
    assert store.attempts("experts/routing", "active-fraction") == 1
    store.record_answer("experts/routing", "active-fraction", "0.25", True)
    assert store.attempts("experts/routing", "active-fraction") == 2


@pytest.mark.parametrize("text", ['"predicted": Infinity', '"predicted": NaN', '"predicted": 1' + "0" * 400])
def test_a_guess_that_is_not_a_finite_number_is_dropped(tmp_path: Path, text: str) -> None:
    path = tmp_path / "progress.json"
    path.write_text('{"lessons": {"a/b": {"predictions": {"p": {' + text + ', "measured": Infinity}, '
                    '"q": {"predicted": 2, "measured": 1' + "0" * 400 + '}}}}}')
    predictions = ProgressStore(path).predictions("a/b")
    assert set(predictions) == {"q"}
    assert (predictions["q"].predicted, predictions["q"].measured) == (2.0, None)


def test_a_learner_id_that_cannot_be_saved_is_said_once(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("a file where the data folder belongs")
    store = ProgressStore(tmp_path / "data" / "progress.json")
    first = store.learner_id
    assert store.warning.endswith(LEARNER_ID_NOT_SAVED)
    assert store.learner_id == first  # the same draws for the rest of this session
    assert store.warning.count(LEARNER_ID_NOT_SAVED) == 1


def test_lessons_show_says_the_learner_id_is_not_saved(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("a file where the data folder belongs")
    result = run_child("from tutor.cli import main\nmain(['lessons', 'show', 'experts/routing'])",
                       TENSOR_TUTOR_DATA_DIR=str(tmp_path / "data"), TENSOR_TUTOR_LESSONS_DIR=str(FIXTURE))
    assert result.returncode == 0, result.stderr
    assert result.stderr.count(LEARNER_ID_NOT_SAVED) == 1
    assert "Traceback" not in result.stderr


# ---- control characters from lesson files -------------------------------------------------------


def test_control_characters_in_lesson_files_never_reach_the_terminal(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path)
    toml = root / "experts" / "routing" / "lesson.toml"
    toml.write_text(toml.read_text()
                    .replace('title = "Routing tokens to experts"', r'title = "Routing\u001b]0;owned\u0007 tokens"')
                    .replace('summary = "Top-k routing and load balance."', r'summary = "Top-k\u001b[2J\u009b2J"'))
    curriculum_file = root / "curriculum.toml"
    curriculum_file.write_text(curriculum_file.read_text().replace(
        'title = "Mixture of experts"', r'title = "Mixture\u001bc of experts"'))
    page = root / "experts" / "routing" / "lesson.md"
    page.write_text(page.read_text()
                    .replace("# Routing", "# Routing\x1b]0;owned\x07\n\ttabbed\x1b[2J")
                    .replace('explain = "Count the tokens per expert."', r'explain = "Count\u001b[2J them."'))
    curriculum = load_curriculum(root)
    info = curriculum.info("experts/routing")
    assert info.title == r"Routing\x1b]0;owned\x07 tokens"
    assert info.summary == r"Top-k\x1b[2J\x9b2J"
    assert curriculum.track("experts").title == r"Mixture\x1bc of experts"
    lesson = curriculum.lesson("experts/routing")
    prose = next(block for block in lesson.blocks if isinstance(block, Prose))
    assert prose.text.startswith("# Routing\\x1b]0;owned\\x07\n\ttabbed\\x1b[2J")  # lines and tabs kept
    measure = lesson.block("route")
    assert measure.explain == r"Count\x1b[2J them."
    shown = "".join(str(block) for block in lesson.blocks) + info.title + info.summary
    assert not any(ord(char) < 32 and char not in "\n\t" or 0x7f <= ord(char) <= 0x9f for char in shown)
