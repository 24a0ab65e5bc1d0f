"""The content lint (rustlings' `dev check`): every lesson parses, every value renders, every quiz's
own answer passes its own grader, every measure/predict names a real probe with real params.

It runs on the small fixture curriculum (tests/fixtures/lessons/) and on the real lessons/ folder.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tutor.errors import UserError
from tutor.lessons import Curriculum, Lesson, lint, load_curriculum

FIXTURE = Path(__file__).parent / "fixtures" / "lessons"
REAL = Path(__file__).parent.parent / "lessons"
MIN_LESSONS, MIN_TRACKS = 14, 5  # at least 14 lessons in five tracks

ROOTS = [
    pytest.param(FIXTURE, id="fixture"),
    pytest.param(REAL, id="lessons"),
]


def all_lessons(root: Path) -> tuple[Curriculum, list[Lesson]]:
    curriculum = load_curriculum(root)
    return curriculum, [curriculum.lesson(lesson_id) for lesson_id in curriculum.lesson_ids]


def report(problems: list[str]) -> str:
    return f"{len(problems)} problem(s):\n" + "\n".join(problems)


@pytest.mark.parametrize("root", ROOTS)
def test_every_lesson_parses(root: Path) -> None:
    curriculum, lessons = all_lessons(root)  # raises UserError "<file>:<line>: ..." on the first mistake
    assert [lesson.id for lesson in lessons] == list(curriculum.lesson_ids)
    assert len(set(curriculum.lesson_ids)) == len(curriculum.lesson_ids)
    for lesson in lessons:
        assert lesson.path == root / lesson.id / "lesson.md"
        assert lesson.blocks, f"{lesson.id} has an empty lesson.md"


@pytest.mark.parametrize("root", ROOTS)
def test_every_lesson_folder_is_listed(root: Path) -> None:
    curriculum = load_curriculum(root)
    assert lint.unlisted_lesson_folders(curriculum) == []


@pytest.mark.parametrize("root", ROOTS)
def test_every_value_renders_with_and_without_a_device(root: Path) -> None:
    _, lessons = all_lessons(root)
    problems = [problem for lesson in lessons for problem in lint.check_values(lesson)]
    assert not problems, report(problems)


@pytest.mark.parametrize("root", ROOTS)
def test_every_quiz_accepts_its_own_answer_and_rejects_a_wrong_one(root: Path) -> None:
    _, lessons = all_lessons(root)
    problems = [problem for lesson in lessons for problem in lint.check_quizzes(lesson)]
    assert not problems, report(problems)


@pytest.mark.parametrize("root", ROOTS)
def test_every_calculator_starts_from_a_valid_estimate(root: Path) -> None:
    _, lessons = all_lessons(root)
    problems = [problem for lesson in lessons for problem in lint.check_calculators(lesson)]
    assert not problems, report(problems)


@pytest.mark.parametrize("root", ROOTS)
def test_no_hand_typed_figures_in_prose(root: Path) -> None:
    _, lessons = all_lessons(root)
    allow = lint.load_allowlist(root)
    problems = [problem for lesson in lessons for problem in lint.check_hand_typed_numbers(lesson, allow)]
    assert not problems, report(problems)


def real_probes() -> dict:
    from tutor.labs import PROBES

    missing = sorted(name for name, probe in PROBES.items() if not hasattr(probe, "metrics"))
    assert not missing, f"probes lack `metrics: tuple[str, ...]`, so predict metrics cannot be checked: {missing}"
    return PROBES


@pytest.mark.parametrize("root", ROOTS)
def test_every_measure_and_predict_names_a_real_probe(root: Path) -> None:
    probes = real_probes()
    _, lessons = all_lessons(root)
    problems = [problem for lesson in lessons for problem in lint.check_probes(lesson, probes)]
    assert not problems, report(problems)


def test_the_curriculum_is_big_enough() -> None:
    curriculum = load_curriculum(REAL)
    assert len(curriculum.tracks) >= MIN_TRACKS, [track.id for track in curriculum.tracks]
    assert len(curriculum.lessons) >= MIN_LESSONS, len(curriculum.lessons)
    assert all(track.lesson_ids for track in curriculum.tracks)


def test_every_directive_kind_is_used_somewhere() -> None:
    _, lessons = all_lessons(REAL)
    used = {block.directive for lesson in lessons for block in lesson.blocks}
    assert {"prose", "bits", "calc", "measure", "predict", "quiz"} <= used


# ---- the checks themselves catch what they should -----------------------------------------------


@dataclass(frozen=True)
class FakeProbe:
    name: str
    params_schema: dict[str, str]
    metrics: tuple[str, ...] = field(default=())


FAKE_PROBES = {
    "matmul": FakeProbe("matmul", {"dtypes": "list of dtypes", "budget_s": "seconds"},
                        ("tflops_<dtype>", "speedup_<a>_over_<b>")),
    "moe-routing": FakeProbe("moe-routing", {"tokens": "int", "experts": "int", "top_k": "int", "skew": "float"},
                             ("load_balancing_loss", "distinct_experts")),
}


def test_probe_check_passes_the_fixture_with_fake_probes() -> None:
    _, lessons = all_lessons(FIXTURE)
    assert [problem for lesson in lessons for problem in lint.check_probes(lesson, FAKE_PROBES)] == []


def test_probe_check_catches_unknown_probe_param_and_metric() -> None:
    lesson = load_curriculum(FIXTURE).lesson("precision/weights-in-memory")
    only_tflops = {"matmul": FakeProbe("matmul", {"dtypes": "list"}, ("tflops_<dtype>",))}
    problems = lint.check_probes(lesson, only_tflops)
    assert any("takes no param 'budget_s'" in problem for problem in problems)
    assert any("reports no metric 'speedup_bf16_over_fp32'" in problem for problem in problems)
    routing = load_curriculum(FIXTURE).lesson("experts/routing")
    assert lint.check_probes(routing, only_tflops) == [
        f"{FIXTURE.name}/experts/routing/lesson.md:5: measure route: no lab 'moe-routing' (labs: matmul)"]


def test_probe_check_prefers_metrics_for() -> None:
    @dataclass(frozen=True)
    class ExactProbe:
        params_schema: dict

        def metrics_for(self, params: dict) -> tuple[str, ...]:
            return tuple(f"tflops_{dtype}" for dtype in params["dtypes"])

    lesson = load_curriculum(FIXTURE).lesson("precision/weights-in-memory")
    problems = lint.check_probes(lesson, {"matmul": ExactProbe({"dtypes": "", "budget_s": ""})})
    assert problems and "reports no metric 'speedup_bf16_over_fp32' (metrics: tflops_fp32, tflops_bf16)" in problems[0]


@pytest.mark.parametrize(("metric", "patterns", "expected"), [
    ("speedup_bf16_over_fp32", ("speedup_<a>_over_<b>",), True),
    ("tflops_fp8-e4m3", ("tflops_<dtype>",), True),
    ("tflops_", ("tflops_<dtype>",), False),
    ("gbps_triad", ("gbps_triad", "gbps_copy"), True),
    ("gbps_scale", ("gbps_triad", "gbps_copy"), False),
    ("max_rel_error_bf16", ("max_rel_error_<dtype>",), True),
])
def test_metric_patterns(metric: str, patterns: tuple[str, ...], expected: bool) -> None:
    assert lint.metric_matches(metric, patterns) is expected


def edit(root: Path, lesson_id: str, old: str, new: str) -> None:
    path = root / lesson_id / "lesson.md"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


@pytest.fixture
def broken(tmp_path: Path) -> Path:
    root = tmp_path / "lessons"
    shutil.copytree(FIXTURE, root)
    return root


def test_value_check_catches_a_device_only_expression(broken: Path) -> None:
    edit(broken, "precision/weights-in-memory", "{{ reference_gpu.name }} has", "{{ device.name }} has")
    lesson = load_curriculum(broken).lesson("precision/weights-in-memory")
    [problem] = lint.check_values(lesson)
    assert problem.startswith("lessons/precision/weights-in-memory/lesson.md:1: with no device: {{ device.name }}")


def test_value_check_covers_quiz_hints(broken: Path) -> None:
    edit(broken, "precision/bits-of-a-float", "{{ fmt('fp32').exponent_bits }}", "{{ fmt('fp33').exponent_bits }}")
    [problem] = lint.check_values(load_curriculum(broken).lesson("precision/bits-of-a-float"))
    assert ":23: with no device: {{ fmt('fp33').exponent_bits }}" in problem


def test_quiz_check_catches_a_tolerance_too_tight_for_the_shown_answer(broken: Path) -> None:
    edit(broken, "precision/bits-of-a-float", "tolerance = 0.02", "tolerance = 0.000001")
    problems = lint.check_quizzes(load_curriculum(broken).lesson("precision/bits-of-a-float"))
    assert problems == [("lessons/precision/bits-of-a-float/lesson.md:23: quiz bf16-max: its own answer "
                        "'3.39 × 10³⁸' is graded wrong (Not quite: that is too high.)")]


def test_quiz_check_catches_an_answer_expr_that_fails(broken: Path) -> None:
    edit(broken, "precision/weights-in-memory", "params('llama-3.1-8b').total, 'fp32'", "params('llama-9').total, 'fp32'")
    [problem] = lint.check_quizzes(load_curriculum(broken).lesson("precision/weights-in-memory"))
    assert "quiz bf16-weights-gb: with no device:" in problem and "unknown model preset 'llama-9'" in problem


def test_quiz_check_catches_a_text_answer_that_cannot_fail() -> None:
    from tutor.lessons import Quiz

    quiz = Quiz(id="q", question="?", kind="text", choices=(), answer=("x", "certainly not x"), answer_expr=None,
                tolerance=0.0, hints=(), explanation="")
    lesson = Lesson(info=load_curriculum(FIXTURE).info("experts/routing"), blocks=(quiz,))
    assert lint.check_quizzes(lesson) == [("experts/routing/lesson.md:1: quiz q: the wrong answer "
                                          "'certainly not x' is graded right")]


def test_calculator_check_runs_the_fit_estimate(broken: Path) -> None:
    edit(broken, "precision/weights-in-memory", 'seq = 2048', 'seq = 2048\ntp = 3')
    [problem] = lint.check_calculators(load_curriculum(broken).lesson("precision/weights-in-memory"))
    assert "calc calc-1" in problem and "tensor-parallel size 3 must divide the 32 attention heads" in problem


def test_unlisted_folder_is_found(broken: Path) -> None:
    extra = broken / "experts" / "capacity"
    extra.mkdir()
    (extra / "lesson.md").write_text("# Capacity\n")
    assert lint.unlisted_lesson_folders(load_curriculum(broken)) == [
        "lessons/experts/capacity/ is not listed in curriculum.toml"]


def test_hand_typed_figures_are_flagged_unless_allowed(broken: Path) -> None:
    edit(broken, "precision/bits-of-a-float", "its largest finite value is", "FP16 tops out at 65504 and its largest finite value is")
    lesson = load_curriculum(broken).lesson("precision/bits-of-a-float")
    [problem] = lint.check_hand_typed_numbers(lesson, lint.load_allowlist(broken))
    assert problem.startswith("lessons/precision/bits-of-a-float/lesson.md:4: '65504' looks hand-typed")
    (broken / "lint-allow.toml").write_text(
        '[[allow]]\ntoken = "65504"\nreason = "test"\nlessons = ["precision/bits-of-a-float"]\n')
    assert lint.check_hand_typed_numbers(lesson, lint.load_allowlist(broken)) == []
    (broken / "lint-allow.toml").write_text('[[allow]]\ntoken = "65504"\n')
    with pytest.raises(UserError, match="needs token"):
        lint.load_allowlist(broken)


@pytest.mark.parametrize(("text", "flagged"), [
    ("FP16 reaches 65504.", ["65504"]),
    ("It is -65,504 at the bottom.", ["65,504"]),
    ("Llama-3.1-8B and Llama-3.1-405B on an H100 or RTX 4090.", ["4090"]),
    ("70B at FP32/BF16/INT8/INT4 = 280/140/70/35 GB", []),
    ("In 2017, IEEE 754 and arXiv 2209.05433.", ["754"]),
    ("`x = 12345` and {{ 123456 }} and [a](http://x.org/98765)", []),
    ("```python\ny = 999999\n```\nthen 1.25", ["1.25"]),
    ("2^127 but 127 alone, 3.39e38, 0.00391, 1.5e-3 and 1,024", ["127", "3.39e38", "0.00391", "1,024"]),
    ("fp32, E4M3, GPT-2, gpt2-xl, v1.0, §3.4 and 100-200", []),
])
def test_hand_typed_number_heuristic(text: str, flagged: list[str]) -> None:
    assert [token for _, token in lint.hand_typed_numbers(text)] == flagged


@pytest.mark.parametrize(("token", "digits"), [("65504", 5), ("280", 2), ("0.0039", 2), ("3.39e38", 3),
                                               ("1.50", 3), ("1,024", 4), ("100", 1)])
def test_significant_digits(token: str, digits: int) -> None:
    assert lint.significant_digits(token) == digits


def test_probe_check_asks_the_probe_to_check_param_values() -> None:
    @dataclass(frozen=True)
    class StrictProbe:
        params_schema: dict
        metrics: tuple[str, ...] = ("speedup_<a>_over_<b>",)

        def check_params(self, params: dict) -> dict:
            if params.get("budget_s", 1) > 1:
                raise UserError(f"budget_s must be at most 1 second, got {params['budget_s']}")
            return params

    lesson = load_curriculum(FIXTURE).lesson("precision/weights-in-memory")
    problems = lint.check_probes(lesson, {"matmul": StrictProbe({"dtypes": "", "budget_s": ""})})
    assert problems == [
        (f"{FIXTURE.name}/precision/weights-in-memory/lesson.md:16: measure measure-1: budget_s must be at most 1 "
        "second, got 2"),
        (f"{FIXTURE.name}/precision/weights-in-memory/lesson.md:22: predict bf16-speedup: budget_s must be at most 1 "
        "second, got 2")]


def test_lint_curriculum_collects_every_problem(broken: Path) -> None:
    edit(broken, "experts/routing", 'answer = "0.25"', 'answer = "a quarter"')
    edit(broken, "precision/bits-of-a-float", "its largest finite value is", "65504 is FP16's; its largest is")
    problems = lint.lint_curriculum(broken, FAKE_PROBES, require_predict_and_measure=False)
    assert len(problems) == 2
    assert "'65504' looks hand-typed" in problems[0] and "answer 'a quarter' is not a number" in problems[1]
    assert lint.lint_curriculum(FIXTURE, FAKE_PROBES, require_predict_and_measure=False) == []


def test_lessons_check_command(monkeypatch: pytest.MonkeyPatch, broken: Path, capsys: pytest.CaptureFixture) -> None:
    from tutor.cli import main

    monkeypatch.setenv("TENSOR_TUTOR_LESSONS_DIR", str(broken))
    edit(broken, "experts/routing", 'answer = "0.25"', 'answer = "a quarter"')
    with pytest.raises(SystemExit) as exit_:
        main(["lessons", "--check"])
    assert exit_.value.code == 1
    captured = capsys.readouterr()
    assert "lesson.md:16: ```quiz block: answer 'a quarter' is not a number" in captured.out


# ---- no raw template code in any rendered text; predict + measure in every lesson ---------


def test_unclosed_template_in_quiz_text_fails_the_lint(broken: Path) -> None:
    edit(broken, "experts/routing", 'question = "What fraction of 8 experts does top-2 routing use?"',
         'question = "What fraction of {{ 8 } experts does top-2 routing use?"')
    problems = lint.lint_curriculum(broken, FAKE_PROBES, require_predict_and_measure=False)
    assert len(problems) == 1 and "left in rendered text" in problems[0] and "quiz active-fraction" in problems[0]


def test_template_in_quiz_text_is_rendered_not_flagged(broken: Path) -> None:
    edit(broken, "experts/routing", 'question = "What fraction of 8 experts does top-2 routing use?"',
         'question = "What fraction of {{ 4 * 2 }} experts does top-2 routing use?"')
    assert lint.lint_curriculum(broken, FAKE_PROBES, require_predict_and_measure=False) == []


def test_stray_closing_braces_in_feedback_fail_the_lint(broken: Path) -> None:
    edit(broken, "experts/routing", 'tolerance = 0\n```', 'tolerance = 0\nhints = ["count }} them"]\n```')
    problems = lint.lint_curriculum(broken, FAKE_PROBES, require_predict_and_measure=False)
    assert len(problems) == 1 and "left in rendered text" in problems[0]


def test_every_draw_combination_is_checked(broken: Path) -> None:
    edit(broken, "experts/routing", 'answer = "0.25"\ntolerance = 0',
         'answer_expr = "moe.experts_active_fraction(draw.k, 8)"\ndraw = { k = [2, 9] }')
    problems = lint.lint_curriculum(broken, FAKE_PROBES, require_predict_and_measure=False)
    assert problems and all("draw {'k': 9}" in problem for problem in problems), problems


def test_goal_already_met_by_its_starting_values_fails(broken: Path) -> None:
    curriculum, _ = all_lessons(broken)
    lesson = curriculum.lesson("experts/routing")
    from dataclasses import replace as replace_block

    from tutor.lessons.directives import parse_blocks

    calc = parse_blocks('```calc\nkind = "memory"\nmodel = "llama-3.1-8b"\nfields = ["dtype"]\n'
                        'goal = { device = "h100" }\n```\n')[0]
    problems = lint.check_calculators(replace_block(lesson, blocks=(calc,)))
    assert len(problems) == 1 and "already meet the goal" in problems[0]


def test_predict_and_measure_rule_flags_a_lesson_without_them(broken: Path) -> None:
    # The fixture's lessons hold neither block: the rule (on for the real curriculum) flags each of them.
    assert lint.lint_curriculum(broken, FAKE_PROBES, require_predict_and_measure=False) == []
    problems = lint.lint_curriculum(broken, FAKE_PROBES)
    missing_blocks = [problem for problem in problems if "no predict" in problem]
    assert missing_blocks and any("experts/routing" in problem for problem in missing_blocks)
    # The same full-curriculum rules ask every track for an exercise and every lesson for an
    # application choice quiz; the fixture has neither.
    assert all("has no ```exercise block" in problem or "no choice quiz asks for application" in problem
               for problem in problems if problem not in missing_blocks)