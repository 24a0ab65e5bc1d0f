"""lab pipeline: GPipe/1F1B on 2 local ranks, the measured bubble, the hand-overs and the timeline.

The bubble arithmetic is anchored on ideal timelines (equal blocks, no communication), where it must
give (P-1)/(M+P-1) exactly; the schedules' block orders are run on a fake clock, where they must give
the same bubble and the in-flight counts of theory (replay_timeline, also used to split a measured
bubble into schedule and communication); the step runner is driven through fake links (every
receive posted before the step's time origin: the fix for late hand-overs on gloo); one real 1F1B run
checks what the schedule did (order, causality between stages, hand-overs, micro-batches in flight),
never how fast it ran.
"""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
from rich.console import Console

from tutor.errors import UserError
from tutor.labs import ProbeResult, get_probe, run_probe
from tutor.labs.pipeline import (
    block_durations,
    measured_bubble_fraction,
    peak_in_flight,
    render_pipeline,
    replay_timeline,
    run_step,
    schedule_order,
    source_stage,
    step_time,
    transfer_delay_summary,
    transfers,
)
from tutor.theory.parallel import pipeline_bubble_fraction, pipeline_microbatches_in_flight


def _ideal_gpipe(stages: int, microbatches: int, forward: float = 1.0, backward: float = 2.0) -> list[list[dict]]:
    """Every stage takes `forward` and `backward` per micro-batch; no communication time."""
    timeline: list[list[dict]] = [[] for _ in range(stages)]
    for stage in range(stages):
        for mb in range(microbatches):
            start = (stage + mb) * forward
            timeline[stage].append({"kind": "F", "microbatch": mb, "start_s": start, "end_s": start + forward})
    backward_start = (stages - 1 + microbatches) * forward
    for stage in reversed(range(stages)):
        for mb in range(microbatches):
            start = backward_start + (stages - 1 - stage + mb) * backward
            timeline[stage].append({"kind": "B", "microbatch": mb, "start_s": start, "end_s": start + backward})
    return timeline


@pytest.mark.parametrize(("stages", "microbatches"), [(2, 1), (2, 4), (2, 8), (4, 4), (4, 16)])
def test_an_ideal_gpipe_timeline_has_exactly_the_theory_bubble(stages: int, microbatches: int) -> None:
    timeline = _ideal_gpipe(stages, microbatches)
    span = step_time(timeline, [0.0] * stages)
    assert span == (microbatches + stages - 1) * 3.0
    expected = float(pipeline_bubble_fraction(stages=stages, microbatches=microbatches))
    assert measured_bubble_fraction(timeline, span) == pytest.approx(expected, abs=1e-12)


def test_time_after_the_last_block_counts_as_idle() -> None:
    timeline = _ideal_gpipe(2, 4)
    span = step_time(timeline, [0.0, 30.0])  # one rank's schedule returned late (a slow send)
    assert span == 30.0
    assert measured_bubble_fraction(timeline, span) == pytest.approx(1 - 24 / 60)


def test_peak_in_flight_counts_forwards_whose_backward_has_not_finished() -> None:
    assert [peak_in_flight(events) for events in _ideal_gpipe(3, 5)] == [5, 5, 5]
    one_f_one_b = [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]
    events = [{"kind": kind, "microbatch": mb, "start_s": i, "end_s": i + 1} for i, (kind, mb) in enumerate(one_f_one_b)]
    assert peak_in_flight(events) == 2


def _uniform(stages: int, microbatches: int, forward: float = 1.0, backward: float = 2.0) -> list[dict]:
    return [{(kind, mb): forward if kind == "F" else backward for kind in "FB" for mb in range(microbatches)}
            for _ in range(stages)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("stages", "microbatches"), [(2, 2), (2, 4), (2, 8), (3, 5), (4, 4), (4, 16)])
