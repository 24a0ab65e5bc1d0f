"""lab ddp: DistributedDataParallel on two gloo ranks keeps the replicas identical and counts its buckets."""

from __future__ import annotations

import io

import pytest
import torch  # noqa: F401  (a hard dependency: missing is a failure, not a skip)
from rich.console import Console

from tutor.errors import UserError
from tutor.labs import ProbeResult, get_probe, run_probe
from tutor.labs.ddp import bucket_overlap, ddp_lanes, overlap_fraction


@pytest.mark.slow
def test_two_ranks_train_identical_replicas_and_all_reduce_every_gradient() -> None:
    result = run_probe("ddp", {"steps": 2, "hidden": 32, "layers": 1, "batch": 2, "seq": 16, "bucket_cap_mb": 0.05})
    data = result.to_json()
    assert set(result.metrics) == set(get_probe("ddp").metrics)
    assert data["replicas_identical"] is True and data["max_replica_difference"] == 0.0
    # Not vacuous: the ranks saw different data and the parameters moved.
    assert data["parameters_changed"] is True
    first_losses = {r["loss_first"] for r in data["per_rank"]}
    assert len(first_losses) == 2
    # DDP hands every FP32 gradient to all-reduce once per step, in several buckets at this cap.
    assert data["gradient_bytes_per_step"]["measured"] == data["gradient_bytes_per_step"]["theory"] == 4 * data["parameters"]
    assert data["buckets"]["count"] >= 2 and sum(data["buckets"]["bytes"]) == data["gradient_bytes_per_step"]["measured"]
    # Two ranks: a ring all-reduce sends 2(n-1)/n = 1 x the buffer.
    assert data["communication_bytes_per_rank"]["measured"] == data["communication_bytes_per_rank"]["theory"]
    split = data["step_split"]
    assert split["compute_s"] > 0 and split["communication_s"] > 0 and split["step_s"] > 0
    assert 0.0 <= split["overlap"] <= 1.0
    text = io.StringIO()
    Console(file=text, width=100).print(get_probe("ddp").render(result))
    assert "DDP step" in text.getvalue() and "█" in text.getvalue()
    # Every bucket DDP handed over has its all-reduce on rank 0's step timeline, ready before done.
    timeline = data["bucket_timeline"]
    assert sorted(b["bytes"] for b in timeline["buckets"]) == sorted(data["buckets"]["bytes"])
    assert all(0 < b["ready_s"] <= b["done_s"] <= timeline["backward_s"] + 1e-3 for b in timeline["buckets"])
    assert 0 < timeline["forward_s"] < timeline["backward_s"]
    assert "bucket 0" in text.getvalue() and "hidden" in text.getvalue()


def test_a_bucket_is_hidden_while_backward_still_computes() -> None:
    moments = {"forward_s": 1.0, "backward_s": 9.0, "step_s": 9.0, "buckets": [
        {"index": 1, "bytes": 100, "ready_s": 6.0, "done_s": 9.0},   # ready last: backward is done then
        {"index": 0, "bytes": 200, "ready_s": 2.0, "done_s": 4.0}]}  # all of it before 6.0
    overlap = bucket_overlap(moments)
    assert [b["index"] for b in overlap] == [0, 1]  # in the order they were ready
    assert [b["hidden_share"] for b in overlap] == [1.0, 0.0]
    moments["buckets"][0]["done_s"] = 7.0  # the last-ready bucket (index 1)
    moments["buckets"].append({"index": 2, "bytes": 50, "ready_s": 5.0, "done_s": 7.0})  # 1 of its 2 s before 6.0
    assert [b["hidden_share"] for b in bucket_overlap(moments)] == [1.0, 0.5, 0.0]


def test_the_ddp_step_draws_a_lane_per_bucket_and_its_table() -> None:
    timeline = {"forward_s": 1.0, "backward_s": 9.0, "step_s": 9.0,
                "buckets": bucket_overlap({"buckets": [{"index": 0, "bytes": 2048, "ready_s": 2.0, "done_s": 4.0},
                                                       {"index": 1, "bytes": 1024, "ready_s": 6.0, "done_s": 9.0}]})}
    lanes = ddp_lanes(timeline)
    assert [lane.label for lane in lanes.lanes] == ["rank 0 compute", "bucket 0 2 KiB", "bucket 1 1 KiB"]
    text = io.StringIO()
    result = ProbeResult("ddp", (), {}, "", details={"bucket_timeline": timeline, "per_rank": []})
    Console(file=text, width=80).print(get_probe("ddp").render(result))
    drawn = text.getvalue()
    assert "100% hidden" in drawn and "0% hidden" in drawn and "(table)" in drawn


def test_overlap_is_the_hidden_share_of_communication() -> None:
    assert overlap_fraction(10.0, 4.0, 11.0) == pytest.approx(0.75)  # 3 of the 4 ms hidden
    assert overlap_fraction(10.0, 4.0, 20.0) == 0.0  # slower than both in a row: none hidden
    assert overlap_fraction(10.0, 4.0, 9.0) == 1.0
    assert overlap_fraction(10.0, 0.0, 10.0) == 0.0


def test_bad_sizes_are_one_line() -> None:
    with pytest.raises(UserError, match="multiple of 4"):
        run_probe("ddp", {"hidden": 30})
    with pytest.raises(UserError, match="ranks must be between"):
        run_probe("ddp", {"ranks": 1})
