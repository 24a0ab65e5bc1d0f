"""Can a learner copy a quiz's answer from the page above it? An audit over drawn learners.

For N random learner ids (the seed a progress file stores), every number quiz of every lesson is
drawn as that learner gets it (tutor.lessons.learner.personalise), its reference answer computed,
and compared with every figure of 3+ digits printed in the rendered prose above it, by the rule of
the lint (tutor.lessons.lint.printed_figures, the quiz's tolerance, units converted). The lint
checks every combination of a quiz's draws; this walks the path a learner takes, so the two can
be compared. Prints the quizzes audited, the learners, and every leak found (none is the goal).

    python benchmarks/quiz_leak_audit.py [--learners 400]
"""

from __future__ import annotations

import argparse
import secrets

from tutor.errors import UserError
from tutor.lessons.grading import expected_answer, quiz_unit
from tutor.lessons.learner import personalise, render_block
from tutor.lessons.lint import printed_figures
from tutor.lessons.loader import load_curriculum
from tutor.lessons.model import Prose, Quiz


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learners", type=int, default=400)
    args = parser.parse_args()
    curriculum = load_curriculum()
    learners = [secrets.token_hex(8) for _ in range(args.learners)]
    audited, leaks = 0, []
    for lesson_id in curriculum.lesson_ids:
        lesson = curriculum.lesson(lesson_id)
        above: list[str] = []
        for block in lesson.blocks:
            if isinstance(block, Prose):
                above.append(render_block(block).text)
                continue
            if not isinstance(block, Quiz) or block.kind != "number":
                continue
            unit = quiz_unit(block)
            figures = [figure for text in above for figure in printed_figures(text, unit)]
            for learner in learners:
                drawn = personalise(block, learner_id=learner, lesson_id=lesson_id)
                audited += 1
                try:
                    answer = float(expected_answer(drawn))
                except (UserError, TypeError, ValueError):
                    continue
                tolerance = max(block.tolerance, 0.005)
                hit = next((token for token, value in figures if answer and abs(value - answer) <= tolerance * abs(answer)),
                           None)
                if hit is not None:
                    leaks.append(f"{lesson_id} quiz {block.id} for learner {learner} (draw {drawn.drawn}): {hit!r}")
    print(f"{audited:,} quizzes drawn ({args.learners} learners x every number quiz of {len(curriculum.lesson_ids)} "
          f"lessons); answers printed above their quiz: {len(leaks)}")
    for leak in leaks[:20]:
        print("  " + leak)
    return 1 if leaks else 0


if __name__ == "__main__":
    raise SystemExit(main())
