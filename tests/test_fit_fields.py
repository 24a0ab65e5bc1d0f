"""The fit fields are declared once (tutor.answers.fields): the command's options, the calculator and the lab follow."""

from __future__ import annotations

import click
import pytest

from tutor.answers import fields as fit_fields
from tutor.commands.fit import fit
from tutor.errors import UserError
from tutor.theory import activations, fit as fitting
from tutor.theory.memory import TRAINING_RECIPES


# fit's own display flags: how the answer is shown, not fields of the question (tutor/commands/fit.py).
DISPLAY_FLAGS = ("as_json", "trace", "timeline", "svg")


def test_the_fit_commands_options_are_the_declared_fields_in_order() -> None:
    declared = [f.option for f in fit_fields.FIT_FIELDS if f.option and f.name != "model"]
    options = [p.opts[0] for p in fit.params if isinstance(p, click.Option) and p.name not in DISPLAY_FLAGS]
    assert options == declared
    by_name = {p.name: p for p in fit.params}
    assert isinstance(by_name["model"], click.Argument)
    for field in fit_fields.FIT_FIELDS:
        if not field.option or field.name == "model":
            continue
        param = by_name[field.parameter]
        if field.kind == "flag":
            assert param.is_flag, field.name
        else:
            assert param.default == field.default, field.name
        if field.cli_choice:
            assert tuple(param.type.choices) == tuple(str(c) for c in field.options()), field.name


def test_fit_options_takes_only_the_groups_asked_for() -> None:
    @click.command()
    @fit_fields.fit_options("model", "mode", "layout", "device")
    def time(**kwargs):  # noqa: ANN003
        pass

    names = [p.name for p in time.params]
    assert names == ["model", "params", "mode", "dp", "tp", "pp", "ep", "zero", "sequence_parallel", "microbatches",
                     "device"]
    with pytest.raises(ValueError, match="unknown fit option groups"):
        fit_fields.fit_options("layuot")


def test_the_enumerations_are_the_theory_modules_choices() -> None:
    assert tuple(fitting.Recompute) == activations.RECOMPUTE_MODES
    assert tuple(fitting.Attention) == activations.ATTENTION_KINDS
    assert tuple(fitting.Impl) == activations.IMPLEMENTATIONS
    assert tuple(fitting.Recipe) == tuple(TRAINING_RECIPES) + fitting.ADAPTER_RECIPES == fitting.RECIPES
    assert tuple(fitting.Mode) == fitting.MODES and fitting.ZERO_STAGES == (0, 1, 2, 3)


def test_a_checked_choice_is_its_enum_member_and_a_bad_one_is_refused() -> None:
    assert fit_fields.FIELDS["recompute"].check("full") is fitting.Recompute.FULL
    assert fit_fields.FIELDS["zero"].check(3) is fitting.ZeroStage.PARAMETERS
    assert fit_fields.FIELDS["recipe"].check("amp") == "amp"  # an alias stays as typed
    with pytest.raises(UserError, match="recompute must be one of none, selective, full"):
        fit_fields.FIELDS["recompute"].check("most")
    assert fit_fields.request_settings({"seq": "8k", "sequence_parallel": True}) == {
        "seq_len": 8192, "sequence_parallel": True}


def test_flag_names_and_notes_come_from_the_declaration() -> None:
    assert [fit_fields.flag_name(n) for n in ("seq_len", "seq", "sequence_parallel", "lora_rank", "as_json")] == [
        "--seq", "--seq", "--sp", "--lora-rank", "--json"]
    assert fit_fields.ignored_flag_notes(["zero", "kv_dtype", "lora_rank"], "train", "mixed") == [
        "--kv-dtype: ignored here; these flags only apply to inference: training keeps no KV cache",
        "--lora-rank: ignored here; these flags only apply to --recipe lora or qlora"]
    assert fit_fields.ignored_flag_notes(["zero", "seq_len", "lora_rank"], "inference", "mixed") == [
        "--zero, --lora-rank: ignored here; these flags only apply to training (--mode train)"]


def test_the_lab_parameters_take_the_declared_ranges() -> None:
    from tutor.labs import get_probe
    from tutor.labs._params import fit_params

    batch, seq, attention = fit_params(("batch", "seq", "attention"), {"seq": 2048}, {"attention": ("eager", "flash")})
    assert (batch.kind, batch.minimum, batch.maximum, batch.default) == ("int", 1, 1 << 20, 1)
    assert (seq.default, seq.maximum) == (2048, 1 << 24)
    assert attention.choices == ("eager", "flash") and attention.default == "sdpa"
    lab = get_probe("fit")
    assert lab.params_schema["batch"] == batch.describe() and lab.params_schema["seq"] == seq.describe()
    assert lab.default_params["attention"] == "flash" and lab.default_params["model"] == "llama-3.2-1b"


@pytest.mark.parametrize(("typed", "tokens"), [("128k", 131_072), ("8K", 8_192), ("4,096", 4_096), ("2048", 2_048)])
def test_the_command_line_reads_a_length_as_the_calculators_do(typed: str, tokens: int) -> None:
    """One field parser: `--seq 128k` is what the seq field means on the Fit screen and in the calculators."""
    import json

    from tests.cli_runner import run
    from tutor.lessons.calc_fields import check_length

    code, out, err = run(["fit", "llama-3.2-1b", "--seq", typed, "--json"])
    assert code == 0, err
    assert json.loads(out)["request"]["seq_len"] == tokens == check_length(typed, "seq")
