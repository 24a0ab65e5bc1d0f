"""One learner's version of a block: numbers drawn, choices shuffled, every text rendered.

Both are deterministic per progress file: the seed is the random `learner_id` the progress file
stores (ProgressStore.learner_id), the lesson, the block and the round (how many times the learner
had the answer shown: a new round draws and shuffles again). The same learner sees the same quiz in
the app, in `tensor-tutor lessons show` and after a restart; another learner sees another one.

    quiz = personalise(lesson.block("kv-per-token"), learner_id=store.learner_id, lesson_id=lesson.id)
    shown = render_block(quiz, device=machine)       # question, choices, hints, ... with {{ }} computed
"""

from __future__ import annotations

import hashlib
import itertools
import random
from dataclasses import replace
from typing import Any, TypeVar

from tutor.errors import UserError
from tutor.lessons.model import Block, Calc, Exercise, Measure, Predict, Prose, Quiz
from tutor.hardware.machine import Machine
from tutor.lessons.values import VALUE_PATTERN, DeviceFigures, evaluate, render_values

LessonDevice = DeviceFigures | Machine | None  # the device a lesson's values are computed for

MAX_DRAW_COMBINATIONS = 64
"""The lint checks every combination of a block's draws up to this many, else a fixed sample."""


def learner_seed(learner_id: str, lesson_id: str, block_id: str, round_: int = 0) -> int:
    """A stable integer seed for one learner's block (hashlib, not hash(): the same across runs)."""
    text = f"{learner_id}\x1f{lesson_id}\x1f{block_id}\x1f{round_}"
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def draw_values(block: Quiz | Predict, seed: int) -> dict[str, Any]:
    """One value of each of the block's draws, picked independently with `seed`."""
    rng = random.Random(seed)
    return {name: rng.choice(values) for name, values in block.draw}


def chain_draw_values(quiz: Quiz, *, learner_id: str, lesson_id: str) -> dict[str, Any]:
    """The draws of one step of a worked problem: each name picked from its own seed (learner, lesson,
    chain, name), so every step that draws `g` from the same list sees the same `g`. A chain keeps its
    numbers when one step's answer was shown (round 0 always): a new round for one step alone would
    break the chain for the steps after it."""
    drawn = {}
    for name, values in quiz.draw:
        seed = learner_seed(learner_id, lesson_id, f"chain:{quiz.chain}:{name}")
        drawn[name] = random.Random(seed).choice(values)
    return drawn


def drawn_values(block: Block) -> dict[str, Any]:
    """The values the block's expressions see: those drawn for the learner, else each draw's first
    (only quiz and predict blocks draw)."""
    if not isinstance(block, (Quiz, Predict)):
        return {}
    if block.drawn is not None:
        return dict(block.drawn)
    return {name: values[0] for name, values in block.draw}


def draw_combinations(block: Block, limit: int = MAX_DRAW_COMBINATIONS) -> list[dict[str, Any]]:
    """Every combination of the block's draws (the lint checks each), or `limit` of them, sampled
    with a fixed seed, when there are more. A block without draws has one: {}."""
    draws = block.draw if isinstance(block, (Quiz, Predict)) else ()
    names = [name for name, _ in draws]
    total = 1
    for _, values in draws:
        total *= len(values)
    if total <= limit:
        return [dict(zip(names, combo)) for combo in itertools.product(*(values for _, values in draws))]
    rng = random.Random(0)
    return [{name: rng.choice(values) for name, values in draws} for _ in range(limit)]


def choice_order(count: int, seed: int) -> list[int]:
    """A permutation of range(count): position i shows the written choice order[i]."""
    order = list(range(count))
    random.Random(seed).shuffle(order)
    return order


QuizT = TypeVar("QuizT", bound=Quiz)


def shuffle_choices(quiz: QuizT, seed: int) -> QuizT:
    """The quiz with its choices (and their feedback) in a learner's order, `answer` following them."""
    # a choice quiz's answer is its index (checked by the loader)
    if quiz.kind != "choice" or not quiz.shuffle or len(quiz.choices) < 2 or not isinstance(quiz.answer, int):
        return quiz
    order = choice_order(len(quiz.choices), seed)
    feedback = tuple(quiz.feedback[i] for i in order) if quiz.feedback else ()
    return replace(quiz, choices=tuple(quiz.choices[i] for i in order), answer=order.index(quiz.answer),
                   feedback=feedback)


