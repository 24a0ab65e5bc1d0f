"""The serving labs: ttft-tpot, batch-decode, kv-pages and speculative, against tutor.theory.serving.

Every run pins device = "cpu" and small models; no check compares a time with a fixed figure, only
measured figures with each other and with the formulas they are read against."""

from __future__ import annotations

import threading

import pytest

from tutor.errors import UserError
from tutor.labs import run_probe
from tutor.labs.registry import load_lab
from tutor.theory import serving

MODEL = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "device": "cpu"}


# ---- kv-pages (no torch) ----------------------------------------------------------------------

def test_kv_pages_counts_every_scheme_as_its_formula_does() -> None:
    result = run_probe("kv-pages", {"requests": 40, "prompt_max": 300, "output_max": 200, "max_len": 1024,
                                    "block_size": 16, "shared_prefix": 100})
    metrics, lengths = result.metrics, result.details["lengths"]
    per_token = metrics["bytes_per_token"]
    assert per_token == 2 * 32 * 8 * 128 * 2  # Llama-3.1-8B in BF16
    assert metrics["used_bytes"] == sum(lengths) * per_token
    assert metrics["contiguous_bytes"] == serving.contiguous_reserved_tokens(lengths, 1024) * per_token
    assert metrics["paged_bytes"] == serving.paged_reserved_tokens(lengths, 16) * per_token
    saved = serving.prefix_cache_saved_tokens(requests=40, prefix_tokens=100, block_size=16)
    assert metrics["prefix_cached_bytes"] == metrics["paged_bytes"] - saved * per_token
    assert metrics["paged_bytes"] - metrics["used_bytes"] < 40 * 16 * per_token
    assert metrics["capacity_gain"] > 1
    assert all(row.percent_of_theory in (None, 100.0) for row in result.rows if row.unit == "B")


def test_kv_pages_one_token_blocks_waste_nothing_and_share_the_whole_prefix() -> None:
    metrics = run_probe("kv-pages", {"requests": 5, "prompt_max": 10, "output_max": 10, "max_len": 64,
                                     "block_size": 1, "shared_prefix": 7}).metrics
    assert metrics["paged_bytes"] == metrics["used_bytes"]
    assert metrics["prefix_cached_bytes"] == metrics["used_bytes"] - 4 * 7 * metrics["bytes_per_token"]


def test_kv_pages_a_mix_longer_than_max_len_is_one_line() -> None:
    with pytest.raises(UserError, match="kv-pages: shared_prefix \\+ prompt_max \\+ output_max .* max_len"):
        run_probe("kv-pages", {"prompt_max": 4000, "output_max": 4000, "max_len": 4096})


def test_the_block_pool_reuses_freed_blocks_and_keeps_shared_ones_alive() -> None:
    from tutor.labs.kv_pages import BlockPool

    pool = BlockPool(4)
    pool.start(0)
    pool.append(0, 9)  # 3 blocks
    pool.start(1, pool.tables[0][:2], 8)  # shares the two full blocks
    pool.append(1, 1)
    assert pool.blocks_held == 4
    pool.finish(0)
    assert pool.blocks_held == 3  # the shared two live on in request 1
    pool.start(2)
    pool.append(2, 4)
    assert pool.created == 4  # the freed block was handed out again
    pool.finish(1)
    pool.finish(2)
    assert pool.blocks_held == 0


# ---- ttft-tpot --------------------------------------------------------------------------------

@pytest.mark.slow
def test_ttft_tpot_reports_consistent_rates() -> None:
    pytest.importorskip("transformers")
    result = run_probe("ttft-tpot", {**MODEL, "prompt": 64, "tokens": 4, "batch": 2, "budget_s": 0.5})
    m = result.metrics
    assert not result.cancelled and m["ttft_s"] > 0 and m["tpot_s"] > 0
    assert m["ttft_over_tpot"] == pytest.approx(m["ttft_s"] / m["tpot_s"])
    assert m["prefill_tokens_per_s"] == pytest.approx(2 * 64 / m["ttft_s"])
    assert m["server_tokens_per_s"] == pytest.approx(2 * m["user_tokens_per_s"])
    # A 64-token prompt in one pass costs less than 64 separate steps would: the weights are read once.
    assert m["ttft_over_tpot"] < 64
    assert m["prefill_over_decode_flops"] > 1
    assert set(load_lab("ttft-tpot").metrics_for({})) == set(m)


# ---- batch-decode -----------------------------------------------------------------------------

@pytest.mark.slow
def test_batch_decode_throughput_and_the_schedules() -> None:
    pytest.importorskip("transformers")
    result = run_probe("batch-decode", {**MODEL, "prompt": 4, "batches": "8,1,4", "steps": 4, "requests": 20,
                                        "output_max": 50, "budget_s": 1.0})
    m = result.metrics
    mix = result.details["output_tokens"]
    assert list(result.details["step_s"]) == ["1", "4", "8"]
    assert m["tokens_per_s_last"] == pytest.approx(8 / m["step_s_last"])
    assert m["throughput_gain"] == pytest.approx(m["tokens_per_s_last"] / m["tokens_per_s_first"])
    static = serving.static_batching_schedule(mix, 8)
    continuous = serving.continuous_batching_schedule(mix, 8)
    assert m["continuous_over_static"] == pytest.approx(static.steps / continuous.steps) and m["continuous_over_static"] >= 1
    assert m["static_tokens_per_s"] == pytest.approx(sum(mix) / (static.steps * m["step_s_last"]))
    assert m["continuous_mean_latency_s"] <= m["static_mean_latency_s"]


