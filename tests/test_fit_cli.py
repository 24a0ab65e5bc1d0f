"""`tensor-tutor fit`'s implementation profile (--impl), attention choices and the peak it reports."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from click.testing import CliRunner

from tutor.cli import main
from tutor.commands.fit import fit

TRAIN = ["llama-3.1-8b", "--mode", "train", "--recipe", "bf16", "--device", "80GB"]


def fit_json(args: list[str]) -> dict:
    result = CliRunner().invoke(fit, [*args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def fit_text(args: list[str]) -> str:
    result = CliRunner().invoke(fit, args, catch_exceptions=False, env={"COLUMNS": "200"})  # no wrapping
    assert result.exit_code == 0, result.output
    return result.output


def error_of(argv: list[str]) -> str:
    """stderr of a run that must fail as bad input does: exit code 2, one line, no traceback."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2, (out.getvalue(), err.getvalue())
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tensor-tutor: error:") and "Traceback" not in err.getvalue()
    return lines[0]


def test_impl_and_attention_defaults_are_transformers_as_written() -> None:
    request = fit_json(TRAIN)["request"]
    assert request["impl"] == "hf" and request["attention"] == "sdpa"


@pytest.mark.parametrize("impl", ["hf", "fused"])
@pytest.mark.parametrize("attention", ["eager", "sdpa", "flash"])
def test_every_impl_and_attention_is_accepted_and_echoed(impl: str, attention: str) -> None:
    request = fit_json([*TRAIN, "--impl", impl, "--attention", attention])["request"]
    assert (request["impl"], request["attention"]) == (impl, attention)


def test_fused_kernels_keep_no_more_activations_than_transformers_code() -> None:
    hf = fit_json([*TRAIN, "--impl", "hf"])["per_device_bytes"]["activations"]
    fused = fit_json([*TRAIN, "--impl", "fused"])["per_device_bytes"]["activations"]
    assert 0 < fused <= hf


@pytest.mark.parametrize("args", [TRAIN, ["llama-3.1-8b", "--device", "24GiB"],
                                  ["mixtral-8x7b", "--mode", "train", "--dp", "8", "--ep", "8", "--zero", "3",
                                   "--pp", "2", "--device", "80GB"]])
def test_json_peak_is_a_moment_and_total_is_peak_plus_overhead(args: list[str]) -> None:
    report = fit_json(args)
    per_device, peak = report["per_device_bytes"], report["peak"]
    assert set(peak) >= {"bytes", "phase", "per_category_bytes"}
    assert peak["phase"] in ("forward", "backward", "optimizer", "prefill", "decode")
    assert peak["bytes"] == sum(peak["per_category_bytes"].values()) > 0
    # What must fit: the tensors alive at the peak plus the overhead (context, allocator slack).
    assert per_device["total"] == peak["bytes"] + per_device["overhead"]
    # per_device_bytes keeps each category's own maximum: never below its share at the peak.
    for name, n in peak["per_category_bytes"].items():
        assert n <= per_device.get(name, report["sum_of_components_bytes"]), name
    categories = sum(v for k, v in per_device.items() if k != "total")
    assert report["sum_of_components_bytes"] == categories >= per_device["total"]
    worst = max(report["stages"], key=lambda stage: stage["total_bytes"])
    assert worst["peak"] == peak and worst["total_bytes"] == per_device["total"]


def test_verdict_is_against_the_peak_not_the_sum() -> None:
    report = fit_json(TRAIN)
    capacity = report["device"]["capacity_bytes"]
    assert report["fits"] == (report["per_device_bytes"]["total"] <= capacity)


def test_text_says_which_implementation_and_when_the_peak_happens() -> None:
    report = fit_json(TRAIN)
    text = fit_text(TRAIN)
    flat = " ".join(text.split())  # Rich wraps lines at the terminal's width
    assert "activations assume hf (transformers modules as written" in flat
    assert "--impl fused shows the other" in flat
    assert "sum of categories" in text and "must fit" in text
    peak_line = next(line for line in text.splitlines() if line.startswith("peak:"))
    assert f"{report['peak']['bytes'] / 2**30:,.2f} GiB alive during" in peak_line
    shares = peak_line.split("(", 1)[1].split(")", 1)[0]
    for name, n in report["peak"]["per_category_bytes"].items():
        if n / report["peak"]["bytes"] >= 0.005:  # a share that rounds to 0% is left out
            assert name.replace("_", " ") in shares
        else:
            assert name.replace("_", " ") not in shares
    assert "fused kernels (Korthikanti" in " ".join(fit_text([*TRAIN, "--impl", "fused"]).split())


def test_bare_count_has_a_peak_and_no_implementation_line() -> None:
    args = ["--params", "7B", "--mode", "train", "--device", "80GB"]
    report = fit_json(args)
    assert report["peak"]["bytes"] + report["per_device_bytes"]["overhead"] == report["per_device_bytes"]["total"]
    assert "activations assume" not in fit_text(args)


@pytest.mark.parametrize(("flag", "value"), [("--impl", "megatron"), ("--impl", ""), ("--attention", "flash3"),
                                             ("--attention", "SDPA ")])
def test_bad_impl_or_attention_is_one_line_and_exit_2(flag: str, value: str) -> None:
    line = error_of(["fit", "llama-3.1-8b", flag, value])
    assert flag.lstrip("-") in line.lower() or repr(value) in line


@pytest.mark.parametrize("args", [
    ["llama-3.1-8b", "--mode", "train", "--device", "h100"],
    # Experts are carved out of dp: the tensor-parallel plan must say --ep 1, or the flags give another layout.
    ["mixtral-8x7b", "--mode", "train", "--dp", "8", "--ep", "8", "--device", "24GiB"],
    ["llama-3.1-70b", "--batch", "4", "--seq", "32768", "--device", "80GB"],
])
def test_each_suggestion_run_as_flags_gives_its_total_and_fits(args: list[str]) -> None:
    report = fit_json(args)
    assert report["fits"] is False and report["suggestions"]
    for suggestion in report["suggestions"]:
        flags = suggestion["change"].split(" (")[0].split()  # the flags, without the (reason; devices) note
        changed = fit_json([*args, *flags])
        assert changed["per_device_bytes"]["total"] == suggestion["total_bytes"], suggestion["change"]
        assert changed["fits"] is True and changed["request"]["devices"] == suggestion["devices"]
        for change in suggestion["changes"]:
            assert changed["request"][change["field"]] == change["value"], change


def test_suggestions_are_one_per_kind_and_text_matches_json() -> None:
    args = ["mixtral-8x7b", "--mode", "train", "--dp", "8", "--ep", "8", "--device", "24GiB"]
    report = fit_json(args)
    kinds = [frozenset(change["field"] for change in s["changes"]) for s in report["suggestions"]]
    assert len(kinds) == len(set(kinds))
    text = fit_text(args)
    assert "--ep 1" in text
    for suggestion in report["suggestions"]:
        assert f"  {suggestion['change']}: {suggestion['total_bytes'] / 2**30:,.2f} GiB per device" in text


def test_buffers_too_small_to_show_are_left_out_of_the_table_not_the_json() -> None:
    """Llama's RoPE tables (512 B) would be a row of 0.00 GiB: the table leaves them out, --json keeps them."""
    report = fit_json(TRAIN)
    assert 0 < report["per_device_bytes"]["buffers"] < 4096
    assert not any(line.lstrip("│ ").startswith("buffers") for line in fit_text(TRAIN).splitlines())
