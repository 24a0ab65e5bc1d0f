"""lesson.md -> blocks: split at fenced directives, parse each body as TOML, check every key.

A directive is a fenced code block (``` or ~~~, three or more, as CommonMark counts them) whose
info string is one of bits, calc, measure, predict, quiz, exercise. Any other fence (```python) is prose.
A mistake becomes one UserError line "<file>:<line>: ```<directive> block: <what is wrong>".
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable
from typing import Any

from tutor.errors import UserError
from tutor.lessons.calc_fields import CALC_FIELDS, CALC_KINDS, check_calc_value
from tutor.lessons.fences import RawBlock, split_markdown
from tutor.lessons.model import (
    DIRECTIVES,
    Bits,
    Block,
    Calc,
    Exercise,
    Goal,
    Measure,
    Predict,
    Prose,
    Quiz,
)
from tutor.safe_text import strings_without_controls
from tutor.files.storage import TooDeepError, loads_toml_bounded

_TOML_POSITION = re.compile(r"\(at line (\d+), column \d+\)")
_ID = re.compile(r"[a-z0-9][a-z0-9_.-]*")
_DRAW_NAME = re.compile(r"[a-z][a-z0-9_]*")
GOAL_KINDS = ("memory", "parallel", "kv-cache")
GOAL_KEYS = ("device", "devices_max", "devices_min", "tokens_per_step_max", "train_tokens", "days_max")
QUIZ_KINDS = ("number", "choice", "text")
DEFAULT_TOLERANCE = 0.02


class _Fields:
    """Takes typed keys out of one directive's TOML table; leftovers are unknown keys."""

    def __init__(self, data: dict[str, Any], raw: RawBlock, source: str) -> None:
        self.data = dict(data)
        self.raw = raw
        self.source = source

    def line_of(self, key: str | None) -> int:
        """The file line where `key = ` is written in the body, else the fence line."""
        if key is not None:
            pattern = re.compile(rf"^\s*(\"{re.escape(key)}\"|'{re.escape(key)}'|{re.escape(key)})\s*=")
            for offset, text in enumerate(self.raw.body.splitlines(), start=1):
                if pattern.match(text):
                    return self.raw.line + offset
        return self.raw.line

    def error(self, what: str, key: str | None = None) -> UserError:
        return UserError(f"{self.source}:{self.line_of(key)}: ```{self.raw.directive} block: {what}")

    def take(self, key: str, kind: str, *, required: bool = False, default: Any = None) -> Any:
        if key not in self.data:
            if required:
                raise self.error(f"missing required key {key!r}")
            return default
        value = self.data.pop(key)
        if not _is_kind(value, kind):
            raise self.error(f"{key} must be {_KIND_TEXT[kind]}, got {_shown(value)}", key)
        if kind in ("str_list", "choice_list"):
            return tuple(value)
        return value

    def finish(self, allowed: tuple[str, ...]) -> None:
        if self.data:
            key = min(self.data)
            raise self.error(f"unknown key {key!r} (allowed: {', '.join(allowed)})", key)


_KIND_TEXT = {
    "str": "text", "int": "a whole number", "number": "a number", "bool": "true or false",
    "str_list": "a list of text", "choice_list": "a list of text", "table": "a table such as { key = value }",
    "answer": "a number, text or a list of text", "scalar": "text or a number",
}


def _is_kind(value: Any, kind: str) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "bool":
        return isinstance(value, bool)
    if kind in ("str_list", "choice_list"):
        return isinstance(value, list) and all(isinstance(item, str) for item in value)
    if kind == "table":
        return isinstance(value, dict)
    if kind == "scalar":
        return isinstance(value, str) or _is_kind(value, "number")
    if kind == "answer":
        return _is_kind(value, "scalar") or _is_kind(value, "str_list")
    raise AssertionError(kind)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---- one parser per directive ---------------------------------------------------------------------


def _optional_id(fields: _Fields) -> str | None:
    block_id = fields.take("id", "str")
    if block_id is not None and not _ID.fullmatch(block_id):
        raise fields.error(f"id {block_id!r} must be lowercase letters, digits, '-', '_' or '.'", "id")
    return block_id


def _parse_bits(fields: _Fields, block_id: str) -> Bits:
    from tutor.theory.formats import FORMATS, encode

    value = fields.take("value", "scalar", required=True)
    formats = fields.take("formats", "str_list")
    fields.finish(("value", "formats", "id"))
    text = value if isinstance(value, str) else repr(value)
    try:
        encode(text, "fp32")
    except UserError as error:
        raise fields.error(str(error), "value") from None
    if formats is None:
        formats = tuple(name for name, fmt in FORMATS.items() if fmt.family == "float")
    unknown = [name for name in formats if name not in FORMATS]
    if unknown or not formats:
        raise fields.error(f"unknown format {', '.join(unknown) or '(none given)'}: use {', '.join(FORMATS)}", "formats")
    return Bits(value=text, formats=tuple(formats), line=fields.raw.line, id=block_id)