def test_each_schedule_on_a_fake_clock_has_the_theory_bubble_and_in_flight_counts(
        schedule: str, stages: int, microbatches: int) -> None:
    timeline = replay_timeline(schedule, _uniform(stages, microbatches))
    for events in timeline:
        assert sorted((e["kind"], e["microbatch"]) for e in events) == sorted(
            [(kind, mb) for kind in "FB" for mb in range(microbatches)])
    span = step_time(timeline, [0.0] * stages)
    assert span == (microbatches + stages - 1) * 3.0
    expected = float(pipeline_bubble_fraction(stages=stages, microbatches=microbatches))
    assert measured_bubble_fraction(timeline, span) == pytest.approx(expected, abs=1e-12)
    assert [peak_in_flight(events) for events in timeline] == [
        pipeline_microbatches_in_flight(schedule=schedule, stages=stages, stage=s, microbatches=microbatches)
        for s in range(stages)]


def test_the_replay_removes_communication_and_keeps_the_blocks() -> None:
    timeline = _ideal_gpipe(2, 4)

    def shifted(events: list[dict], by: dict) -> list[dict]:
        return [{**e, "start_s": e["start_s"] + by[e["kind"]], "end_s": e["end_s"] + by[e["kind"]]} for e in events]

    # Each hand-over takes half a unit: stage 1 starts half a unit late, stage 0's backwards a whole unit.
    late = [shifted(timeline[0], {"F": 0.0, "B": 1.0}), shifted(timeline[1], {"F": 0.5, "B": 0.5})]
    assert measured_bubble_fraction(late, step_time(late, [0.0, 0.0])) == pytest.approx(1 - 24 / 32)
    replayed = replay_timeline("gpipe", block_durations(late))
    assert replayed == timeline
    assert measured_bubble_fraction(replayed, step_time(replayed, [0.0, 0.0])) == pytest.approx(0.2)


def test_a_replay_of_orders_that_wait_on_each_other_fails_instead_of_hanging(monkeypatch) -> None:
    import tutor.labs.pipeline as pipeline

    monkeypatch.setattr(pipeline, "schedule_order", lambda schedule, *, stages, stage, microbatches:
                        [("B", 0), ("F", 0)])  # a backward before its own forward can never start
    with pytest.raises(ValueError, match="wait on each other"):
        replay_timeline("gpipe", _uniform(2, 1))