BlockT = TypeVar("BlockT", bound=Block)
"""A block's own type, kept: personalising or rendering a Quiz gives a Quiz."""


def personalise(block: BlockT, *, learner_id: str, lesson_id: str, round_: int = 0) -> BlockT:
    """The block as this learner sees it: draws picked, choices shuffled (quiz and predict only)."""
    if not isinstance(block, (Quiz, Predict)):
        return block
    seed = learner_seed(learner_id, lesson_id, block.id, round_)
    if isinstance(block, Quiz):
        drawn = (chain_draw_values(block, learner_id=learner_id, lesson_id=lesson_id) if block.chain
                 else draw_values(block, seed))
        return shuffle_choices(replace(block, drawn=drawn), seed)
    return replace(block, drawn=draw_values(block, seed))


def _render(text: str, device: LessonDevice, draw: dict[str, Any]) -> str:
    return render_values(text, device=device, draw=draw) if "{{" in text else text


def resolve_params(params: dict[str, Any], *, device: LessonDevice = None, draw: dict[str, Any] | None = None) -> dict[str, Any]:
    """A probe's params with each value written as the string "{{ expr }}" replaced by the expression's
    value, typed (so `seq = "{{ draw.seq }}"` gives the int drawn)."""
    resolved = {}
    for name, value in params.items():
        whole = VALUE_PATTERN.fullmatch(value.strip()) if isinstance(value, str) else None
        resolved[name] = evaluate(whole.group(1), device=device, draw=draw) if whole else value
    return resolved


def render_block(block: BlockT, *, device: LessonDevice = None) -> BlockT:
    """The block with `{{ }}` computed in every learner-facing text (and predict params); UserError
    naming the expression when one fails. Works on a personalised block (its draws) or a raw one
    (each draw's first value)."""
    draw = drawn_values(block)
    if isinstance(block, Prose):
        return replace(block, text=_render(block.text, device, draw))
    if isinstance(block, Quiz):
        return replace(block, question=_render(block.question, device, draw),
                       choices=tuple(_render(text, device, draw) for text in block.choices),
                       hints=tuple(_render(text, device, draw) for text in block.hints),
                       feedback=tuple(_render(text, device, draw) for text in block.feedback),
                       explanation=_render(block.explanation, device, draw))
    if isinstance(block, Predict):
        return replace(block, question=_render(block.question, device, draw),
                       explain=_render(block.explain, device, draw),
                       params=resolve_params(block.params, device=device, draw=draw))
    if isinstance(block, Measure):
        return replace(block, explain=_render(block.explain, device, draw))
    if isinstance(block, Exercise):
        return replace(block, task=_render(block.task, device, draw),
                       hints=tuple(_render(text, device, draw) for text in block.hints),
                       explanation=_render(block.explanation, device, draw))
    if isinstance(block, Calc) and block.goal is not None:
        from tutor.lessons.goals import goal_text

        return replace(block, goal_text=_render(block.goal_text or goal_text(block), device, draw),
                       goal_hints=tuple(_render(text, device, draw) for text in block.goal_hints))
    return block


def learner_view(block: BlockT, *, learner_id: str, lesson_id: str, device: LessonDevice = None,
                 round_: int = 0) -> BlockT:
    """personalise() then render_block(): what the app shows this learner."""
    return render_block(personalise(block, learner_id=learner_id, lesson_id=lesson_id, round_=round_), device=device)


def safe_learner_view(block: BlockT, *, learner_id: str = "", lesson_id: str = "", device: LessonDevice = None,
                      round_: int = 0) -> tuple[BlockT, str | None]:
    """learner_view(), or the unrendered personalised block and the error when a value fails
    (the app shows the error in place: a content bug must never crash a lesson)."""
    try:
        return learner_view(block, learner_id=learner_id, lesson_id=lesson_id, device=device, round_=round_), None
    except UserError as error:
        return personalise(block, learner_id=learner_id, lesson_id=lesson_id, round_=round_), str(error)
