"""Fit at scale and its small input bugs; labs refuse what this machine cannot do."""

from __future__ import annotations

import json
import os
import struct
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tutor.commands.fit import fit
from tutor.errors import UserError
from tutor.labs import run_probe
from tutor.files.models import load_config
from tutor.theory.models import architecture_from_config
from tutor.theory.units import parse_bytes, parse_count


def deep_config(layers: int) -> dict:
    return {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 256,
            "intermediate_size": 512, "num_hidden_layers": layers, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 4096,
            "sliding_window": 1024, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}


def test_per_layer_flags_are_built_once() -> None:
    arch = architecture_from_config(deep_config(8), "deep")
    assert arch.layer_uses_sliding_window is arch.layer_uses_sliding_window
    assert arch.layer_is_moe is arch.layer_is_moe
    assert arch.layer_uses_sliding_window == (True,) * 8


def test_fit_of_a_4000_layer_config_is_not_quadratic(tmp_path: Path) -> None:
    # Before the cache: ~50 s (quadratic; 10,000 layers took 6 min). Now well under a second.
    path = tmp_path / "config.json"
    path.write_text(json.dumps(deep_config(4000)))
    start = time.perf_counter()
    result = CliRunner().invoke(fit, [str(path), "--device", "80GB", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert time.perf_counter() - start < 10
    assert json.loads(result.stdout)["fits"] is True


def test_a_huge_device_does_not_print_the_search_bounds_as_answers() -> None:
    result = CliRunner().invoke(fit, ["llama-3.1-8b", "--device", "1e30TB"], catch_exceptions=False)
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    assert "Largest batch at 4,096 tokens: more than 1,048,576 (the search stops there" in text
    assert "Longest sequence at batch 1: more than 16,777,216 tokens" in text
    report = json.loads(CliRunner().invoke(fit, ["llama-3.1-8b", "--device", "1e30TB", "--json"]).stdout)
    assert report["largest_batch_at_search_bound"] and report["largest_seq_len_at_search_bound"]
    small = json.loads(CliRunner().invoke(fit, ["llama-3.1-8b", "--device", "24GiB", "--json"]).stdout)
    assert not small["largest_batch_at_search_bound"] and 0 < small["largest_batch"] < 1 << 20


def test_flags_that_do_not_apply_get_a_note() -> None:
    report = json.loads(CliRunner().invoke(
        fit, ["llama-3.1-8b", "--zero", "3", "--recipe", "qlora", "--device", "80GB", "--json"]).stdout)
    assert any(note.startswith("--zero, --recipe: ignored") for note in report["notes"])
    train = json.loads(CliRunner().invoke(
        fit, ["llama-3.1-8b", "--mode", "train", "--kv-dtype", "fp8", "--device", "80GB", "--json"]).stdout)
    assert any(note.startswith("--kv-dtype: ignored") for note in train["notes"])
    plain = json.loads(CliRunner().invoke(fit, ["llama-3.1-8b", "--device", "80GB", "--json"]).stdout)
    assert not any("ignored" in note for note in plain["notes"])


@pytest.mark.parametrize(("parse", "text"), [(parse_count, "1e400"), (parse_bytes, "1e400GB")])
def test_numbers_too_large_to_represent_say_so(parse, text: str) -> None:
    with pytest.raises(UserError, match="too large") as error:
        parse(text)
    assert "at least" not in str(error.value)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")
def test_a_fifo_as_config_is_refused_not_read(tmp_path: Path) -> None:
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)  # open() on it would block until a writer appears: forever
    outcome: list[BaseException] = []

    def load() -> None:
        try:
            load_config(fifo)
        except BaseException as error:  # handed to the test thread
            outcome.append(error)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # unblock the hung open() so the thread can end, then fail
        with open(fifo, "wb"):
            pass
        pytest.fail("load_config blocked on a FIFO")
    assert isinstance(outcome[0], UserError) and "not a regular file" in str(outcome[0])


def test_an_unknown_safetensors_dtype_is_refused(tmp_path: Path) -> None:
    from tutor.files.models import safetensors_summary

    header = json.dumps({"w": {"dtype": "Q9", "shape": [2, 2], "data_offsets": [0, 4]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    with pytest.raises(UserError, match="unknown dtype 'Q9'"):
        safetensors_summary(tmp_path)


def test_the_activation_limit_message_names_two_different_figures() -> None:
    with pytest.raises(UserError) as error:
        run_probe("activation-memory", {"hidden": 1024, "heads": 8, "seq": 8192, "batch": 8, "layers": 1})
    message = str(error.value)
    # It said "keeps about 512 MiB; the lab allows 512 MiB" for shapes just over the limit.
    kept = int(message.split("keeps ")[1].split(" B")[0].replace(",", ""))
    assert kept > 536_870_912 and "at most 536,870,912 B" in message and message.count("MiB") == 1


def test_lab_limits_refuse_with_both_figures() -> None:
    from tutor.labs.limits import check_lab_fits, collective_buffer_bytes

    with pytest.raises(UserError, match=r"needs about 20 GiB .* has 16 GiB available"):
        check_lab_fits("x", memory_bytes=20 * 2**30, memory_what="w", fix="f", available=16 * 2**30)
    with pytest.raises(UserError, match=r"at least 20 s at this cpu's fp32 peak of 500 GFLOP/s"):
        check_lab_fits("x", memory_bytes=1, memory_what="w", fix="f", available=2**30, flops=1e13, peak=0.5e12)
    check_lab_fits("x", memory_bytes=2**20, memory_what="w", fix="f", available=2**30, flops=1e9, peak=0.5e12)
    assert collective_buffer_bytes(2**30, 16) == 2**30 + 2**26


def test_the_issue_s_training_step_is_refused_before_allocating() -> None:
    start = time.perf_counter()
    with pytest.raises(UserError, match="training-step: needs about"):
        run_probe("training-step", {"hidden": 64, "heads": 1, "layers": 48, "vocab": 512, "batch": 256,
                                    "seq": 8192})
    assert time.perf_counter() - start < 30  # it used to allocate for 69 s, then a traceback


def test_the_issue_s_collective_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import tutor.labs.limits

    monkeypatch.setattr(tutor.labs.limits, "available_memory_bytes", lambda device="cpu": 16 * 10**9)
    with pytest.raises(UserError, match=r"collective: needs about .*16 ranks x \(1.06 GiB of buffers"):
        run_probe("collective", {"ranks": 16, "sizes": "1GiB"})


class RoutingClock:
    """A clock that advances only when the lab routes a token (`cost_s` each): the lab's budget is
    then checked against the work it did, the same on an idle machine and on a busy one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, cost_s: float) -> None:
        import types

        import tutor.labs.moe_routing as moe_routing

        self.now = self.routed = 0
        self.cost_s = cost_s
        real_route = moe_routing.route

        def route(logits, top_k):
            self.routed += 1
            self.now += cost_s
            return real_route(logits, top_k)

        monkeypatch.setattr(moe_routing, "route", route)
        monkeypatch.setattr(moe_routing, "time", types.SimpleNamespace(perf_counter=lambda: self.now))


def test_moe_routing_refuses_a_batch_longer_than_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    from tutor.labs.moe_routing import CALIBRATION_TOKENS

    clock = RoutingClock(monkeypatch, cost_s=1e-4)  # 100,000 tokens: 10 s a batch
    with pytest.raises(UserError, match="one batch of 100,000 tokens over 200 experts takes about 10 s"):
        run_probe("moe-routing", {"tokens": 100_000, "experts": 200, "trials": 1, "budget_s": 0.5})
    assert clock.routed == CALIBRATION_TOKENS  # refused on its sample; it used to route the whole batch


def test_moe_routing_keeps_near_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    from tutor.labs.moe_routing import CHECK_EVERY_TOKENS

    clock = RoutingClock(monkeypatch, cost_s=5e-5)  # 2,000 tokens: 0.1 s a batch, 150 batches 15 s
    result = run_probe("moe-routing", {"tokens": 2000, "experts": 64, "trials": 150, "budget_s": 0.5})
    # It stops at the first look at its clock past the deadline: within one check's worth of routing.
    assert clock.now <= 0.5 + CHECK_EVERY_TOKENS * clock.cost_s
    assert 1 <= result.metrics["batches"] <= 5