def test_1f1b_fills_with_one_forward_per_later_stage_then_alternates() -> None:
    assert schedule_order("1f1b", stages=3, stage=0, microbatches=4) == [
        ("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2), ("B", 3)]
    assert schedule_order("1f1b", stages=3, stage=2, microbatches=4) == [
        ("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]
    assert schedule_order("gpipe", stages=3, stage=1, microbatches=2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]


class _FakeLinks:
    """Records what the step runner asks of the links, on the fake clock's time."""

    def __init__(self, log: list, clock: list, stage: int, stages: int) -> None:
        self.log, self.clock, self.stage, self.stages = log, clock, stage, stages

    def post_receives(self) -> None:
        self.log.append(("post_receives",))

    def receive(self, kind: str, mb: int):
        if source_stage(kind, self.stage, self.stages) is None:
            return None
        self.clock[0] += 0.5  # the data arrives half a time unit after the wait began
        self.log.append(("receive", kind, mb))
        return f"input of {kind}{mb}"

    def send(self, kind: str, mb: int, output) -> None:
        self.log.append(("send", kind, mb, output))

    def finish(self) -> None:
        self.clock[0] += 0.25
        self.log.append(("finish",))


def test_the_step_runner_posts_every_receive_before_the_time_origin_and_sends_right_after_each_block() -> None:
    log: list = []
    clock = [10.0]

    def start() -> float:
        log.append(("start",))
        return clock[0]

    def compute(kind: str, mb: int, received):
        log.append(("compute", kind, mb, received))
        clock[0] += 1.0 if kind == "F" else 2.0
        return f"output of {kind}{mb}"

    order = schedule_order("1f1b", stages=2, stage=1, microbatches=2)
    record = run_step(order, _FakeLinks(log, clock, stage=1, stages=2), compute, start, lambda: clock[0])
    # Receives are posted first, so a neighbour's send never waits for this stage to reach the block.
    assert log[:2] == [("post_receives",), ("start",)]
    assert log[-1] == ("finish",)
    blocks = log[2:-1]
    assert blocks == [
        ("receive", "F", 0), ("compute", "F", 0, "input of F0"), ("send", "F", 0, "output of F0"),
        ("compute", "B", 0, None), ("send", "B", 0, "output of B0"),
        ("receive", "F", 1), ("compute", "F", 1, "input of F1"), ("send", "F", 1, "output of F1"),
        ("compute", "B", 1, None), ("send", "B", 1, "output of B1")]
    assert record["events"] == [
        {"kind": "F", "microbatch": 0, "start_s": 0.5, "end_s": 1.5},
        {"kind": "B", "microbatch": 0, "start_s": 1.5, "end_s": 3.5},
        {"kind": "F", "microbatch": 1, "start_s": 4.0, "end_s": 5.0},
        {"kind": "B", "microbatch": 1, "start_s": 5.0, "end_s": 7.0}]
    assert record["receives"] == [{"kind": "F", "microbatch": 0, "wait_s": 0.0, "received_s": 0.5},
                                  {"kind": "F", "microbatch": 1, "wait_s": 3.5, "received_s": 4.0}]
    assert record["end_s"] == 7.25  # the step ends when its sends have completed


def test_a_hand_over_delay_counts_from_the_later_of_send_and_wait() -> None:
    timeline = [[{"kind": "F", "microbatch": 0, "start_s": 0.0, "end_s": 1.0},
                 {"kind": "F", "microbatch": 1, "start_s": 1.0, "end_s": 2.0},
                 {"kind": "B", "microbatch": 0, "start_s": 5.0, "end_s": 7.0}],
                [{"kind": "F", "microbatch": 0, "start_s": 1.5, "end_s": 2.5},
                 {"kind": "F", "microbatch": 1, "start_s": 2.5, "end_s": 3.5},
                 {"kind": "B", "microbatch": 0, "start_s": 3.5, "end_s": 4.5}]]
    receives = [[{"kind": "B", "microbatch": 0, "wait_s": 2.0, "received_s": 5.0}],
                [{"kind": "F", "microbatch": 0, "wait_s": 0.0, "received_s": 1.5},  # waiting: 0.5 after the send
                 {"kind": "F", "microbatch": 1, "wait_s": 2.5, "received_s": 2.5}]]  # data was already there
    found = transfers(timeline, receives)
    assert [(t["kind"], t["microbatch"], t["from_stage"], t["to_stage"]) for t in found] == [
        ("F", 0, 0, 1), ("F", 1, 0, 1), ("B", 0, 1, 0)]
    assert [t["delay_s"] for t in found] == [0.5, 0.0, 0.5]
    assert transfer_delay_summary(found) == {"median": 0.5, "max": 0.5, "count": 3}
    assert transfer_delay_summary([]) is None


def test_in_flight_theory_gpipe_holds_all_1f1b_at_most_the_depth() -> None:
    assert pipeline_microbatches_in_flight(schedule="gpipe", stages=4, stage=3, microbatches=8) == 8
    assert [pipeline_microbatches_in_flight(schedule="1f1b", stages=4, stage=s, microbatches=8)
            for s in range(4)] == [4, 3, 2, 1]
    assert pipeline_microbatches_in_flight(schedule="1F1B", stages=4, stage=0, microbatches=2) == 2
    with pytest.raises(UserError, match="unknown pipeline schedule"):
        pipeline_microbatches_in_flight(schedule="zb", stages=2, stage=0, microbatches=2)
    with pytest.raises(UserError, match="stage must be"):
        pipeline_microbatches_in_flight(schedule="gpipe", stages=2, stage=2, microbatches=2)


@pytest.mark.parametrize(("params", "message"), [
    ({"schedule": "1f1b", "microbatches": 1}, "1f1b needs at least as many micro-batches as stages"),
    ({"schedule": "interleaved"}, "unknown schedule 'interleaved'"),
    ({"stages": 1}, "stages must be between 2"),
])
def test_bad_parameters_are_one_line_user_errors_before_any_rank_starts(params: dict, message: str) -> None:
    with pytest.raises(UserError, match=message) as caught:
        run_probe("pipeline", params)
    assert "\n" not in str(caught.value)


def _result(timeline: list[list[dict]], span: float) -> ProbeResult:
    details = {"bubble_fraction": {"measured": measured_bubble_fraction(timeline, span), "theory": 0.2},
               "schedule": "gpipe", "stages": len(timeline), "microbatches": 4, "step_s": span, "timeline": timeline}
    return ProbeResult("pipeline", (), {}, "", details=details)


def _drawn(result: ProbeResult, width: int) -> list[str]:
    console = Console(width=width, record=True, color_system=None)
    console.print(render_pipeline(result))
    return console.export_text().splitlines()


def test_the_timeline_draws_one_row_per_stage_scaled_to_the_width() -> None:
    result = _result(_ideal_gpipe(2, 4), 15.0)
    for width in (60, 120):
        lines = _drawn(result, width)
        rows = [line for line in lines if line.startswith("stage ")]
        assert len(rows) == 2
        assert all(len(row) == width for row in rows)
        assert "F0" in rows[0] and "B3" in rows[0]
        # Stage 0 waits while stage 1 runs its first backward: idle dots between its forwards and backwards.
        assert "·" in rows[0][rows[0].index("F3"):rows[0].index("B0")]
        # Stage 1 idles while the pipeline fills: its row starts with dots.
        assert rows[1].split()[2].startswith("·")


@pytest.mark.slow
def test_labs_json_and_render_of_a_real_1f1b_run() -> None:
    result = get_probe("pipeline").run({"stages": 2, "microbatches": 4, "schedule": "1f1b", "microbatch_tokens": 64,
                                        "hidden": 64, "steps": 2}, lambda fraction, message: None,
                                       __import__("threading").Event())
    data = json.loads(json.dumps(result.to_json()))
    assert data["bubble_fraction"]["theory"] == float(Fraction(1, 5))
    assert 0.0 < data["bubble_fraction"]["measured"] < 1.0
    timeline = data["timeline"]
    assert len(timeline) == 2
    for events in timeline:
        assert sorted((e["kind"], e["microbatch"]) for e in events) == sorted(
            [("F", mb) for mb in range(4)] + [("B", mb) for mb in range(4)])
        for before, after in zip(events, events[1:]):
            assert before["end_s"] <= after["start_s"]  # one stage runs one block at a time
    by_key = [{(e["kind"], e["microbatch"]): e for e in events} for events in timeline]
    for mb in range(4):  # activations flow forward, gradients back
        assert by_key[1][("F", mb)]["start_s"] >= by_key[0][("F", mb)]["end_s"]
        assert by_key[0][("B", mb)]["start_s"] >= by_key[1][("B", mb)]["end_s"]
    # 1F1B: the last stage alternates one forward, one backward.
    assert [(e["kind"], e["microbatch"]) for e in timeline[1]] == [
        ("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]
    assert [entry["measured"] for entry in data["in_flight"]] == [entry["theory"] for entry in data["in_flight"]] == [2, 1]
    # Every activation and every gradient crossed once, never before its sender's block had ended.
    handovers = data["transfers"]
    assert sorted((t["kind"], t["microbatch"], t["from_stage"]) for t in handovers) == sorted(
        [("F", mb, 0) for mb in range(4)] + [("B", mb, 1) for mb in range(4)])
    for handover in handovers:
        assert handover["received_s"] >= max(handover["sent_s"], handover["wait_s"])
    assert data["transfer_delay_s"]["count"] == 8
    assert data["core_wait_share"] is None or 0.0 <= data["core_wait_share"] < 1.0
    # Replayed with free hand-overs the same blocks can only wait less.
    assert 0.0 < data["bubble_with_free_handovers"] <= data["bubble_fraction"]["measured"] + 1e-9
    assert all(entry["activation_bytes_per_microbatch"] > 0 for entry in data["in_flight"])
    assert "stage 1" in "\n".join(_drawn(result, 100))
    # Beside it, the theory's schedule of the same blocks: every block, its bubble the formula's.
    assert [sorted((e["kind"], e["microbatch"]) for e in events) for events in data["theory_timeline"]] == [
        sorted((e["kind"], e["microbatch"]) for e in events) for events in timeline]
    assert data["theory_schedule_bubble"] == pytest.approx(data["bubble_fraction"]["theory"])
    assert "theory's schedule" in "\n".join(_drawn(result, 100))


@pytest.mark.slow
def test_the_hand_written_schedule_trains_exactly_as_torchs_schedule() -> None:
    from tutor.labs.pipeline import pipeline_rank
    from tutor.bench.ranks import run_ranks

    params = {"stages": 2, "microbatches": 3, "schedule": "gpipe", "hidden": 32, "layers_per_stage": 1,
              "microbatch_tokens": 16, "steps": 3, "seed": 1}
    ours = run_ranks(pipeline_rank, params, ranks=2, timeout_s=120)
    torchs = run_ranks(pipeline_rank, {**params, "torch_schedules": True}, ranks=2, timeout_s=120)
    losses = [[step["loss"] for step in result[1]["steps"]] for result in (ours, torchs)]
    assert losses[0] == losses[1]  # same losses after two SGD steps: same gradients, same 1/M scaling
    assert losses[0][0] != losses[0][-1]  # and the model did train
    assert [step["receives"] for step in torchs[1]["steps"]] == [[]] * 3  # torch's path records no hand-overs


@pytest.mark.skipif(not __import__("os").path.exists("/proc/thread-self/schedstat"), reason="Linux schedstat only")
def test_the_run_queue_wait_is_read_in_seconds_and_only_grows() -> None:
    from tutor.labs.pipeline import _run_queue_wait_s

    first = _run_queue_wait_s()
    sum(range(200_000))
    second = _run_queue_wait_s()
    assert isinstance(first, float) and isinstance(second, float)
    assert 0.0 <= first <= second < 1e6  # nanoseconds read as seconds: not 1e9 times too large


def test_the_theory_schedule_is_drawn_beside_the_measured_one_on_one_scale() -> None:
    from tutor.labs.pipeline import equal_block_durations

    measured = _ideal_gpipe(2, 4)
    theory = replay_timeline("gpipe", equal_block_durations(measured))
    result = _result(measured, 15.0)
    result.details.update(theory_timeline=theory, theory_step_s=step_time(theory, [0.0, 0.0]),
                          theory_schedule_bubble=measured_bubble_fraction(theory, step_time(theory, [0.0, 0.0])))
    lines = _drawn(result, 100)
    rows = [line for line in lines if line.startswith("stage ")]
    assert len(rows) == 2 + 2 and all(len(row) == 100 for row in rows)  # two pictures, one lane per stage each
    assert any(line.startswith("measured: gpipe") for line in lines)
    assert any(line.startswith("theory's schedule") for line in lines)
    assert any("(table)" in line for line in lines)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("stages", "microbatches"), [(2, 4), (4, 8), (3, 5)])
def test_equal_blocks_replayed_give_the_formula_bubble(schedule: str, stages: int, microbatches: int) -> None:
    from tutor.labs.pipeline import equal_block_durations

    uneven = [[{"kind": kind, "microbatch": i, "start_s": 0.0, "end_s": (1.0 + 0.1 * stage + 0.01 * i) * (2 if kind == "B" else 1)}
               for kind in "FB" for i in range(microbatches)] for stage in range(stages)]
    theory = replay_timeline(schedule, equal_block_durations(uneven))
    bubble = measured_bubble_fraction(theory, step_time(theory, [0.0] * stages))
    assert bubble == pytest.approx(float(Fraction(stages - 1, microbatches + stages - 1)))
