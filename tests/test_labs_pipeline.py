"""lab pipeline: torch's GPipe/1F1B schedules on 2 local ranks, the measured bubble and the timeline.

The bubble arithmetic is anchored on ideal timelines (equal blocks, no communication), where it must
give (P-1)/(M+P-1) exactly; one real 1F1B run checks what the schedule did (order, causality between
stages, micro-batches in flight), never how fast it ran.
"""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
from rich.console import Console

from tutor.errors import UserError
from tutor.labs import ProbeResult, get_probe, run_probe
from tutor.labs.pipeline import measured_bubble_fraction, peak_in_flight, render_pipeline, step_time
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
    assert all(entry["activation_bytes_per_microbatch"] > 0 for entry in data["in_flight"])
    assert "stage 1" in "\n".join(_drawn(result, 100))