def _parse_draw(fields: _Fields) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """draw = { name = [value, ...], ... }: the values one of which is drawn per learner."""
    table = fields.take("draw", "table", default={})
    draws = []
    for name, values in table.items():
        if not _DRAW_NAME.fullmatch(name):
            raise fields.error(f"draw name {name!r} must be lowercase letters, digits and '_', starting with a "
                               "letter", "draw")
        if not isinstance(values, list) or not values or not all(_is_kind(v, "scalar") or isinstance(v, bool)
                                                               for v in values):
            raise fields.error(f"draw.{name} must be a non-empty list of numbers or texts, got {_shown(values)}",
                               "draw")
        if len(set(map(repr, values))) != len(values):
            raise fields.error(f"draw.{name} lists a value twice", "draw")
        draws.append((name, tuple(values)))
    return tuple(draws)


def _parse_goal(fields: _Fields, kind: str) -> Goal | None:
    table = fields.take("goal", "table")
    if table is None:
        return None
    if kind not in GOAL_KINDS:
        raise fields.error(f"a goal needs a {', '.join(GOAL_KINDS)} calculator, not {kind!r}", "goal")
    unknown = sorted(set(table) - set(GOAL_KEYS))
    if unknown:
        raise fields.error(f"goal has no key {unknown[0]!r} (keys: {', '.join(GOAL_KEYS)})", "goal")
    device = table.get("device")
    if not isinstance(device, str) or not device.strip():
        raise fields.error("goal needs device = a card such as \"h100\" or a size such as \"80GiB\"", "goal")
    from tutor.hardware.memory_budget import given_budget

    try:
        given_budget(device.strip())
    except UserError as error:
        raise fields.error(f"goal device: {error}", "goal") from None
    counts = {}
    for key in ("devices_max", "devices_min"):
        value = table.get(key)
        if value is not None and (not _is_kind(value, "int") or value < 1):
            raise fields.error(f"goal {key} must be a whole number from 1, got {_shown(value)}", "goal")
        counts[key] = value
    if counts["devices_max"] and counts["devices_min"] and counts["devices_min"] > counts["devices_max"]:
        raise fields.error("goal devices_min is above devices_max", "goal")
    batch_max = table.get("tokens_per_step_max")
    if batch_max is not None and (not _is_kind(batch_max, "int") or batch_max < 1):
        raise fields.error(f"goal tokens_per_step_max must be a whole number from 1, got {_shown(batch_max)}", "goal")
    train_tokens, days_max = table.get("train_tokens"), table.get("days_max")
    if (train_tokens is None) != (days_max is None):
        raise fields.error("goal train_tokens and days_max go together: the run's tokens and the days it may take",
                           "goal")
    tokens = None
    if train_tokens is not None:
        from tutor.theory.units import parse_count

        try:
            tokens = parse_count(str(train_tokens))
        except UserError as error:
            raise fields.error(f"goal train_tokens: {error}", "goal") from None
        if not _is_kind(days_max, "number") or not days_max > 0:
            raise fields.error(f"goal days_max must be a number above 0, got {_shown(days_max)}", "goal")
    return Goal(device=device.strip(), **counts, tokens_per_step_max=batch_max, train_tokens=tokens,
                days_max=None if days_max is None else float(days_max))


def _parse_calc(fields: _Fields, block_id: str) -> Calc:
    kind = fields.take("kind", "str", required=True)
    if kind not in CALC_KINDS:
        raise fields.error(f"kind must be one of {', '.join(CALC_KINDS)}, got {kind!r}", "kind")
    shown = fields.take("fields", "str_list")
    model = fields.take("model", "str")
    goal = _parse_goal(fields, kind)
    goal_hints = fields.take("goal_hints", "str_list", default=())
    goal_text = fields.take("goal_text", "str", default="")
    if goal is None and (goal_hints or goal_text):
        raise fields.error("goal_hints and goal_text belong to a calculator with a goal", 
                           "goal_hints" if goal_hints else "goal_text")
    values: dict[str, Any] = {}
    if model is not None:
        try:
            model = check_calc_value(kind, "model", model)
        except UserError as error:
            raise fields.error(str(error), "model") from None
        values["model"] = model
    for key in list(fields.data):
        if key not in CALC_FIELDS:
            allowed = ", ".join(("kind", "fields", "id", "goal", "goal_hints", "goal_text") + CALC_KINDS[kind])
            raise fields.error(f"unknown key {key!r} (allowed: {allowed})", key)
        value = fields.data.pop(key)
        try:
            values[key] = check_calc_value(kind, key, value)
        except UserError as error:
            raise fields.error(str(error), key) from None
    if shown is None:
        shown = tuple(values) or CALC_KINDS[kind]
    bad = [name for name in shown if name not in CALC_KINDS[kind]]
    if bad or not shown:
        raise fields.error(f"a {kind} calculator cannot show {', '.join(bad) or 'no fields'} "
                           f"(fields: {', '.join(CALC_KINDS[kind])})", "fields")
    if len(set(shown)) != len(shown):
        raise fields.error("fields lists a field twice", "fields")
    return Calc(kind=kind, model=model, fields=tuple(shown), values=values, line=fields.raw.line, id=block_id,
                goal=goal, goal_hints=tuple(goal_hints), goal_text=goal_text)


