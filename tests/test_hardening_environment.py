"""Environment values a user's shell may hold do not silence or break the commands."""

from __future__ import annotations

import pytest

from tutor.cli import main


@pytest.mark.parametrize("columns", ["0", "-4", "3", "abc"])
def test_an_unusable_columns_value_still_prints_the_answer(columns: str, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", columns)  # COLUMNS=0 made Rich print nothing, with exit 0
    main(["fit", "llama-3.2-1b", "--device", "24GiB"])
    assert "FITS: needs" in capsys.readouterr().out
