"""One answer to 'how much memory does this device offer', shared by fit, its lab and the app."""

from __future__ import annotations

import pytest

from tutor.errors import UserError
from tutor.hardware.memory_budget import device_budget

from tests.machines import recorded_h100, recorded_machine

NO_GPU = recorded_machine(ram_available_bytes=20 * 2**30, nvml_reason="NVML Shared Library Not Found")
ONE_GPU = recorded_machine(ram_available_bytes=20 * 2**30, gpus=[recorded_h100(memory_free_bytes=79 * 10**9)])


@pytest.fixture(autouse=True)
def _all_gpus_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_a_gpu_offers_its_free_memory_and_a_cpu_its_available_ram() -> None:
    assert device_budget(None, ONE_GPU).capacity == 79 * 10**9
    assert device_budget("0", ONE_GPU).kind == "cuda"
    assert device_budget(None, NO_GPU).capacity == 20 * 2**30
    assert device_budget("cpu", ONE_GPU).kind == "cpu" and not device_budget("cpu", ONE_GPU).gpu


def test_a_typed_size_is_a_card_you_do_not_have() -> None:
    budget = device_budget("24GiB", NO_GPU)
    assert (budget.capacity, budget.kind, budget.gpu) == (24 * 2**30, "given", True)


@pytest.mark.parametrize(("spec", "machine", "fragment"), [("0", NO_GPU, "NVML Shared Library"),
                                                           ("3", ONE_GPU, "has 1"), ("lots", NO_GPU, "size")])
def test_devices_that_are_not_there(spec: str, machine, fragment: str) -> None:
    with pytest.raises(UserError, match=fragment):
        device_budget(spec, machine)


@pytest.mark.parametrize(("typed", "key"), [("h100", "h100-sxm"), ("H100-SXM", "h100-sxm"), ("a100-40gb", "a100-40gb"),
                                            ("rtx_4090", "rtx-4090"), ("4090", "rtx-4090"), ("L4", "l4"),
                                            ("mi300x", "mi300x"), ("h200", "h200-sxm")])
def test_a_named_card_offers_the_total_its_driver_reports(typed: str, key: str) -> None:
    from tutor.hardware.specs import SPECS_BY_KEY

    budget = device_budget(typed, NO_GPU)  # no machine needed: the card is not here
    spec = SPECS_BY_KEY[key]
    assert (budget.capacity, budget.kind, budget.gpu, budget.name) == (spec.memory_bytes, "spec", True, spec.name)
    assert budget.source_detail == spec.memory_source and budget.to_json()["source_detail"] == spec.memory_source


def test_the_h100_is_the_driver_figure_not_the_datasheet() -> None:
    assert device_budget("h100", NO_GPU).capacity == 81559 * 2**20


def test_a_short_name_says_which_card_it_picked() -> None:
    assert "A100 SXM4 80GB" in device_budget("a100", NO_GPU).source


def test_cuda_colon_index_is_a_gpu_index() -> None:
    assert device_budget("cuda:0", ONE_GPU).capacity == device_budget("0", ONE_GPU).capacity == 79 * 10**9
    with pytest.raises(UserError, match="no GPU 0"):
        device_budget("cuda:0", NO_GPU)
    with pytest.raises(UserError, match="has 1"):
        device_budget("cuda:2", ONE_GPU)


def test_an_unknown_card_lists_close_matches_and_where_to_find_them_all() -> None:
    with pytest.raises(UserError, match=r"close matches: h100.*models --devices"):
        device_budget("h1000", NO_GPU)


def test_sizes_still_parse() -> None:
    assert device_budget("80GB", NO_GPU).capacity == 80 * 10**9
    assert device_budget("24GiB", NO_GPU).kind == "given"