def _parse_measure(fields: _Fields, block_id: str) -> Measure:
    probe = fields.take("probe", "str", required=True)
    params = fields.take("params", "table", default={})
    explain = fields.take("explain", "str", default="")
    fields.finish(("probe", "params", "explain", "id"))
    return Measure(probe=probe, params=params, explain=explain, line=fields.raw.line, id=block_id)


def _parse_predict(fields: _Fields, block_id: str) -> Predict:
    question = fields.take("question", "str", required=True)
    probe = fields.take("probe", "str", required=True)
    params = fields.take("params", "table", default={})
    metric = fields.take("metric", "str", required=True)
    unit = fields.take("unit", "str", default="")
    explain = fields.take("explain", "str", default="")
    guess_unit = fields.take("guess_unit", "str", default="")
    draw = _parse_draw(fields)
    fields.finish(("id", "question", "probe", "params", "metric", "unit", "explain", "draw", "guess_unit"))
    if guess_unit:
        from tutor.lessons.grading import unit_kind

        kind = unit_kind(guess_unit)[0]
        if kind is None or kind != unit_kind(unit)[0]:
            raise fields.error(f"guess_unit {guess_unit!r} must be a unit of the same kind as unit {unit!r} "
                               "(both times, sizes or counts) so a guess converts", "guess_unit")
    return Predict(id=block_id, question=question, probe=probe, params=params, metric=metric, unit=unit,
                   line=fields.raw.line, explain=explain, draw=draw, guess_unit=guess_unit)


EXERCISE_LANGUAGES = ("text", "python")


def _parse_exercise(fields: _Fields, block_id: str) -> Exercise:
    task = fields.take("task", "str", required=True)
    check = fields.take("check", "str", required=True)
    start = fields.take("start", "str", required=True)
    solution = fields.take("solution", "str", required=True)
    hints = fields.take("hints", "str_list", default=())
    explanation = fields.take("explanation", "str", default="")
    language = fields.take("language", "str", default="text")
    fields.finish(("id", "task", "check", "start", "solution", "hints", "explanation", "language"))
    from tutor.labs.exercise_checks import CHECKS

    if check not in CHECKS:
        raise fields.error(f"no exercise check {check!r} (checks: {', '.join(CHECKS)})", "check")
    if language not in EXERCISE_LANGUAGES:
        raise fields.error(f"language must be one of {', '.join(EXERCISE_LANGUAGES)}, got {language!r}", "language")
    return Exercise(id=block_id, task=task, check=check, start=start, solution=solution, hints=tuple(hints),
                    explanation=explanation, language=language, line=fields.raw.line)


