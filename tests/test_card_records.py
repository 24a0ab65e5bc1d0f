"""One record per GPU card (tutor/hardware/cards/<key>.json): every fact with its source, the records
reproduce the six tables they replaced, a bad file names itself and its field, and a card is one file."""

from __future__ import annotations

import copy
import json
import shutil
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from tutor.bench.ceilings import INTRA_NODE_LINKS, PUBLISHED_MAMF_BF16, card_ceilings
from tutor.errors import UserError
from tutor.hardware import specs
from tutor.hardware.card_records import CardRecordError, load_card, load_cards, parse_card
from tutor.files.models import resolve_model
from tutor.theory.fit import FitRequest
from tutor.theory.step_time import training_step_time

ROOT = Path(__file__).resolve().parent.parent
CARDS = ROOT / "tutor" / "hardware" / "cards"
BEFORE = json.loads((ROOT / "tests" / "fixtures" / "hardware" / "card_tables_before_records.json")
                    .read_text(encoding="utf-8"))["cards"]
SOURCED = ("driver_memory", "intra_node_link", "mamf", "clocks")


def _raw(key: str) -> dict:
    return json.loads((CARDS / f"{key}.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", sorted(CARDS.glob("*.json")), ids=lambda path: path.stem)
def test_every_record_has_every_field_and_every_fact_its_source(path: Path) -> None:
    raw = json.loads(path.read_text(encoding="utf-8"))
    assert set(raw) == {"key", "name", "listing_order", "name_patterns", "aliases", "datasheet", *SOURCED}
    assert raw["key"] == path.stem
    assert raw["datasheet"]["source"].strip()
    assert set(raw["datasheet"]["dense_tflops"]) == set(specs.SPEC_DTYPES)
    for fact in SOURCED:
        assert raw[fact] is None or raw[fact]["source"].strip(), f"{path.name}: {fact} has no source"
    # Every card the project lists can price a step across GPUs: none lacks its link today.
    assert raw["intra_node_link"] is not None
    load_card(path)  # and the loader accepts it


def test_the_records_reproduce_the_tables_they_replaced() -> None:
    """The six tables of specs.py and ceilings.py as main held them (the fixture), value for value."""
    assert list(specs.SPECS_BY_KEY) == list(BEFORE)  # same cards, same listing order
    patterns = dict(specs._PATTERNS)
    for key, before in BEFORE.items():
        spec = asdict(specs.SPECS_BY_KEY[key])
        assert spec == {name: before[name] for name in spec}, key
        assert patterns[key] == before["patterns"], key
        assert {alias: note for alias, (card, note) in specs.GPU_ALIASES.items() if card == key} == before["aliases"]
        assert (list(specs.DRIVER_MEMORY[key]) if key in specs.DRIVER_MEMORY else None) == before["driver_memory"]
        assert (list(INTRA_NODE_LINKS[key]) if key in INTRA_NODE_LINKS else None) == before["intra_node_link"]
        mamf = PUBLISHED_MAMF_BF16.get(key)
        assert (None if mamf is None else [mamf[0], mamf[1], list(mamf[2])]) == before["mamf_bf16"], key


def test_the_name_patterns_of_two_cards_never_match_the_same_name() -> None:
    # match_gpu_spec takes the first card that matches; with exclusive patterns the listing order cannot matter.
    from tests.test_hardware_specs import KNOWN_NAMES

    for name, key in KNOWN_NAMES:
        normalized = specs._normalize(name)
        assert [k for k, pattern in specs._COMPILED if pattern.fullmatch(normalized)] == [key]


def _broken(change) -> dict:
    data = copy.deepcopy(_raw("h100-sxm"))
    change(data)
    return data


@pytest.mark.parametrize(("change", "field"), [
    (lambda d: d["datasheet"].pop("source"), "datasheet: missing field(s) source"),
    (lambda d: d["datasheet"].update(source=" "), "datasheet.source"),
    (lambda d: d["datasheet"]["dense_tflops"].update(bf16="989.4"), "datasheet.dense_tflops.bf16"),
    (lambda d: d["datasheet"]["dense_tflops"].pop("fp8"), "datasheet.dense_tflops: missing field(s) fp8"),
    (lambda d: d["datasheet"].update(bandwidth_gbps=0), "datasheet.bandwidth_gbps"),
    (lambda d: d["datasheet"].update(confidence="maybe"), "datasheet.confidence"),
    (lambda d: d.pop("mamf"), "the file: missing field(s) mamf"),
    (lambda d: d.update(bandwith=1), "unknown field(s) bandwith"),
    (lambda d: d["driver_memory"].pop("source"), "driver_memory: missing field(s) source"),
    (lambda d: d["intra_node_link"].update(kind="infiniband"), "intra_node_link.kind"),
    (lambda d: d["intra_node_link"].update(generation=9), "intra_node_link.generation"),
    (lambda d: d["intra_node_link"].pop("source"), "intra_node_link: missing field(s) source"),
    (lambda d: d["mamf"].update(shape_mnk=[2048, 2048]), "mamf.shape_mnk"),
    (lambda d: d["clocks"].update(sm_count=132.5), "clocks.sm_count"),
    (lambda d: d["name_patterns"].append("h100 ("), "name_patterns[2]"),
    (lambda d: d.update(key="h100-sxm5"), "key: 'h100-sxm5' differs from the file name"),
])
def test_a_bad_card_file_names_the_file_and_the_field(tmp_path: Path, change, field: str) -> None:
    path = tmp_path / "h100-sxm.json"
    path.write_text(json.dumps(_broken(change)), encoding="utf-8")
    with pytest.raises(CardRecordError) as error:
        load_card(path)
    assert "h100-sxm.json" in str(error.value) and field in str(error.value)


def test_a_file_that_is_not_json_is_named(tmp_path: Path) -> None:
    path = tmp_path / "l4.json"
    path.write_text('{"key": "l4",', encoding="utf-8")
    with pytest.raises(CardRecordError, match=r"l4\.json: not readable JSON"):
        load_card(path)


def _new_card() -> dict:
    card = _raw("l4")
    card.update(key="l4-test", name="L4 (a test card)", listing_order=1000, name_patterns=["l4 test"],
                aliases={"l4t": ""})
    return card


def test_adding_a_card_is_adding_one_file(tmp_path: Path) -> None:
    folder = tmp_path / "cards"
    shutil.copytree(CARDS, folder)
    (folder / "l4-test.json").write_text(json.dumps(_new_card()), encoding="utf-8")
    cards = load_cards(folder)
    assert [card.key for card in cards] == [*specs.SPECS_BY_KEY, "l4-test"]
    added = cards[-1]
    assert added.spec.name == "L4 (a test card)" and added.aliases == {"l4t": ""}
    assert added.intra_node_link is not None and added.intra_node_link.generation == 4
    # The shipped folder is exactly the tables' content: one file per card, nothing listed elsewhere.
    assert sorted(path.stem for path in CARDS.glob("*.json")) == sorted(specs.SPECS_BY_KEY)


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.update(listing_order=10), "listing_order: 10 is also h100-sxm's"),
    (lambda d: d.update(aliases={"H100": ""}), "'H100' is also a name of h100-sxm"),
])
def test_two_cards_never_share_a_listing_position_or_a_typed_name(tmp_path: Path, change, message) -> None:
    folder = tmp_path / "cards"
    shutil.copytree(CARDS, folder)
    card = _new_card()
    change(card)
    (folder / "l4-test.json").write_text(json.dumps(card), encoding="utf-8")
    with pytest.raises(CardRecordError, match=message.replace("(", r"\(")):
        load_cards(folder)


