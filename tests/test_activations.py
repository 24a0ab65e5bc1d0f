"""Activation memory against Korthikanti et al. (arXiv 2205.05198): the §4.1 per-tensor derivation,
Table 2, and the Figure 1 numbers for the 22B and 175B GPT models."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tutor.errors import UserError
from tutor.theory.activations import (
    activation_bytes_per_layer,
    activation_bytes_per_layer_gpt,
    embedding_activation_bytes,
    input_ids_bytes,
    layer_activation_terms,
    logits_bytes,
    megatron_output_layer_activation_bytes,
    pipeline_activation_multiplier,
)
from tutor.theory.units import GiB


def gpt_block(**overrides):
    """Keyword arguments describing a GPT layer for `activation_bytes_per_layer`."""
    args = dict(seq_len=2048, batch=4, hidden=6144, heads=64, kv_heads=64, head_dim=96, ffn=4 * 6144,
                gated_mlp=False, dropout=True, attention="eager")
    args.update(overrides)
    return args


# ---- Figure 1 of arXiv 2205.05198 ------------------------------------------------------------

def test_22b_no_recompute_is_59_25_gib() -> None:
    per_layer = activation_bytes_per_layer_gpt(seq_len=2048, batch=4, hidden=6144, heads=64, tp=8)
    assert Fraction(per_layer * 48, GiB) == Fraction("59.25")


def test_22b_sequence_parallel_selective_is_9_5625_gib() -> None:
    per_layer = activation_bytes_per_layer_gpt(
        seq_len=2048, batch=4, hidden=6144, heads=64, tp=8, sequence_parallel=True, recompute="selective"
    )
    assert Fraction(per_layer * 48, GiB) == Fraction("9.5625")


@pytest.mark.parametrize(
    ("sequence_parallel", "recompute", "printed"),
    [(False, "none", "66.84"), (True, "selective", "12.35")],
)
def test_175b_interleaved_first_stage(sequence_parallel: bool, recompute: str, printed: str) -> None:
    # h 12288, a 96, L 96, t 8, p 8, 3 model chunks per stage, b 1, s 2048. The first stage holds
    # L/p = 12 layers for p·(1 + (p-1)/(p·v)) = 31/3 micro-batches: 96 layers × 31/24 in total.
    per_layer = activation_bytes_per_layer_gpt(
        seq_len=2048, batch=1, hidden=12288, heads=96, tp=8,
        sequence_parallel=sequence_parallel, recompute=recompute,
    )
    multiplier = pipeline_activation_multiplier(pp=8, microbatches=64, interleave=3)
    assert multiplier == Fraction(31, 3)
    gib = per_layer * Fraction(96, 8) * multiplier / GiB
    assert f"{float(gib):.2f}" == printed


# ---- §4.1 derivation and Table 2 --------------------------------------------------------------

def test_gpt_terms_follow_the_section_4_1_derivation() -> None:
    s, b, h, a = 512, 2, 256, 4
    terms = {t.name: t.bytes for t in layer_activation_terms(**gpt_block(seq_len=s, batch=b, hidden=h, heads=a,
                                                                           kv_heads=a, head_dim=h // a, ffn=4 * h))}
    sbh, as2b = s * b * h, a * s * s * b
    attention = sum(terms[name] for name in (
        "QKV projection input (norm output)", "Q", "K", "V", "softmax output", "attention dropout mask",
        "attention dropout output", "output projection input (attention output)", "attention residual dropout mask",
    ))
    mlp = sum(terms[name] for name in (
        "MLP input (norm output)", "activation input (first linear output)",
        "second linear input (activation output)", "MLP residual dropout mask",
    ))
    norms = terms["attention norm input"] + terms["MLP norm input"]
    assert len(terms) == 15  # nothing else is counted
    assert attention == 11 * sbh + 5 * as2b
    assert mlp == 19 * sbh
    assert norms == 4 * sbh


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_table_2_rows(tp: int) -> None:
    s, b, h, a = 1024, 2, 1024, 16
    sbh = Fraction(s * b * h)
    row = {
        ("none", False): sbh * (10 + Fraction(24, tp) + Fraction(5 * a * s, h * tp)),
        ("none", True): sbh * (Fraction(34, tp) + Fraction(5 * a * s, h * tp)),
        ("selective", False): sbh * (10 + Fraction(24, tp)),
        ("selective", True): sbh * Fraction(34, tp),
        ("full", False): 2 * sbh,
        ("full", True): 2 * sbh / tp,
    }
    for (recompute, sp), expected in row.items():
        got = activation_bytes_per_layer_gpt(seq_len=s, batch=b, hidden=h, heads=a, tp=tp,
                                             sequence_parallel=sp, recompute=recompute)
        assert got == expected, (recompute, sp)
    assert activation_bytes_per_layer_gpt(seq_len=s, batch=b, hidden=h, heads=a) == sbh * (34 + Fraction(5 * a * s, h))


@settings(max_examples=300, deadline=None)
@given(
    seq_len=st.integers(1, 8192),
    batch=st.integers(1, 16),
    heads_per_rank=st.integers(1, 16),
    tp=st.sampled_from([1, 2, 4, 8]),
    head_dim=st.integers(1, 160),
    sequence_parallel=st.booleans(),
    recompute=st.sampled_from(["none", "selective", "full"]),
)
def test_general_layer_reduces_to_table_2_for_a_gpt_block(
    seq_len, batch, heads_per_rank, tp, head_dim, sequence_parallel, recompute
) -> None:
    heads = heads_per_rank * tp
    hidden = heads * head_dim
    general = activation_bytes_per_layer(
        **gpt_block(seq_len=seq_len, batch=batch, hidden=hidden, heads=heads, kv_heads=heads,
                    head_dim=head_dim, ffn=4 * hidden),
        tp=tp, sequence_parallel=sequence_parallel, recompute=recompute,
    )
    table = activation_bytes_per_layer_gpt(seq_len=seq_len, batch=batch, hidden=hidden, heads=heads, tp=tp,
                                           sequence_parallel=sequence_parallel, recompute=recompute)
    assert general == table


# ---- modern-layer adjustments (reference §2.4) -------------------------------------------------

def test_flash_attention_replaces_s_squared_terms_with_fp32_logsumexp() -> None:
    s, b, h, a, t = 4096, 1, 4096, 32, 2
    common = dict(seq_len=s, batch=b, hidden=h, heads=a, kv_heads=a, head_dim=h // a, ffn=4 * h,
                  gated_mlp=False, dropout=False, tp=t)
    eager = activation_bytes_per_layer(**common, attention="eager")
    flash = activation_bytes_per_layer(**common, attention="flash")
    assert eager - flash == (2 * a * s * s * b - 4 * a * s * b) // t


def test_flash_with_dropout_stores_no_attention_mask() -> None:
    common = gpt_block(attention="flash")
    with_dropout = layer_activation_terms(**common)
    names = {t.name for t in with_dropout}
    assert "attention dropout mask" not in names and "softmax output" not in names
    assert "attention residual dropout mask" in names


def test_selective_recompute_changes_nothing_with_flash() -> None:
    common = gpt_block(attention="flash", dropout=False, tp=4)
    assert activation_bytes_per_layer(**common, recompute="selective") == activation_bytes_per_layer(**common)


def test_no_dropout_removes_masks_and_dropout_output() -> None:
    s, b, h, a = 1024, 2, 2048, 16
    common = dict(seq_len=s, batch=b, hidden=h, heads=a, kv_heads=a, head_dim=h // a, ffn=4 * h, gated_mlp=False)
    with_dropout = activation_bytes_per_layer(**common, dropout=True)
    without = activation_bytes_per_layer(**common, dropout=False)
    # two 1-byte sbh masks, the 1-byte as²b mask and the 2-byte as²b dropout output
    assert with_dropout - without == 2 * s * b * h + 3 * a * s * s * b


def test_gqa_shrinks_k_and_v_only() -> None:
    s, b, h, a, d = 2048, 1, 4096, 32, 128
    mha = activation_bytes_per_layer(**gpt_block(seq_len=s, batch=b, hidden=h, heads=a, kv_heads=32, head_dim=d,
                                                 ffn=14336, gated_mlp=True, dropout=False, attention="flash"))
    gqa = activation_bytes_per_layer(**gpt_block(seq_len=s, batch=b, hidden=h, heads=a, kv_heads=8, head_dim=d,
                                                 ffn=14336, gated_mlp=True, dropout=False, attention="flash"))
    assert mha - gqa == 2 * 2 * s * b * (32 - 8) * d


def test_swiglu_stores_three_ffn_wide_tensors() -> None:
    s, b, h, f = 512, 1, 1024, 2816
    terms = layer_activation_terms(**gpt_block(seq_len=s, batch=b, hidden=h, heads=8, kv_heads=8, head_dim=128,
                                               ffn=f, gated_mlp=True, dropout=False, attention="flash"))
    mlp = sum(t.bytes for t in terms if t.name.startswith(("MLP input", "gate", "up", "down")))
    assert mlp == 2 * s * b * h + 6 * s * b * f


def test_fp32_values_give_the_66_sbh_plus_9_as2b_form() -> None:
    # BERT-large in fp32 (reference §4.1): 16-bit values double, 1-byte masks stay.
    s, b, h, a = 512, 4, 1024, 16
    got = activation_bytes_per_layer(**gpt_block(seq_len=s, batch=b, hidden=h, heads=a, kv_heads=a, head_dim=64,
                                                 ffn=4096), bytes_per_value=4)
    assert got == 66 * s * b * h + 9 * a * s * s * b


def test_kv_heads_are_replicated_when_tp_exceeds_them() -> None:
    common = gpt_block(heads=16, kv_heads=2, head_dim=128, hidden=2048, ffn=8192, dropout=False)
    terms = {t.name: t.bytes for t in layer_activation_terms(**common, tp=8)}
    assert terms["K"] == 2 * 2048 * 4 * 1 * 128  # one KV head per rank, not 2/8


def test_full_recompute_keeps_only_the_layer_input() -> None:
    s, b, h = 2048, 4, 6144
    assert activation_bytes_per_layer(**gpt_block(), recompute="full") == 2 * s * b * h
    split = activation_bytes_per_layer(**gpt_block(), tp=8, sequence_parallel=True, recompute="full")
    assert split == 2 * s * b * h // 8


# ---- outside the layers ----------------------------------------------------------------------------

def test_embedding_dropout_mask_and_ids() -> None:
    assert embedding_activation_bytes(seq_len=2048, batch=4, hidden=6144) == 2048 * 4 * 6144
    split = embedding_activation_bytes(seq_len=2048, batch=4, hidden=6144, tp=8, sequence_parallel=True)
    assert split == 2048 * 4 * 6144 // 8
    assert embedding_activation_bytes(seq_len=2048, batch=4, hidden=6144, dropout=False) == 0
    assert input_ids_bytes(2048, 4) == 8 * 2048 * 4


def test_logits_counts() -> None:
    s, b, v = 4096, 2, 128256
    assert logits_bytes(seq_len=s, batch=b, vocab=v) == 10 * s * b * v
    assert logits_bytes(seq_len=s, batch=b, vocab=v, fp32_loss=False) == 4 * s * b * v
    assert logits_bytes(seq_len=s, batch=b, vocab=v, tp=2) == 5 * s * b * v


def test_megatron_output_layer_form() -> None:
    s, b, h, v, t = 2048, 1, 4096, 50304, 4
    got = megatron_output_layer_activation_bytes(seq_len=s, batch=b, hidden=h, vocab=v, tp=t)
    assert got == 4 * s * b * (h + v) // t


# ---- pipeline ------------------------------------------------------------------------------------

def test_1f1b_in_flight_microbatches() -> None:
    assert pipeline_activation_multiplier(pp=8, microbatches=32) == 8
    assert pipeline_activation_multiplier(pp=8, microbatches=3) == 3  # Megatron: × min(1, m/p)
    assert pipeline_activation_multiplier(pp=8, microbatches=32, stage="last") == 1
    assert pipeline_activation_multiplier(pp=8, microbatches=32, stage=2) == 6
    assert pipeline_activation_multiplier(pp=1, microbatches=32) == 1


@settings(max_examples=200, deadline=None)
@given(pp=st.integers(2, 32), interleave=st.integers(2, 8), rounds=st.integers(2, 8))
def test_interleaved_first_stage_is_megatrons_penalty(pp: int, interleave: int, rounds: int) -> None:
    # Megatron's 1 + (p-1)/(p·v) assumes enough micro-batches to fill the warm-up (m >= 2p suffices).
    multiplier = pipeline_activation_multiplier(pp=pp, microbatches=pp * rounds, interleave=interleave)
    assert multiplier == pp * (1 + Fraction(pp - 1, pp * interleave))


def test_interleaved_with_few_microbatches_holds_them_all() -> None:
    # m = p = 2, v = 2: the warm-up (2(p-1) + (v-1)p = 4 chunks) already covers all m·v = 4 chunks.
    assert pipeline_activation_multiplier(pp=2, microbatches=2, interleave=2) == 2


@settings(max_examples=100, deadline=None)
@given(pp=st.integers(1, 16), m=st.integers(1, 64), interleave=st.integers(1, 4))
def test_earlier_stages_never_hold_less(pp: int, m: int, interleave: int) -> None:
    values = [pipeline_activation_multiplier(pp=pp, microbatches=m, interleave=interleave, stage=r) for r in range(pp)]
    assert values == sorted(values, reverse=True)
    assert all(v > 0 for v in values)


# ---- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "call",
    [
        lambda: activation_bytes_per_layer_gpt(seq_len=0, batch=1, hidden=64, heads=4),
        lambda: activation_bytes_per_layer_gpt(seq_len=8, batch=1, hidden=64, heads=4, tp=3),
        lambda: activation_bytes_per_layer_gpt(seq_len=8, batch=1, hidden=64, heads=4, recompute="some"),
        lambda: activation_bytes_per_layer_gpt(seq_len=True, batch=1, hidden=64, heads=4),
        lambda: activation_bytes_per_layer(**gpt_block(attention="paged")),
        lambda: activation_bytes_per_layer(**gpt_block(kv_heads=5)),
        lambda: activation_bytes_per_layer(**gpt_block(ffn=1001), tp=2),
        lambda: activation_bytes_per_layer(**gpt_block(), bytes_per_value=0),
        lambda: pipeline_activation_multiplier(pp=4, microbatches=8, stage="middle"),
        lambda: pipeline_activation_multiplier(pp=4, microbatches=8, stage=4),
        lambda: pipeline_activation_multiplier(pp=0, microbatches=8),
        lambda: logits_bytes(seq_len=8, batch=1, vocab=-5),
    ],
)
def test_bad_input_is_one_line_user_error(call) -> None:
    with pytest.raises(UserError) as caught:
        call()
    assert "\n" not in str(caught.value)


def test_unknown_recompute_lists_the_choices() -> None:
    with pytest.raises(UserError, match="none, selective, full"):
        activation_bytes_per_layer(**gpt_block(), recompute="partial")