def _parse_quiz(fields: _Fields, block_id: str) -> Quiz:
    question = fields.take("question", "str", required=True)
    kind = fields.take("kind", "str", required=True)
    if kind not in QUIZ_KINDS:
        raise fields.error(f"kind must be one of {', '.join(QUIZ_KINDS)}, got {kind!r}", "kind")
    choices = fields.take("choices", "choice_list", default=())
    answer = fields.take("answer", "answer")
    answer_expr = fields.take("answer_expr", "str")
    tolerance = fields.take("tolerance", "number")
    hints = fields.take("hints", "str_list", default=())
    explanation = fields.take("explanation", "str", default="")
    unit = fields.take("unit", "str", default="")
    feedback = fields.take("feedback", "str_list", default=())
    shuffle = fields.take("shuffle", "bool", default=True)
    draw = _parse_draw(fields)
    chain = fields.take("chain", "str", default="")
    fields.finish(("id", "question", "kind", "choices", "answer", "answer_expr", "tolerance", "hints",
                   "explanation", "unit", "feedback", "shuffle", "draw", "chain"))
    if chain and not draw:
        raise fields.error("chain links the draws of a worked problem's steps: this quiz draws nothing", "chain")
    if kind != "choice" and feedback:
        raise fields.error(f"feedback belongs to kind = \"choice\" (one text per choice), not {kind!r}", "feedback")
    if kind == "choice" and feedback and len(feedback) != len(choices):
        raise fields.error(f"feedback needs one text per choice ({len(choices)}), got {len(feedback)}", "feedback")
    if (answer is None) == (answer_expr is None):
        raise fields.error("give exactly one of answer and answer_expr", "answer" if answer is not None else None)
    if kind == "choice":
        if len(choices) < 2:
            raise fields.error("a choice quiz needs at least two choices", "choices")
        if len(set(choices)) != len(choices):
            raise fields.error("two choices are the same text", "choices")
        if answer_expr is not None or not _is_kind(answer, "int"):
            raise fields.error("a choice quiz needs answer = the 0-based index of the right choice", "answer")
        if not 0 <= answer < len(choices):
            raise fields.error(f"answer {answer} is not a choice index (0..{len(choices) - 1})", "answer")
    elif choices:
        raise fields.error(f"choices belong to kind = \"choice\", not {kind!r}", "choices")
    if kind == "number":
        if answer is not None:
            from tutor.lessons.grading import parse_number

            if isinstance(answer, list) or (isinstance(answer, str) and parse_number(answer) is None):
                raise fields.error(f"answer {_shown(answer)} is not a number", "answer")
        tolerance = DEFAULT_TOLERANCE if tolerance is None else float(tolerance)
        if not 0 <= tolerance < 1:
            raise fields.error(f"tolerance is relative: a number from 0 to below 1, got {tolerance!r}", "tolerance")
    elif tolerance is not None:
        raise fields.error(f"tolerance belongs to kind = \"number\", not {kind!r}", "tolerance")
    else:
        tolerance = 0.0
    if kind == "text" and answer is not None:
        if not isinstance(answer, (str, list)) or not answer or (isinstance(answer, list) and not all(answer)):
            raise fields.error("a text quiz needs answer = \"text\" or a list of accepted texts", "answer")
        answer = tuple(answer) if isinstance(answer, list) else answer
    return Quiz(id=block_id, question=question, kind=kind, choices=tuple(choices), answer=answer,
                answer_expr=answer_expr, tolerance=tolerance, hints=tuple(hints), explanation=explanation,
                line=fields.raw.line, unit=unit, feedback=tuple(feedback), shuffle=shuffle, draw=draw,
                chain=chain)


_PARSERS: dict[str, Callable[[_Fields, str], Block]] = {
    "bits": _parse_bits, "calc": _parse_calc, "measure": _parse_measure, "predict": _parse_predict,
    "quiz": _parse_quiz, "exercise": _parse_exercise,
}


def _load_toml(raw: RawBlock, source: str) -> dict[str, Any]:
    try:
        # Escaped controls ("\u001b" in a TOML string) are escaped again, like the page around them.
        return strings_without_controls(loads_toml_bounded(raw.body))
    except TooDeepError as error:
        raise UserError(f"{source}:{raw.line}: ```{raw.directive} block is not valid TOML: {error}") from None
    except tomllib.TOMLDecodeError as error:
        message = str(error)
        position = _TOML_POSITION.search(message)
        line = raw.line + int(position.group(1)) if position else raw.line
        reason = _TOML_POSITION.sub("", message).strip()
        raise UserError(f"{source}:{line}: ```{raw.directive} block is not valid TOML: {reason}") from None


def parse_blocks(text: str, source: str = "lesson.md") -> tuple[Block, ...]:
    """Every block of a lesson page, checked; ids are unique within the page.

    bits/calc/measure take an optional `id`; without one they are "<directive>-<n>" (n counts that
    directive from 1), prose blocks "prose-<n>"; quiz and predict must name theirs.
    """
    blocks: list[Block] = []
    counters: dict[str, int] = {}
    seen: dict[str, int] = {}
    for raw in split_markdown(text, source):
        counters[raw.directive] = counters.get(raw.directive, 0) + 1
        default_id = f"{raw.directive}-{counters[raw.directive]}"
        if raw.directive == "prose":
            block: Block = Prose(text=raw.body, line=raw.line, id=default_id)
        else:
            fields = _Fields(_load_toml(raw, source), raw, source)
            explicit = _optional_id(fields)
            if explicit is None and raw.directive in ("quiz", "predict", "exercise"):
                raise fields.error("missing required key 'id' (unique within the lesson)")
            block = _PARSERS[raw.directive](fields, explicit or default_id)
        if block.id in seen:
            raise UserError(f"{source}:{block.line}: id {block.id!r} is already used by the block on line "
                            f"{seen[block.id]}")
        seen[block.id] = block.line
        blocks.append(block)
    return tuple(blocks)
