"""`fit --device CARD` and `models --devices` as a user types them (click's CliRunner)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tutor.cli import main
from tutor.commands.group import cli
from tutor.hardware.specs import SPECS, SPECS_BY_KEY


def invoke(*argv: str):
    return CliRunner().invoke(cli, list(argv), catch_exceptions=False)


def test_fit_on_a_named_card_uses_the_driver_reported_capacity() -> None:
    result = invoke("fit", "llama-3.1-8b", "--device", "h100", "--json")
    assert result.exit_code == 0, result.output
    device = json.loads(result.output)["device"]
    assert device["capacity_bytes"] == 81559 * 2**20 == SPECS_BY_KEY["h100-sxm"].memory_bytes
    assert device["kind"] == "spec" and "81559MiB" in device["source_detail"]


def test_fit_text_names_the_card_and_its_gib() -> None:
    result = invoke("fit", "llama-3.1-8b", "--device", "a100-40gb")
    assert result.exit_code == 0, result.output
    assert "A100 40GB" in result.output and "40.00 GiB" in result.output


@pytest.mark.parametrize("typed", ["h1000", "rtx-4080", "nvidia"])
def test_an_unknown_card_is_one_line_with_exit_code_2(typed: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "gpt2", "--device", typed])
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and typed in lines[0] and "models --devices" in lines[0]


def test_fit_help_lists_cards() -> None:
    assert "h100" in " ".join(invoke("fit", "--help").output.split())


def test_models_devices_table_lists_every_card() -> None:
    result = CliRunner().invoke(cli, ["models", "--devices"], terminal_width=120)
    assert result.exit_code == 0, result.output
    for spec in SPECS:
        assert spec.key in result.output
    assert "79.65" in result.output  # the H100's 81,559 MiB in GiB


def test_models_devices_json() -> None:
    rows = json.loads(invoke("models", "--devices", "--json").output)["devices"]
    assert [row["key"] for row in rows] == [spec.key for spec in SPECS]
    h100 = rows[0]
    assert (h100["memory_bytes"], h100["memory_datasheet_bytes"], h100["memory_driver_reported"]) == (
        85_520_809_984, 80 * 10**9, True)
    assert "h100" in h100["aliases"] and all(row["memory_source"] for row in rows)


def test_the_calculator_reads_card_names_through_the_same_lookup() -> None:
    from tutor.errors import UserError
    from tutor.lessons.calc_fields import CALC_FIELDS

    check = CALC_FIELDS["device"].check
    assert (check("this"), check("h100"), check("RTX 4090"), check("a100-40gb")) == (
        "this", "h100-sxm", "rtx-4090", "a100-40gb")
    with pytest.raises(UserError, match="models --devices"):
        check("h1000")
