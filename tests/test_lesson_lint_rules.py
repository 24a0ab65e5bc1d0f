"""The lint rules: worked problems draw once per chain, no value renders as inf or nan,
and no number quiz's answer is printed in the prose above it; and the chain draw itself."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tutor.lessons import lint
from tutor.lessons.learner import personalise
from tutor.lessons.loader import load_curriculum

FIXTURE = Path(__file__).parent / "fixtures" / "lessons"
ROUTING = "experts/routing"

STEP_1 = '''
```quiz
id = "step-one"
question = "Step 1. How many bytes do {{ draw.n }} FP32 values take?"
kind = "number"
unit = "bytes"
draw = { n = [1000, 3000, 7000] }
CHAIN_ONE
answer_expr = "4 * draw.n"
```
'''
STEP_2 = '''
```quiz
id = "step-two"
question = "Step 2. And the same {{ draw.n }} values in BF16?"
kind = "number"
unit = "bytes"
draw = { n = LIST_TWO }
CHAIN_TWO
answer_expr = "2 * draw.n"
```
'''


def lesson_with(tmp_path: Path, extra: str):
    root = tmp_path / "lessons"
    shutil.copytree(FIXTURE, root)
    path = root / ROUTING / "lesson.md"
    path.write_text(path.read_text() + extra)
    return root, load_curriculum(root).lesson(ROUTING)


def steps(chain_one: str, chain_two: str, list_two: str = "[1000, 3000, 7000]") -> str:
    return (STEP_1.replace("CHAIN_ONE", chain_one)
            + STEP_2.replace("CHAIN_TWO", chain_two).replace("LIST_TWO", list_two))


def test_a_step_that_draws_alone_is_a_problem(tmp_path: Path) -> None:
    _, lesson = lesson_with(tmp_path, steps("", ""))
    problems = lint.check_chains(lesson)
    assert len(problems) == 2 and all("draws on its own" in problem for problem in problems)


def test_steps_of_one_chain_must_draw_from_the_same_list(tmp_path: Path) -> None:
    _, lesson = lesson_with(tmp_path, steps('chain = "bytes"', 'chain = "bytes"', "[1000, 3000]"))
    problems = lint.check_chains(lesson)
    assert len(problems) == 1 and "draws n from [1000, 3000, 7000] in an earlier step" in problems[0]
    _, lesson = lesson_with(tmp_path / "ok", steps('chain = "bytes"', 'chain = "bytes"'))
    assert lint.check_chains(lesson) == []


@pytest.mark.parametrize("learner", [f"learner-{i}" for i in range(40)])
def test_a_chain_gives_every_step_the_same_draw(tmp_path: Path, learner: str) -> None:
    _, lesson = lesson_with(tmp_path, steps('chain = "bytes"', 'chain = "bytes"'))
    one = personalise(lesson.block("step-one"), learner_id=learner, lesson_id=lesson.id)
    two = personalise(lesson.block("step-two"), learner_id=learner, lesson_id=lesson.id, round_=3)
    assert one.drawn == two.drawn


def test_chains_do_differ_between_learners(tmp_path: Path) -> None:
    _, lesson = lesson_with(tmp_path, steps('chain = "bytes"', 'chain = "bytes"'))
    seen = {personalise(lesson.block("step-one"), learner_id=f"l{i}", lesson_id=lesson.id).drawn["n"]
            for i in range(40)}
    assert seen == {1000, 3000, 7000}


def test_a_value_that_renders_as_inf_is_a_problem(tmp_path: Path) -> None:
    _, lesson = lesson_with(tmp_path, "\nFP64 reaches {{ float('1e308') * 10 }} here.\n")
    problems = lint.check_non_finite(lesson)
    assert len(problems) == 1 and "renders as inf" in problems[0]


def test_prose_that_names_inf_itself_is_fine(tmp_path: Path) -> None:
    _, lesson = lesson_with(tmp_path, "\nFP8 E4M3 has no inf, only NaN; FP64's largest is {{ num(fmt('fp64').max_finite) }}.\n")
    assert lint.check_non_finite(lesson) == []


def test_fp64_largest_finite_renders_as_a_number() -> None:
    from tutor.lessons.values import num
    from tutor.theory.formats import format_by_name

    assert num(format_by_name("fp64").max_finite) == "1.8 × 10³⁰⁸"


LEAK = '''
A worked example: three such buffers take {{ units.human_bytes(3 * 2**20 * 304) }}.

```quiz
id = "leaky"
question = "How many bytes do {{ draw.n }} MiB-sized buffers of 304 rows take?"
kind = "number"
unit = "bytes"
draw = { n = DRAWS }
answer_expr = "draw.n * 2**20 * 304"
tolerance = 0.01
```
'''


def test_an_answer_printed_above_its_quiz_is_a_problem(tmp_path: Path) -> None:
    _, lesson = lesson_with(tmp_path, LEAK.replace("DRAWS", "[2, 3, 5]"))
    problems = lint.check_leaked_answers(lesson)
    assert len(problems) == 1 and "printed above it ('912 MiB')" in problems[0] and "'n': 3" in problems[0]
    _, lesson = lesson_with(tmp_path / "ok", LEAK.replace("DRAWS", "[2, 5, 7]"))
    assert lint.check_leaked_answers(lesson) == []


def test_the_shipped_lessons_pass_the_new_rules() -> None:
    curriculum = load_curriculum(Path(__file__).parent.parent / "lessons")
    problems = []
    for lesson_id in curriculum.lesson_ids:
        lesson = curriculum.lesson(lesson_id)
        problems += lint.check_chains(lesson) + lint.check_non_finite(lesson) + lint.check_leaked_answers(lesson)
    assert problems == []


PROSE = "\nA router sends each token to the experts with the highest scores, and the busiest expert sets the step time.\n"
CHOICE = '''
```quiz
id = "pick"
question = "A new case: 64 experts, top-8, one expert gets a third of the tokens. What sets the step time?"
kind = "choice"
choices = ["RIGHT", "The average expert", "The router's softmax"]
answer = 0
feedback = ["", "The others wait for the busiest one.", "The softmax is a few FLOPs per token."]
```
'''


def choice_lesson(tmp_path: Path, right: str):
    return lesson_with(tmp_path, PROSE + CHOICE.replace("RIGHT", right))[1]


def test_shared_run_counts_consecutive_words_ignoring_case_and_punctuation() -> None:
    assert lint.shared_run("The KV-cache grows, linearly!", "so the kv cache grows linearly with context") == 5
    assert lint.shared_run("grows the cache", "the cache grows") == 2
    assert lint.shared_run("nothing alike", "entirely different words") == 0


def test_a_right_answer_copied_from_the_prose_is_recall(tmp_path: Path) -> None:
    lesson = choice_lesson(tmp_path, "Each token goes to the experts with the highest scores, and the busiest expert")
    [problem] = lint.check_recall_choices(lesson)
    assert "quiz pick" in problem and "repeats 11 consecutive words" in problem
    assert len(lint.check_application_choice(lesson)) == 1


def test_a_short_answer_copied_whole_is_recall(tmp_path: Path) -> None:
    lesson = choice_lesson(tmp_path, "The busiest expert")
    [problem] = lint.check_recall_choices(lesson)
    assert "repeats 3 consecutive words" in problem


def test_seven_shared_words_of_a_long_answer_are_not_recall(tmp_path: Path) -> None:
    lesson = choice_lesson(tmp_path, "With top-8 of 64, the experts with the highest scores, and one busy expert, "
                                     "it is the overloaded one")
    assert lint.shared_run("the experts with the highest scores and one", PROSE) == 7
    assert lint.check_recall_choices(lesson) == []
    assert lint.check_application_choice(lesson) == []


def test_an_applied_answer_passes_both_rules(tmp_path: Path) -> None:
    lesson = choice_lesson(tmp_path, "The expert holding a third of the tokens")
    assert lint.check_recall_choices(lesson) == []
    assert lint.check_application_choice(lesson) == []


def test_a_lesson_whose_only_choice_answers_are_one_word_has_no_application_quiz(tmp_path: Path) -> None:
    lesson = choice_lesson(tmp_path, "FP16")
    assert lint.check_recall_choices(lesson) == []
    [problem] = lint.check_application_choice(lesson)
    assert "no choice quiz asks for application" in problem


def test_the_shipped_lessons_ask_for_application() -> None:
    curriculum = load_curriculum(Path(__file__).parent.parent / "lessons")
    problems = []
    for lesson_id in curriculum.lesson_ids:
        lesson = curriculum.lesson(lesson_id)
        problems += lint.check_recall_choices(lesson) + lint.check_application_choice(lesson)
    assert problems == []