def test_a_card_without_a_link_record_says_so_and_refuses_a_step_across_its_gpus() -> None:
    data = _raw("l4")
    data.update(key="l4-nolink", intra_node_link=None)
    record = parse_card(data, "l4-nolink.json")
    assert record.intra_node_link is None
    ceilings = card_ceilings(record.spec, "bf16")  # not among the shipped records: no link on record
    assert ceilings.intra_node_link is None
    assert any("no intra-node link on record" in note for note in ceilings.notes)
    model = resolve_model("llama-3.1-8b")[0]
    with pytest.raises(UserError, match="no intra node link bandwidth known for l4-nolink"):
        training_step_time(model, FitRequest(mode="train", batch=1, seq_len=1024, tp=2), ceilings)
    # One GPU talks to nobody: its step needs no link and is still timed.
    assert training_step_time(model, FitRequest(mode="train", batch=1, seq_len=1024), ceilings).seconds > 0


def test_every_shipped_card_prices_its_link_from_its_record() -> None:
    for key, spec in specs.SPECS_BY_KEY.items():
        ceilings = card_ceilings(spec, "fp16")
        kind, generation = INTRA_NODE_LINKS[key]
        assert ceilings.intra_node_link is not None
        line = f"NVLink {generation}" if kind == "nvlink" else f"PCIe Gen{generation}"
        link = specs.CARDS_BY_KEY[key].intra_node_link
        assert line in ceilings.intra_node_link.source and link is not None
        assert ceilings.intra_node_link.source.endswith(f"the {spec.name}'s link: {link.source}")


def test_a_card_without_a_memory_bandwidth_is_refused_not_defaulted() -> None:
    spec = replace(specs.SPECS_BY_KEY["l4"], bandwidth_gbps=0)
    with pytest.raises(UserError, match="L4 has no memory bandwidth on record"):
        card_ceilings(spec, "bf16")
