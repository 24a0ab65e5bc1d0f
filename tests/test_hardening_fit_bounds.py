"""Argument extremes of `fit` are one clear line, exit 2: a LoRA rank above the hidden size, a
--trace of a config too deep to build."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tutor.cli import main
from tutor.files.models import load_preset


def one_line_error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("rank", ["1000000000", "2049"])
def test_a_lora_rank_above_the_hidden_size_is_refused(rank: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = one_line_error(["fit", "llama-3.2-1b", "--mode", "train", "--recipe", "lora", "--lora-rank", rank,
                           "--device", "24GiB"], capsys)
    assert "lora-rank must be between 1 and the model's hidden size 2,048" in line


def test_the_hidden_size_itself_is_a_rank_fit_counts(capsys: pytest.CaptureFixture[str]) -> None:
    main(["fit", "llama-3.2-1b", "--mode", "train", "--recipe", "lora", "--lora-rank", "2048", "--device", "24GiB",
          "--json"])
    assert json.loads(capsys.readouterr().out)["request"]["lora_rank"] == 2048


def test_trace_of_a_10000_layer_config_stops_before_building(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    config, _ = load_preset("llama-3.2-1b")
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 10_000}))
    line = one_line_error(["fit", str(tmp_path), "--trace", "--mode", "train", "--recipe", "bf16"], capsys)
    assert "--trace builds at most 512 layers" in line and "10,000" in line


def test_an_svg_path_that_is_a_fifo_is_refused_not_written(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    import os

    os.mkfifo(tmp_path / "timeline.svg")
    line = one_line_error(["fit", "llama-3.2-1b", "--mode", "train", "--timeline", "--svg",
                           str(tmp_path / "timeline.svg")], capsys)
    assert "not a regular file" in line


def test_save_svg_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    import os
    import threading

    from tutor.errors import UserError
    from tutor.answers.pictures import save_svg

    os.mkfifo(tmp_path / "p.svg")
    outcome: list[BaseException | None] = []

    def write() -> None:
        try:
            save_svg([], tmp_path / "p.svg")
            outcome.append(None)
        except BaseException as error:  # noqa: BLE001 - the outcome is what is checked
            outcome.append(error)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    writer.join(timeout=30)
    assert not writer.is_alive(), "save_svg blocked on a FIFO"
    assert isinstance(outcome[0], UserError)