@pytest.mark.parametrize("batches", ["0,2", "1,x", "", "1.5", "300"])
def test_batch_sizes_outside_one_to_256_are_one_line(batches: str) -> None:
    with pytest.raises(UserError, match="batch-decode: batches must be whole numbers from 1 to 256"):
        from tutor.labs.serving_latency import batch_sizes

        batch_sizes(batches)


# ---- speculative ------------------------------------------------------------------------------

SPEC = {**MODEL, "layers": 3, "prompt": 4, "tokens": 24, "draft_tokens": 3, "budget_s": 0.5}


@pytest.mark.slow
def test_an_exact_draft_is_always_accepted_and_gives_gamma_plus_one_tokens() -> None:
    pytest.importorskip("transformers")
    m = run_probe("speculative", {**SPEC, "refine": 0.0}).metrics
    assert m["acceptance_rate"] == 1.0 and m["matches_target"] == 1.0
    # every full round yields γ + 1; only the last round may be cut short by the token count
    assert m["tokens_per_step"] == pytest.approx(4, rel=0.1)
    assert m["theory_tokens_per_step"] == 4


@pytest.mark.slow
def test_a_refined_target_rejects_some_drafts_and_the_output_stays_the_targets() -> None:
    pytest.importorskip("transformers")
    m = run_probe("speculative", {**SPEC, "refine": 1.0}).metrics
    assert m["matches_target"] == 1.0
    assert m["acceptance_rate"] < 1
    assert m["theory_tokens_per_step"] == pytest.approx(
        serving.speculative_expected_tokens_per_step(m["acceptance_rate"], 3))
    assert 1 <= m["tokens_per_step"] < 4
    assert m["theory_speedup"] == pytest.approx(serving.speculative_speedup(m["acceptance_rate"], 3, m["draft_cost"]))


def test_a_draft_as_deep_as_the_target_is_one_line() -> None:
    pytest.importorskip("transformers")
    with pytest.raises(UserError, match="speculative: draft_layers \\(3\\) must be fewer"):
        run_probe("speculative", {**SPEC, "draft_layers": 3})


@pytest.mark.parametrize("lab", ["ttft-tpot", "batch-decode", "speculative"])
def test_a_hidden_size_that_is_not_a_multiple_of_heads_is_one_line(lab: str) -> None:
    pytest.importorskip("transformers")
    with pytest.raises(UserError, match=f"{lab}: hidden 66 must be a multiple of heads 4"):
        run_probe(lab, {**MODEL, "hidden": 66})


def test_a_cancel_before_the_start_returns_a_cancelled_result() -> None:
    cancel = threading.Event()
    cancel.set()
    for lab in ("ttft-tpot", "batch-decode", "speculative", "kv-pages"):
        assert load_lab(lab).run({}, lambda fraction, message: None, cancel).cancelled


# ---- host-overhead ----------------------------------------------------------------------------

@pytest.mark.slow
def test_host_overhead_counts_operations_per_layer_and_prices_them() -> None:
    pytest.importorskip("transformers")
    one = run_probe("host-overhead", {"layers": 1, "budget_s": 0.3}).metrics
    three = run_probe("host-overhead", {"layers": 3, "budget_s": 0.3}).metrics
    # Each layer issues the same operations: the count grows by a whole layer's worth per layer.
    per_layer = three["ops_per_step"] - one["ops_per_step"]
    assert per_layer > 10 and (three["ops_per_step"] - one["ops_per_step"]) % 2 == 0
    assert three["ops_per_layer"] == pytest.approx(three["ops_per_step"] / 3)
    assert 0 < three["op_s"] < three["host_step_s"]
    assert three["ops_share"] == pytest.approx(min(1.0, three["ops_per_step"] * three["op_s"] / three["host_step_s"]))


def test_the_operation_counter_sees_each_dispatched_operation() -> None:
    import torch

    from tutor.labs.host_overhead import count_aten_ops

    x = torch.ones(4)
    assert count_aten_ops(lambda: (x + 1) * 2) == 2
    assert count_aten_ops(lambda: None) == 0


@pytest.mark.parametrize("lab", ["ttft-tpot", "batch-decode", "speculative", "host-overhead", "decode-engines"])
def test_a_lab_that_builds_a_transformers_model_says_how_to_install_it_when_it_is_missing(
        lab: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import threading

    from tutor.labs.inference import TRANSFORMERS_MISSING
    from tutor.labs.registry import load_lab

    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    probe = load_lab(lab)
    result = probe.run(probe.default_params, lambda *_: None, threading.Event())
    assert result.probe == lab and not result.cancelled and result.summary == TRANSFORMERS_MISSING
    assert len(result.rows) == 1 and result.rows[0].note == TRANSFORMERS_MISSING
