"""kv-cache and prefill-decode: real transformers caches and real matmuls against tutor.theory.

Anchors: a DynamicCache grows by exactly 2 · layers · kv_heads · head_dim · bytes per token
(tutor.theory.kv_cache); decode reads every weight per token, so its rate stays under
bandwidth / weight bytes (tutor.theory.roofline), while prefill reuses each weight for every
prompt token and runs many times faster per token.
"""

from __future__ import annotations

import pytest

from tutor.errors import UserError
from tutor.labs import run_probe
from tutor.theory.kv_cache import kv_cache_bytes_per_token

pytest.importorskip("transformers")


@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "element"), [("fp32", 4), ("bf16", 2)])
def test_a_real_cache_grows_by_the_formula_per_token(dtype: str, element: int) -> None:
    metrics = run_probe("kv-cache", {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "prompt": 8,
                                     "tokens": 6, "dtype": dtype}).metrics
    per_token = kv_cache_bytes_per_token(layers=2, kv_heads=2, head_dim=16, bytes_per_element=element)
    assert metrics["theory_kv_bytes_per_token"] == per_token
    assert metrics["kv_bytes_per_token"] == per_token
    assert metrics["kv_bytes_after_prompt"] == 8 * per_token
    assert metrics["tokens_cached"] == 14
    assert metrics["kv_bytes_final"] == metrics["theory_kv_bytes_final"] == 14 * per_token


@pytest.mark.slow
def test_grouped_query_attention_shrinks_the_measured_cache() -> None:
    full = run_probe("kv-cache", {"hidden": 64, "heads": 4, "kv_heads": 4, "tokens": 3}).metrics
    grouped = run_probe("kv-cache", {"hidden": 64, "heads": 4, "kv_heads": 1, "tokens": 3}).metrics
    assert full["kv_bytes_per_token"] == 4 * grouped["kv_bytes_per_token"]


def test_the_cache_goes_in_under_the_keyword_this_transformers_reads() -> None:
    # transformers 5.17's forward has only past_key_values (a `cache=` lands in **kwargs, unused, and
    # the lab's cache stays empty); 5.25's has cache.
    from tutor.trace.memory_trace import cache_argument

    class Old:
        def forward(self, input_ids, past_key_values=None, use_cache=None, **kwargs): ...

    class New:
        def forward(self, input_ids, cache=None, use_cache=None, **kwargs): ...

    assert (cache_argument(Old()), cache_argument(New())) == ("past_key_values", "cache")


def test_heads_that_do_not_divide_are_a_user_error() -> None:
    with pytest.raises(UserError, match="multiple of"):
        run_probe("kv-cache", {"hidden": 64, "heads": 4, "kv_heads": 3})


@pytest.mark.slow
def test_decode_is_bandwidth_bound_and_prefill_is_faster_per_token(measure_on_cpu: None) -> None:
    # On the CPU, one core: 64 MiB of fp32 weights is above this machine's 32 MiB L3, so decode streams
    # them from DRAM. A GPU's eager decode of these small matmuls is bound by the host's kernel launches
    # instead (the H200 record: 15x slower than its bandwidth bound), which this test is not about.
    metrics = run_probe("prefill-decode", {"hidden": 1024, "layers": 2, "prompt": 64, "budget_s": 1.5}).metrics
    assert metrics["weight_bytes"] == 2 * 2 * 1024 * 4096 * 4
    assert metrics["decode_intensity"] == pytest.approx(0.5, rel=0.01)  # GEMV: about 2/b with b = 4
    assert metrics["prefill_intensity"] > 20 * metrics["decode_intensity"]
    # Decode reads the weights at least once per token: it cannot beat one pass of reading them (with a
    # margin for timing noise between the two medians).
    assert metrics["decode_over_bound"] < 1.3
    assert metrics["prefill_over_decode"] > 2


@pytest.mark.slow
@pytest.mark.parametrize("lab", ["prefill-decode", "kv-cache"])
def test_a_one_core_lab_gives_torch_its_threads_back(lab: str) -> None:
    """Labs run in the app's long-lived measurement process: a benchmark after one must not run on
    the single thread the lab measured with."""
    import torch

    params = {"prefill-decode": {"hidden": 64, "layers": 1, "prompt": 4, "budget_s": 0.1},
              "kv-cache": {"layers": 1, "hidden": 64, "heads": 4, "kv_heads": 2, "prompt": 4, "tokens": 2}}[lab]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        run_probe(lab, params)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
