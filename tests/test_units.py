"""Sizes and counts as users type them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tutor.errors import UserError
from tutor.theory.units import GB, GiB, parse_bytes, parse_count


@pytest.mark.parametrize(("text", "expected"), [("24GiB", 24 * GiB), ("80GB", 80 * GB), ("80 G", 80 * GB),
                                                ("1e9", 10**9), ("1.5TiB", 3 * 2**39), ("512mib", 512 * 2**20)])
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(("text", "expected"), [("7B", 7 * 10**9), ("1.5e9", 1_500_000_000), ("350M", 350 * 10**6),
                                                ("124439808", 124_439_808), ("8_030_261_248", 8_030_261_248)])
def test_parse_count(text: str, expected: int) -> None:
    assert parse_count(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "-1GB", "0", "1e400", "ten", "24 GiBs", "nan"])
def test_bad_sizes_are_user_errors(text: str) -> None:
    with pytest.raises(UserError):
        parse_bytes(text)


@given(st.text(max_size=20))
def test_parsers_raise_only_user_errors(text: str) -> None:
    for parse in (parse_bytes, parse_count):
        try:
            assert parse(text) >= 1
        except UserError:
            pass

