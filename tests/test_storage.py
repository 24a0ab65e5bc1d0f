"""tutor.files.storage and tutor.files.settings: atomic writes, and damaged files set aside instead of crashing."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from tutor.errors import UserError
from tutor.files.settings import Settings, load_settings, save_settings
from tutor.files.storage import DATA_DIR_ENV, data_dir, read_json, write_json_atomic


def corrupt_copies(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}.corrupt-*"))


def test_data_dir_follows_the_environment_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "data"))
    assert data_dir() == tmp_path / "data"


def test_data_dir_defaults_to_platformdirs(monkeypatch: pytest.MonkeyPatch) -> None:
    import platformdirs

    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    assert data_dir() == Path(platformdirs.user_data_dir("tensor-tutor", appauthor=False))


def test_tests_never_use_the_real_data_dir() -> None:
    import platformdirs

    assert data_dir() != Path(platformdirs.user_data_dir("tensor-tutor", appauthor=False))


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "state.json"
    write_json_atomic(path, {"a": [1, 2], "b": "é"})
    assert read_json(path, {}) == ({"a": [1, 2], "b": "é"}, None)
    assert [p.name for p in path.parent.iterdir()] == ["state.json"]  # no temporary file left behind


def test_missing_file_gives_a_fresh_default_without_warning(tmp_path: Path) -> None:
    default = {"lessons": {}}
    value, warning = read_json(tmp_path / "absent.json", default)
    assert value == default and warning is None
    value["lessons"]["x"] = 1
    assert default == {"lessons": {}}  # the caller's default is never handed out for mutation


def test_corrupt_json_is_set_aside_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    path.write_text('{"lessons": {', encoding="utf-8")
    value, warning = read_json(path, {})
    assert value == {}
    assert warning and "progress.json" in warning and "invalid JSON" in warning
    assert not path.exists()
    [aside] = corrupt_copies(path)
    assert aside.read_text(encoding="utf-8") == '{"lessons": {'  # nothing the learner had is destroyed


@pytest.mark.parametrize("content", ["[1, 2]", "42", '"text"', "null"])
def test_json_of_the_wrong_type_is_set_aside(tmp_path: Path, content: str) -> None:
    path = tmp_path / "settings.json"
    path.write_text(content, encoding="utf-8")
    value, warning = read_json(path, {})
    assert value == {} and warning and "expected an object" in warning
    assert len(corrupt_copies(path)) == 1


def test_two_corrupt_files_in_the_same_second_both_survive(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    for text in ("{", "]"):
        path.write_text(text, encoding="utf-8")
        read_json(path, {})
    assert sorted(p.read_text() for p in corrupt_copies(path)) == ["]", "{"]


def test_non_utf8_file_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    path.write_bytes(b"\xff\xfe{")
    value, warning = read_json(path, {})
    assert value == {} and "UTF-8" in warning


def test_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_json_atomic(path, {"v": 1})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"v": object()})  # not JSON-serialisable: fails before any file is touched
    assert json.loads(path.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_write_into_an_impossible_folder_raises_oserror(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where a folder should be")
    with pytest.raises(OSError):
        write_json_atomic(blocker / "progress.json", {})


def test_concurrent_writers_always_leave_a_valid_file(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    errors: list[BaseException] = []
    payloads = [{"writer": n, "data": list(range(n * 50))} for n in range(8)]

    def writer(payload: dict) -> None:
        try:
            for _ in range(15):
                write_json_atomic(path, payload)
                value, warning = read_json(path, {})
                assert warning is None and value in payloads
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(payload,)) for payload in payloads]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert json.loads(path.read_text()) in payloads
    assert [p.name for p in tmp_path.iterdir()] == ["progress.json"]


def _write_many(path: str, writer: int) -> None:
    for round_ in range(25):
        write_json_atomic(Path(path), {"writer": writer, "round": round_, "pad": "x" * 20_000})


def test_concurrent_processes_always_leave_a_valid_file(tmp_path: Path) -> None:
    import multiprocessing

    path = tmp_path / "progress.json"
    write_json_atomic(path, {"writer": -1, "round": 0, "pad": ""})
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_write_many, args=(str(path), n)) for n in range(3)]
    for worker in workers:
        worker.start()
    seen = 0
    while any(worker.is_alive() for worker in workers):
        value, warning = read_json(path, {})
        assert warning is None and set(value) == {"writer", "round", "pad"}  # never half a file
        seen += 1
    for worker in workers:
        worker.join()
        assert worker.exitcode == 0
    assert json.loads(path.read_text())["round"] == 24 and seen > 0


# ---- settings ----------------------------------------------------------------------------------


def test_settings_default_when_there_is_no_file(tmp_path: Path) -> None:
    assert load_settings(tmp_path / "settings.json") == (Settings(), None)
    assert Settings().theme == "textual-dark"


def test_settings_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    chosen = Settings(theme="nord", sample_hz=4, device="cpu")
    assert save_settings(chosen, path) is None
    assert load_settings(path) == (chosen, None)


def test_settings_use_the_data_dir_by_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    save_settings(Settings(theme="gruvbox"))
    assert json.loads((tmp_path / "settings.json").read_text())["theme"] == "gruvbox"
    assert load_settings()[0].theme == "gruvbox"


def test_one_bad_setting_resets_only_itself(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"theme": "nord", "sample_hz": 50, "future_key": True}))
    settings, warning = load_settings(path)
    assert settings == Settings(theme="nord")
    assert warning is not None and "sample_hz" in warning and "future_key" not in warning


def test_corrupt_settings_are_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text("theme = nord")  # TOML, not JSON
    settings, warning = load_settings(path)
    assert settings == Settings() and warning and "moved it to settings.json.corrupt-" in warning


def test_unwritable_settings_folder_is_a_warning_not_a_crash(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    warning = save_settings(Settings(theme="nord"), blocker / "settings.json")
    assert warning is not None and "could not save settings" in warning


def test_saving_an_invalid_setting_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="sample_hz"):
        save_settings(Settings(sample_hz=0.1), tmp_path / "settings.json")
