"""tutor.theory.parallel's DDP overlap: buckets, ring all-reduce time, and what backward hides.

The model is DDP's reducer as Li et al. describe it ("PyTorch Distributed", VLDB 2020, arXiv
2006.15704, §3.2.3): a bucket is all-reduced once its last gradient is ready, one all-reduce at a
time, while backward goes on. The worked examples below are computed by hand from that rule.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tutor.errors import UserError
from tutor.theory.parallel import (
    DDP_BUCKET_BYTES,
    DDP_FIRST_BUCKET_BYTES,
    allreduce_time,
    ddp_bucket_sizes,
    ddp_overlap,
)

MIB = 2**20


def test_defaults_are_torch_ddps() -> None:
    # torch.nn.parallel.DistributedDataParallel(bucket_cap_mb=25); the first bucket capped at 1 MiB.
    assert DDP_BUCKET_BYTES == 25 * MIB
    assert DDP_FIRST_BUCKET_BYTES == MIB


def test_resnet50_gradients_make_five_buckets_with_the_defaults() -> None:
    # ResNet-50 (torchvision, 25,557,032 parameters), FP32 gradients, the DDP paper's first model:
    # 1 MiB, then three full 25 MiB buckets, then the remainder.
    grad = 25_557_032 * 4
    sizes = ddp_bucket_sizes(grad)
    assert sizes == (MIB, 25 * MIB, 25 * MIB, 25 * MIB, grad - 76 * MIB)
    assert sum(sizes) == grad


def test_ring_allreduce_time_is_latency_plus_two_n_minus_one_over_n_of_the_buffer() -> None:
    # nccl-tests doc/PERFORMANCE.md: busbw = algbw x 2(n-1)/n for all-reduce.
    assert allreduce_time(100 * MIB, 8, busbw=100 * MIB) == pytest.approx(2 * 7 / 8)
    assert allreduce_time(100 * MIB, 2, busbw=100 * MIB, latency_s=0.001) == pytest.approx(1.001)


def test_worked_example_communication_keeps_up_so_only_the_last_bucket_is_exposed() -> None:
    # 100 MiB in four 25 MiB buckets over an 80 ms backward: ready at 20, 40, 60, 80 ms. On 2 ranks
    # (factor 1) at 2.5 GiB/s... each all-reduce of 25 MiB takes 10 ms: ends at 30, 50, 70, 90 ms.
    schedule = ddp_overlap(backward_s=0.080, grad_bytes=100 * MIB, ranks=2, busbw=25 * MIB / 0.010,
                           first_bucket_bytes=None)
    assert [b.ready_s for b in schedule.buckets] == pytest.approx([0.020, 0.040, 0.060, 0.080])
    assert [b.end_s for b in schedule.buckets] == pytest.approx([0.030, 0.050, 0.070, 0.090])
    assert schedule.exposed_s == pytest.approx(0.010)
    assert schedule.communication_s == pytest.approx(0.040)
    assert schedule.hidden_fraction == pytest.approx(0.75)


def test_worked_example_communication_falls_behind_and_queues() -> None:
    # The same step on a link three times slower: 30 ms per bucket. The first starts at 20 ms, the
    # rest queue behind it: ends at 50, 80, 110, 140 ms; exposed = 20 + 4 x 30 - 80 = 60 ms.
    schedule = ddp_overlap(backward_s=0.080, grad_bytes=100 * MIB, ranks=2, busbw=25 * MIB / 0.030,
                           first_bucket_bytes=None)
    assert [b.start_s for b in schedule.buckets] == pytest.approx([0.020, 0.050, 0.080, 0.110])
    assert schedule.exposed_s == pytest.approx(0.060)


def test_a_small_first_bucket_starts_communication_sooner() -> None:
    common = dict(backward_s=0.080, grad_bytes=100 * MIB, ranks=2, busbw=25 * MIB / 0.030)
    assert ddp_overlap(**common).buckets[0].start_s < ddp_overlap(**common, first_bucket_bytes=None).buckets[0].start_s
    assert ddp_overlap(**common).exposed_s < ddp_overlap(**common, first_bucket_bytes=None).exposed_s


@given(backward=st.floats(1e-4, 10.0), grad=st.integers(1, 2**31), ranks=st.integers(2, 1024),
       busbw=st.floats(1e6, 1e12), latency=st.floats(0.0, 1e-3), cap=st.integers(2**16, 2**28))
def test_exposed_time_lies_between_the_last_bucket_and_no_overlap(backward, grad, ranks, busbw, latency, cap) -> None:
    schedule = ddp_overlap(backward_s=backward, grad_bytes=grad, ranks=ranks, busbw=busbw, latency_s=latency,
                           bucket_bytes=cap)
    last = schedule.buckets[-1]
    assert last.ready_s == pytest.approx(backward)
    assert last.end_s - last.start_s <= schedule.exposed_s * (1 + 1e-9) + 1e-12
    assert schedule.exposed_s <= schedule.communication_s * (1 + 1e-9) + 1e-12
    assert 0.0 <= schedule.hidden_fraction <= 1.0 + 1e-9


@pytest.mark.parametrize("kwargs", [dict(backward_s=-1.0), dict(busbw=0), dict(grad_bytes=0), dict(latency_s=-1e-6),
                                    dict(bucket_bytes=0)])
def test_bad_inputs_are_one_line_user_errors(kwargs: dict) -> None:
    args = dict(backward_s=0.1, grad_bytes=MIB, ranks=2, busbw=1e9) | kwargs
    with pytest.raises(UserError) as caught:
        ddp_overlap(**args)
    assert "\n" not in str(caught.value)
