"""tutor.files.untrusted, the one reader of JSON and TOML a user, an editor, a download or a disk may have
damaged: each rule it keeps, and the one line it says when a file breaks one."""

from __future__ import annotations

import json
import math

import pytest

from tutor.errors import UserError
from tutor.files.untrusted import (CPYTHON_INT_DIGITS, MAX_DIGITS, MAX_NESTING, OBJECTS, POSITIVE_NUMBER, POSITIVE_WHOLE,
                             TooDeepError, UntrustedDataError, check_fields, expect, loads_json, loads_toml,
                             shown_value)


def read(text: str | bytes, **rules) -> object:
    return loads_json(text, what="config.json", max_bytes=1 << 20, **rules)


def test_an_integer_past_cpythons_limit_is_refused_as_too_large_naming_its_field() -> None:
    with pytest.raises(UntrustedDataError) as refused:
        read('{"layers": [1, {"hidden_size": 1' + "0" * 5000 + "}]}")
    assert str(refused.value) == ("config.json: layers[1].hidden_size is an integer of 5,001 digits, too large "
                                  f"(at most {MAX_DIGITS} digits)")
    assert isinstance(refused.value, UserError)  # one line and exit code 2 wherever it escapes


def test_integers_up_to_the_digit_limit_are_read_exactly() -> None:
    big = int("9" * MAX_DIGITS)
    assert read(json.dumps({"n": big, "m": -big})) == {"n": big, "m": -big}
    with pytest.raises(UntrustedDataError, match="41 digits"):
        read(json.dumps({"n": big * 10}))
    assert read(json.dumps({"n": 10**4000}), max_digits=CPYTHON_INT_DIGITS) == {"n": 10**4000}


@pytest.mark.parametrize("text, shown", [("NaN", "NaN"), ("Infinity", "Infinity"), ("-Infinity", "-Infinity"),
                                         ("1e999", "inf"), ("-1e999", "-inf")])
def test_numbers_that_are_not_finite_are_refused_or_kept_for_a_reader_that_cleans_them(text: str, shown: str) -> None:
    with pytest.raises(UntrustedDataError, match=rf"^config.json: x\[0\] is {shown}, not a finite number$"):
        read('{"x": [' + text + "]}")
    kept = read('{"x": [' + text + "]}", non_finite="keep")
    assert not math.isfinite(kept["x"][0])


@pytest.mark.parametrize("text", ['{"name": "a\\ud800b"}', '{"\\udfff": 1}', '[{"x": ["\\ud83d"]}]'])
def test_a_lone_surrogate_is_refused_in_values_and_keys(text: str) -> None:
    with pytest.raises(UntrustedDataError, match="lone surrogate"):
        read(text)
    with pytest.raises(UntrustedDataError, match="lone surrogate"):
        read(text, strings="keep")  # never kept: no UTF-8 file could hold it again
    assert read('{"emoji": "\\ud83d\\ude00"}') == {"emoji": "\U0001F600"}  # a surrogate pair is a character


def test_control_characters_are_refused_cleaned_or_kept_as_asked() -> None:
    text = '{"_name_or_path": "evil\\u001b[2J\\u0007", "note": "tab\\tand\\nnewline"}'
    with pytest.raises(UntrustedDataError, match="^config.json: _name_or_path holds a control character"):
        read(text)
    assert read(text, strings="clean") == {"_name_or_path": "evil\\x1b[2J\\x07", "note": "tab\tand\nnewline"}
    assert read(text, strings="keep")["_name_or_path"] == "evil\x1b[2J\x07"


def test_text_longer_than_the_limit_is_refused_naming_the_field() -> None:
    with pytest.raises(UntrustedDataError, match="^config.json: _name_or_path is text of 100,000 characters, over "
                                                 "the 16,384 it may have$"):
        read(json.dumps({"_name_or_path": "x" * 100_000}), max_chars=16_384)
    assert read(json.dumps({"k": "x" * 16_384}), max_chars=16_384)["k"] == "x" * 16_384


