"""The lesson values gpu(card) and ceilings(card): a card of the spec table and its sourced ceilings,
reached by name from a lesson's {{ }}."""

from __future__ import annotations

import pytest

from tutor.errors import UserError
from tutor.lessons.values import render_values


def test_gpu_is_the_spec_tables_entry_by_key_or_alias() -> None:
    from tutor.hardware.specs import SPECS_BY_KEY

    spec = SPECS_BY_KEY["h200-sxm"]
    assert render_values('{{ gpu("h200-sxm").name }}') == spec.name
    assert render_values('{{ gpu("h200").peak_tflops("fp8") }}') == render_values(
        '{{ gpu("h200-sxm").peak_tflops("fp8") }}')
    assert render_values('{{ int(gpu("h200").peak_tflops("bf16") * 10) }}') == f"{int(spec.tflops['bf16'] * 10):,}"


def test_ceilings_are_the_ones_tensor_tutor_time_runs_on() -> None:
    from tutor.bench.ceilings import card_ceilings
    from tutor.hardware.specs import SPECS_BY_KEY

    expected = card_ceilings(SPECS_BY_KEY["h100-sxm"])
    assert render_values('{{ int(ceilings("h100").inter_node_link.value) }}') == f"{int(expected.inter_node_link.value):,}"
    assert render_values('{{ int(ceilings("h100").intra_node_link.value) }}') == f"{int(expected.intra_node_link.value):,}"
    assert "NVLink" in render_values('{{ ceilings("h100").intra_node_link.source }}')


@pytest.mark.parametrize("text", ['{{ gpu("h900").name }}', '{{ ceilings("nope").intra_node_link.value }}'])
def test_an_unknown_card_is_one_line(text: str) -> None:
    with pytest.raises(UserError) as caught:
        render_values(text)
    assert "\n" not in str(caught.value)