@pytest.mark.parametrize("levels", [MAX_NESTING + 1, 100_000])
def test_nesting_deeper_than_the_limit_is_refused_never_a_recursion_error(levels: int) -> None:
    with pytest.raises(TooDeepError, match=f"nested deeper than {MAX_NESTING} levels"):
        read("[" * levels + "]" * levels)
    assert read("[" * MAX_NESTING + "]" * MAX_NESTING) is not None


def test_size_encoding_and_syntax_are_one_line_each() -> None:
    with pytest.raises(UntrustedDataError, match="^f: is 11 bytes, over the 10-byte limit$"):
        loads_json(b'{"a": 1234}', what="f", max_bytes=10)
    with pytest.raises(UntrustedDataError, match=r"^f: is not UTF-8 text \(byte 1\)$"):
        loads_json(b'"\xff"', what="f", max_bytes=10)
    with pytest.raises(UntrustedDataError, match=r"^f: is not valid JSON \(line 1, column 7"):
        loads_json('{"a": }', what="f", max_bytes=10)
    assert loads_json(b'\xef\xbb\xbf{"a": 1}', what="f", max_bytes=20) == {"a": 1}  # a byte-order mark


def test_toml_integers_are_bounded_in_every_base_and_past_cpythons_limit() -> None:
    with pytest.raises(UntrustedDataError, match="^v: v is an integer too large"):
        loads_toml("v = 0x1" + "0" * 5000, what="v")  # hexadecimal: CPython's limit never applies
    with pytest.raises(UntrustedDataError, match="more than 4,300 digits, too large"):
        loads_toml("v = 1" + "0" * 5000, what="v")
    assert loads_toml("v = 0xff\nw = [1, 2]", what="v") == {"v": 255, "w": [1, 2]}


def test_toml_inf_nan_and_escaped_controls_are_refused() -> None:
    for text in ("v = inf", "v = -inf", "v = nan", "v = [1.0, nan]"):
        with pytest.raises(UntrustedDataError, match="not a finite number"):
            loads_toml(text, what="v")
    with pytest.raises(UntrustedDataError, match="control character"):
        loads_toml('v = "\\u001b[31m"', what="v")
    with pytest.raises(UntrustedDataError, match=r"is not valid TOML \(Invalid value"):
        loads_toml("v = ", what="v")
    with pytest.raises(TooDeepError):
        loads_toml("v = " + "[" * 5000 + "]" * 5000, what="v")


def test_a_field_of_the_wrong_kind_is_one_line_naming_the_file_and_the_field() -> None:
    config = {"hidden_size": "abc", "r": 0, "lr": float("inf"), "sweep": "text", "huge": 10**5000}
    with pytest.raises(UntrustedDataError) as refused:
        expect(config, "hidden_size", POSITIVE_WHOLE, what="config.json")
    assert str(refused.value) == 'config.json: hidden_size must be a positive whole number, got "abc"'
    with pytest.raises(UntrustedDataError, match='^a.json: r must be a positive whole number, got 0$'):
        expect(config, "r", POSITIVE_WHOLE, what="a.json")
    assert expect(config, "missing", POSITIVE_WHOLE, what="a.json", default=8) == 8
    with pytest.raises(UntrustedDataError, match="^a.json: missing is missing; it must be a positive whole"):
        expect(config, "missing", POSITIVE_WHOLE, what="a.json")
    with pytest.raises(UntrustedDataError, match=r"^n: results\[2\].lr must be a positive finite number, got Infinity$"):
        check_fields(config, {"lr": POSITIVE_NUMBER}, what="n", where="results[2]")
    with pytest.raises(UntrustedDataError, match='sweep must be a list of objects, got "text"'):
        check_fields(config, {"sweep": OBJECTS}, what="n")
    check_fields({"lr": None, "other": "x"}, {"lr": POSITIVE_NUMBER}, what="n")  # null: not measured
    assert shown_value(10**5000) == "an integer of about 5,000 digits"  # never str() past CPython's limit
    assert shown_value("y" * 100) == '"' + "y" * 36 + "..."  # cut to 40 characters for one line
