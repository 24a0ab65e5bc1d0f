"""The content lint (rustlings' `dev check`): what tests/test_lesson_lint.py asserts for every lesson.

Each check returns a list of one-line problems, "<file>:<line>: <what is wrong>", empty when fine,
so the test can show them all at once and a future `tensor-tutor lessons --check` can print them.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tutor.errors import UserError
from tutor.lessons.grading import expected_answer, format_expected, grade
from tutor.lessons.learner import draw_combinations, drawn_values, render_block, resolve_params
from tutor.lessons.loader import CURRICULUM_FILE, LESSON_MD, LESSON_TOML, Curriculum
from tutor.lessons.learner import BlockT
from tutor.lessons.model import Block, Calc, Exercise, Lesson, Measure, Predict, Prose, Quiz
from tutor.lessons.values import DeviceFigures
from tutor.files.storage import TooDeepError, loads_toml_bounded

ALLOWLIST_FILE = "lint-allow.toml"

# A fake GPU and a fake CPU: every expression must render on both and with no device at all.
FAKE_GPU = DeviceFigures(name="Lint GPU 24GB", kind="cuda", memory_bytes=24 * 10**9, bandwidth_gbps=1000.0,
                         tflops={"fp32": 80.0, "tf32": 80.0, "bf16": 160.0, "fp16": 160.0, "fp8": None,
                                 "int8": 320.0}, source="lint fake")
FAKE_CPU = DeviceFigures(name="Lint CPU", kind="cpu", memory_bytes=16 * 2**30, bandwidth_gbps=None,
                         tflops={"fp32": 0.5, "tf32": None, "bf16": 0.25, "fp16": None, "fp8": None,
                                 "int8": None}, source="lint fake")
LINT_DEVICES: tuple[DeviceFigures | None, ...] = (None, FAKE_CPU, FAKE_GPU)


def _where(lesson: Lesson, line: int) -> str:
    source = lesson.path.as_posix() if lesson.path is not None else f"{lesson.id}/{LESSON_MD}"
    if lesson.path is not None and lesson.path.parent.parent.parent.name:
        source = f"{lesson.path.parent.parent.parent.name}/{lesson.id}/{LESSON_MD}"
    return f"{source}:{line}"


def _device_name(device: DeviceFigures | None) -> str:
    return "no device" if device is None else device.name


class LintedProbe(Protocol):
    """What the probe check needs of a probe (tutor.labs.Probe has all of it): the params it takes;
    optionally check_params (ChecksParams) and its metrics, exact (ReportsMetricsFor) or as patterns
    (DocumentsMetrics)."""

    @property
    def params_schema(self) -> Mapping[str, str]: ...


@runtime_checkable
class ChecksParams(Protocol):
    def check_params(self, params: dict) -> dict: ...


@runtime_checkable
class ReportsMetricsFor(Protocol):
    def metrics_for(self, params: dict) -> tuple[str, ...]: ...


@runtime_checkable
class DocumentsMetrics(Protocol):
    @property
    def metrics(self) -> tuple[str, ...]: ...


def _texts(block: Block) -> list[str]:
    """Every learner-facing text of a block, where {{ }} values may appear."""
    if isinstance(block, Prose):
        return [block.text]
    if isinstance(block, Quiz):
        return [block.question, block.explanation, *block.hints, *block.choices, *block.feedback]
    if isinstance(block, Predict):
        return [block.question, block.explain]
    if isinstance(block, Measure):
        return [block.explain]
    if isinstance(block, Calc):
        return [block.goal_text, *block.goal_hints]
    if isinstance(block, Exercise):
        return [block.task, block.explanation, *block.hints]
    return []


def _variants(block: BlockT) -> list[BlockT]:
    """The block once per combination of its draws (the block itself when it draws nothing)."""
    if not isinstance(block, (Quiz, Predict)) or not block.draw:
        return [block]
    return [replace(block, drawn=combo) for combo in draw_combinations(block)]


def _draw_name(block: Block) -> str:
    drawn = block.drawn if isinstance(block, (Quiz, Predict)) else None
    return f" and draw {drawn}" if drawn else ""


def check_values(lesson: Lesson, devices: Iterable[DeviceFigures | None] = LINT_DEVICES) -> list[str]:
    """Every {{ }} value in every text of every block renders with each device (and with none) and
    each combination of the block's draws, and no rendered text still holds `{{` or `}}`."""
    problems = []
    devices = tuple(devices)
    for block in lesson.blocks:
        for variant in _variants(block):
            failed = False
            for device in devices:
                try:
                    rendered = render_block(variant, device=device)
                except UserError as error:
                    problems.append(f"{_where(lesson, block.line)}: with {_device_name(device)}{_draw_name(variant)}: "
                                    f"{error}")
                    failed = True
                    break
                left = [text for text in _texts(rendered) if "{{" in text or "}}" in text]
                if left:
                    shown = left[0] if len(left[0]) <= 70 else left[0][:67] + "..."
                    problems.append(f"{_where(lesson, block.line)}: {block.directive} {block.id}: "
                                    f"'{{{{' or '}}}}' left in rendered text: {shown!r}")
                    failed = True
                    break
            if failed:
                break
    return list(dict.fromkeys(problems))


def wrong_answer(quiz: Quiz, expected: str | float) -> str:
    """An answer that must fail: far outside any tolerance, another choice, other text."""
    if quiz.kind == "number":
        return repr(float(expected) + (abs(float(expected)) + 1.0) * 2.0)
    if quiz.kind == "choice":
        return str((int(expected) + 1) % len(quiz.choices))
    return f"certainly not {expected}"


def check_quizzes(lesson: Lesson, devices: Iterable[DeviceFigures | None] = LINT_DEVICES) -> list[str]:
    """Each quiz's reference answer (as computed and as displayed) passes its grader and a wrong one
    fails, for every device and every combination of its draws."""
    problems = []
    quizzes = [variant for quiz in lesson.quizzes for variant in _variants(quiz)]
    for quiz in quizzes:
        where = f"{_where(lesson, quiz.line)}: quiz {quiz.id}{_draw_name(quiz)}"
        for device in tuple(devices):
            try:
                expected = expected_answer(quiz, device=device)
                for typed in (str(expected), format_expected(quiz, expected)):
                    verdict = grade(quiz, typed, device=device)
                    if not verdict.correct:
                        problems.append(f"{where}: its own answer {typed!r} is graded wrong ({verdict.message})")
                wrong = wrong_answer(quiz, expected)
                if grade(quiz, wrong, device=device).correct:
                    problems.append(f"{where}: the wrong answer {wrong!r} is graded right")
            except UserError as error:
                problems.append(f"{where}: with {_device_name(device)}: {error}")
                break
    return list(dict.fromkeys(problems))  # the same verdict on every device is said once


def check_calculators(lesson: Lesson) -> list[str]:
    """Each memory/parallel/kv-cache calculator's starting values give a fit estimate."""
    from tutor.lessons.calc_fields import fit_request
    from tutor.lessons.values import preset
    from tutor.theory.fit import estimate, estimate_from_count, validate_request

    problems = []
    for block in lesson.blocks:
        if not isinstance(block, Calc) or block.kind not in ("memory", "parallel", "kv-cache"):
            continue
        try:
            request = fit_request(block.values)
            if block.model is not None:
                arch = preset(block.model)
                validate_request(arch, request)
                estimate(arch, request)
            elif "params" in block.values:
                from tutor.lessons.calc_fields import CALC_FIELDS

                estimate_from_count(CALC_FIELDS["params"].check(block.values["params"]), request)
            else:
                problems.append(f"{_where(lesson, block.line)}: calc {block.id}: give a model or params to start from")
        except UserError as error:
            problems.append(f"{_where(lesson, block.line)}: calc {block.id}: {error}")
            continue
        problems += check_goal_start(lesson, block)
    return problems


def check_goal_start(lesson: Lesson, calc: Calc) -> list[str]:
    """A calculator exercise must not start solved: its starting values miss the goal."""
    if calc.goal is None:
        return []
    from tutor.lessons.goals import check_goal

    where = f"{_where(lesson, calc.line)}: calc {calc.id}"
    try:
        start = check_goal(calc, dict(calc.values))
    except UserError as error:
        return [f"{where}: goal: {error}"]
    if start.met:
        return [f"{where}: its starting values already meet the goal ({start.message}): start from a layout "
                "that does not"]
    return []


def check_predict_and_measure(lesson: Lesson) -> list[str]:
    """A lesson has at least one ```predict and one ```measure block (predict, measure,
    explain in every lesson)."""
    kinds = {block.directive for block in lesson.blocks}
    missing = [kind for kind in ("predict", "measure") if kind not in kinds]
    if not missing:
        return []
    return [f"{_where(lesson, 1)}: no {' and no '.join(missing)} block: every lesson has a prediction the learner "
            "commits, then a measurement on this machine"]


def metric_matches(metric: str, documented: Iterable[str]) -> bool:
    """Whether `metric` is one a probe documents; "<name>" in a documented metric stands for a word
    such as a dtype ("speedup_<a>_over_<b>" matches "speedup_bf16_over_fp32")."""
    for pattern in documented:
        regex = re.sub(r"<[^<>]+>", "[a-z0-9][a-z0-9.-]*", re.escape(pattern).replace(r"\<", "<").replace(r"\>", ">"))
        if re.fullmatch(regex, metric):
            return True
    return False


def check_probes(lesson: Lesson, probes: Mapping[str, LintedProbe]) -> list[str]:
    """Each measure/predict names a probe, passes only params it accepts (and values its
    `check_params(params)` accepts, when it has one), and predicts a metric it reports.

    A probe documents its metrics as `metrics: tuple[str, ...]` (patterns with <placeholders>);
    a probe with `metrics_for(params)` is asked for the exact names instead.
    """
    problems = []
    for written in lesson.blocks:
        if not isinstance(written, (Measure, Predict)):
            continue
        block = written
        if isinstance(written, Predict):
            try:
                block = replace(written, params=resolve_params(written.params, draw=drawn_values(written)))
            except UserError as error:
                problems.append(f"{_where(lesson, written.line)}: predict {written.id}: params: {error}")
                continue
        where = f"{_where(lesson, block.line)}: {block.directive} {block.id}"
        probe = probes.get(block.probe)
        if probe is None:
            problems.append(f"{where}: no lab {block.probe!r} (labs: {', '.join(sorted(probes))})")
            continue
        schema = probe.params_schema or {}
        unknown = sorted(set(block.params) - set(schema))
        if unknown:
            problems.append(f"{where}: lab {block.probe} takes no param {unknown[0]!r} "
                            f"(params: {', '.join(schema) or 'none'})")
        elif isinstance(probe, ChecksParams):
            try:
                probe.check_params(dict(block.params))
            except UserError as error:
                problems.append(f"{where}: {error}")
        if isinstance(block, Predict):
            if isinstance(probe, ReportsMetricsFor):
                known = tuple(probe.metrics_for(dict(block.params)))
                ok = block.metric in known
            else:
                known = tuple(probe.metrics) if isinstance(probe, DocumentsMetrics) else ()
                ok = metric_matches(block.metric, known)
            if not ok:
                problems.append(f"{where}: lab {block.probe} reports no metric {block.metric!r} "
                                f"(metrics: {', '.join(known) or 'none documented'})")
    return problems


def unlisted_lesson_folders(curriculum: Curriculum) -> list[str]:
    """Lesson folders (<root>/<track>/<lesson>/ holding a lesson.toml or lesson.md) not in curriculum.toml."""
    if curriculum.root is None:
        return []
    listed = set(curriculum.infos)
    found = []
    for marker in (LESSON_TOML, LESSON_MD):
        for path in curriculum.root.glob(f"*/*/{marker}"):
            lesson_id = path.parent.relative_to(curriculum.root).as_posix()
            if lesson_id not in listed and lesson_id not in found:
                found.append(lesson_id)
    return [f"{curriculum.root.name}/{lesson_id}/ is not listed in {CURRICULUM_FILE}" for lesson_id in sorted(found)]


# ---- hand-typed figures -------------------------------------------------------------------------

# A number standing alone: not part of a name (H100, Llama-3.1-8B, fp32, E4M3, GPT-2, §3.4, v1.0).
_NUMBER_TOKEN = re.compile(
    r"(?<![\w.§^$])(?<![A-Za-z0-9]-)"
    r"((?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][+-]?\d+)?)"
    r"(?![\w\-]*\d)(?![.,]\d)"
)
_VALUE_SPANS = re.compile(r"\{\{.*?\}\}", re.DOTALL)
_SKIPPED_SPANS = re.compile(
    r"`[^`\n]*`"                    # inline code
    r"|\]\([^)]*\)"                  # link targets
    r"|https?://\S+"                 # bare URLs
    r"|arXiv:?\s*\d{4}\.\d{4,5}"     # paper ids
    r"|<[^>\n]*>"                    # HTML tags / autolinks
)
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def significant_digits(token: str) -> int:
    """Significant digits of a typed number: 65504 -> 5, 280 -> 2, 0.0039 -> 2, 3.39e38 -> 3, 1.50 -> 3."""
    mantissa = re.split(r"[eE]", token.replace(",", ""))[0]
    if "." in mantissa:
        digits = mantissa.replace(".", "").lstrip("0")
        return len(digits)
    return len(mantissa.lstrip("0").rstrip("0"))


def _is_year(token: str) -> bool:
    return re.fullmatch(r"(19|20)\d\d", token) is not None


def hand_typed_numbers(text: str) -> list[tuple[int, str]]:
    """(line within text, token) for each number with 3+ significant digits typed into prose: the
    figures that should come from {{ }} instead. Years, names (H100, Llama-3.1-8B), code, links and
    arXiv ids are skipped; it is a heuristic, with an allowlist for deliberate exceptions."""
    found = []
    in_fence: str | None = None
    without_values = _VALUE_SPANS.sub(lambda match: " " + "\n" * match.group(0).count("\n"), text)
    for number, line in enumerate(without_values.splitlines(), start=1):
        fence = _FENCE.match(line)
        if fence:
            marker = fence.group(1)
            if in_fence is None:
                in_fence = marker
            elif marker[0] == in_fence[0] and len(marker) >= len(in_fence):
                in_fence = None
            continue
        if in_fence is not None:
            continue
        line = _SKIPPED_SPANS.sub(" ", line)
        for match in _NUMBER_TOKEN.finditer(line):
            token = match.group(1)
            if significant_digits(token) >= 3 and not _is_year(token):
                found.append((number, token))
    return found


@dataclass(frozen=True)
class AllowEntry:
    token: str
    reason: str
    lessons: tuple[str, ...]
    """Lesson ids it applies to; empty means every lesson."""


def load_allowlist(root: Path) -> tuple[AllowEntry, ...]:
    """<root>/lint-allow.toml: [[allow]] entries with token, reason and optional lessons = [ids]."""
    path = root / ALLOWLIST_FILE
    if not path.is_file():
        return ()
    try:
        data = loads_toml_bounded(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, TooDeepError) as error:
        raise UserError(f"{root.name}/{ALLOWLIST_FILE}: not valid TOML: {error}") from None
    entries = []
    for index, entry in enumerate(data.get("allow", []), start=1):
        token, reason, lessons = entry.get("token"), entry.get("reason"), entry.get("lessons", [])
        if not isinstance(token, str) or not isinstance(reason, str) or not reason.strip() or not (
                isinstance(lessons, list) and all(isinstance(item, str) for item in lessons)):
            raise UserError(f"{root.name}/{ALLOWLIST_FILE}: allow entry {index} needs token = \"...\", "
                            "reason = \"...\" and optionally lessons = [\"track/lesson\"]")
        entries.append(AllowEntry(token=token, reason=reason, lessons=tuple(lessons)))
    return tuple(entries)


def check_hand_typed_numbers(lesson: Lesson, allow: Iterable[AllowEntry] = ()) -> list[str]:
    """Numbers typed into the lesson's prose by hand that the allowlist does not excuse."""
    allowed = {entry.token for entry in allow if not entry.lessons or lesson.id in entry.lessons}
    problems = []
    for block in lesson.blocks:
        for text in _texts(block):
            for offset, token in hand_typed_numbers(text):
                if token not in allowed:
                    line = block.line + offset - 1 if isinstance(block, Prose) else block.line
                    problems.append(f"{_where(lesson, line)}: {token!r} looks hand-typed: compute it with "
                                    f"{{{{ }}}} or add it to {ALLOWLIST_FILE} with a reason")
    return problems


def lint_curriculum(root: Path, probes: Mapping[str, LintedProbe] | None = None, *,
                    require_predict_and_measure: bool = True) -> list[str]:
    """Every problem the checks above find in the curriculum at `root`, lesson by lesson (a lesson that
    does not parse is one problem, and the others are still checked). probes=None skips the probe check.
    Every lesson must hold a prediction the learner commits and a measurement on this machine;
    `require_predict_and_measure=False` lints a minimal curriculum (the tests' fixture) for the other rules."""
    from tutor.lessons.loader import load_curriculum

    try:
        curriculum = load_curriculum(root)
    except UserError as error:
        return [str(error)]
    problems = unlisted_lesson_folders(curriculum)
    try:
        allow = load_allowlist(root)
    except UserError as error:
        problems.append(str(error))
        allow = ()
    exercised: set[str] = set()
    for lesson_id in curriculum.lesson_ids:
        try:
            lesson = curriculum.lesson(lesson_id)
        except UserError as error:
            problems.append(str(error))
            continue
        if any(isinstance(block, Exercise) for block in lesson.blocks):
            exercised.add(lesson_id)
        problems += check_values(lesson) + check_quizzes(lesson) + check_calculators(lesson)
        problems += check_hand_typed_numbers(lesson, allow)
        problems += check_chains(lesson) + check_non_finite(lesson) + check_leaked_answers(lesson)
        problems += check_predict_units(lesson) + check_exercises(lesson) + check_recall_choices(lesson)
        if require_predict_and_measure:
            problems += check_predict_and_measure(lesson) + check_application_choice(lesson)
        if probes is not None:
            problems += check_probes(lesson, probes)
    if require_predict_and_measure:
        for track in curriculum.tracks:
            if not exercised & set(track.lesson_ids):
                problems.append(f"{curriculum.root.name if curriculum.root else 'lessons'}/{CURRICULUM_FILE}: track "
                                f"{track.id} has no ```exercise block: every track has work the learner does and "
                                "the program checks")
    return problems


# ---- worked problems, rendered values, leaked answers -------------------------------------------

_STEP = re.compile(r"^\s*Step\s+\d+\b")


def check_chains(lesson: Lesson) -> list[str]:
    """The steps of a worked problem ("Step 2. ...") share one draw: each drawing step names its
    `chain`, and steps of one chain that draw the same name draw it from the same list (else the
    answer carried from step 2 into step 3 is not the one step 3 expects)."""
    problems = []
    lists: dict[tuple[str, str], tuple[Any, ...]] = {}
    for quiz in lesson.quizzes:
        where = f"{_where(lesson, quiz.line)}: quiz {quiz.id}"
        if _STEP.match(quiz.question) and quiz.draw and not quiz.chain:
            problems.append(f"{where}: a worked problem's step draws on its own: give its steps one chain = \"...\"")
        if not quiz.chain:
            continue
        for name, values in quiz.draw:
            first = lists.setdefault((quiz.chain, name), values)
            if first != values:
                problems.append(f"{where}: chain {quiz.chain!r} draws {name} from {list(first)} in an earlier step "
                                f"and from {list(values)} here: give every step the same list")
    return problems


_NON_FINITE = re.compile(r"(?<![\w.])-?(?:inf|nan)(?![\w])", re.IGNORECASE)


def check_non_finite(lesson: Lesson, devices: Iterable[DeviceFigures | None] = LINT_DEVICES) -> list[str]:
    """No {{ }} value renders as inf or nan: a number too large for a float, or 0/0, is a bug in the
    expression (FP64's largest finite number is 1.8 × 10³⁰⁸, not inf)."""
    problems = []
    for block in lesson.blocks:
        written = sum(len(_NON_FINITE.findall(_VALUE_SPANS.sub(" ", text))) for text in _texts(block))
        for variant in _variants(block):
            for device in tuple(devices):
                try:
                    rendered = render_block(variant, device=device)
                except UserError:
                    continue  # check_values reports it
                texts = _texts(rendered)
                if sum(len(_NON_FINITE.findall(text)) for text in texts) > written:
                    shown = next(text for text in texts if _NON_FINITE.search(text))
                    match = _NON_FINITE.search(shown)
                    start = max(0, match.start() - 40) if match else 0
                    problems.append(f"{_where(lesson, block.line)}: {block.directive} {block.id}{_draw_name(variant)}: "
                                    f"a value renders as {match.group(0) if match else 'inf'}: "
                                    f"...{shown[start:start + 80]!r}")
                    break
            else:
                continue
            break
    return list(dict.fromkeys(problems))


# A figure as prose prints it: "912 MiB", "12.9B", "3.54 × 10⁴", "65,504".
_PRINTED_FIGURE = re.compile(
    r"(?<![\w.§^$])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"
    r"(\s*×\s*10[⁻⁺]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+)?"
    r"(\s*(?:[KMGTP]i?B|bytes|B|K|M|T|billion|million)\b)?")


def printed_figures(text: str, unit: str) -> list[tuple[str, float]]:
    """(token, value in `unit`) for each figure of 3+ significant digits in `text` that can be read in
    the quiz's unit: a figure with a unit of the same kind ("912 MiB" for a GiB quiz) converted; a bare
    figure only for a quiz without a unit kind, and then only with 4+ digits (a short bare number
    matching is more often chance than a copied answer)."""
    from tutor.lessons.grading import parse_number, unit_kind

    kind, factor = unit_kind(unit)
    found = []
    for match in _PRINTED_FIGURE.finditer(text):
        digits = significant_digits(match.group(1))
        if digits < 3 or _is_year(match.group(1)):
            continue
        number = parse_number(match.group(1) + (match.group(2) or ""))
        if number is None:
            continue
        suffix = (match.group(3) or "").strip()
        if suffix:
            figure_kind, figure_factor = ("count", 1e9) if suffix == "B" and kind == "count" else unit_kind(suffix)
            if figure_kind is None or figure_kind != kind:
                continue
            found.append((match.group(0).strip(), number * figure_factor / factor))
        elif kind is None and digits >= 4:
            found.append((match.group(0).strip(), number))
    return found


def check_leaked_answers(lesson: Lesson) -> list[str]:
    """No number quiz's answer, for any learner's draw, is printed in the prose above it (its worked
    example copied from a paragraph is recall, not work): the answer within the quiz's tolerance
    against every 3+ digit figure of the rendered prose before it."""
    from tutor.lessons.grading import expected_answer, quiz_unit

    problems = []
    above: list[str] = []
    for block in lesson.blocks:
        if isinstance(block, Prose):
            try:
                above.append(_texts(render_block(block))[0])
            except UserError:
                pass
            continue
        if not isinstance(block, Quiz) or block.kind != "number":
            continue
        unit = quiz_unit(block)
        figures = [figure for text in above for figure in printed_figures(text, unit)]
        for variant in _variants(block):
            try:
                expected = float(expected_answer(variant))
            except (UserError, TypeError, ValueError):
                continue
            if expected == 0:
                continue
            tolerance = max(block.tolerance, 0.005)
            leaked = next((token for token, value in figures
                           if abs(value - expected) <= tolerance * abs(expected)), None)
            if leaked is not None:
                problems.append(f"{_where(lesson, block.line)}: quiz {block.id}{_draw_name(variant)}: its answer is "
                                f"printed above it ({leaked!r}): draw values the prose does not work through")
                break
    return problems


# ---- predict units ------------------------------------------------------------------------------

_ASKED_IN = re.compile(r"\bhow many (minutes|seconds|hours|milliseconds|bytes|KiB|MiB|GiB|KB|MB|GB)\b(?!/)", re.IGNORECASE)
_ASKED_UNIT_WORD = {"minutes": "min", "seconds": "s", "hours": "h", "milliseconds": "ms", "bytes": "B"}
_SHARE_WORDS = re.compile(r"%|\bshare\b|\bfraction\b|\bpercent", re.IGNORECASE)
# A metric's name says what it measures; its unit must agree: (pattern, units allowed, what it is).
_METRIC_UNITS = (
    (re.compile(r"(^|_)s$"), ("s", "ms", "us", "min", "h"), "a time in seconds"),
    (re.compile(r"bytes"), ("B", "bytes", "B/param"), "a size in bytes"),
    (re.compile(r"fraction|share|bubble|overlap"), ("fraction", "%"), "a share"),
    (re.compile(r"^tflops"), ("TFLOP/s",), "a rate in TFLOP/s"),
    (re.compile(r"gbps|busbw|algbw"), ("GB/s",), "a bandwidth in GB/s"),
    (re.compile(r"_over_|speedup|ratio|reduction"), ("x", "fraction"), "a ratio"),
)


def check_predict_units(lesson: Lesson) -> list[str]:
    """A predict's unit agrees with its metric (a time metric in a time unit, a share as "fraction"
    or "%", a ratio as "x") and with its question: "how many minutes" reads a bare guess in minutes
    (guess_unit), "what share (e.g. 15%)" is a share. Otherwise a right guess is graded 60x or 100x off."""
    from tutor.lessons.predictions import SHARE_UNITS

    problems = []
    for block in lesson.blocks:
        if not isinstance(block, Predict):
            continue
        where = f"{_where(lesson, block.line)}: predict {block.id}"
        for pattern, units, what in _METRIC_UNITS:
            if pattern.search(block.metric) and block.unit not in units:
                problems.append(f"{where}: metric {block.metric} is {what}, but unit = {block.unit!r} "
                                f"(use one of {', '.join(repr(u) for u in units)})")
                break
        asked = _ASKED_IN.search(block.question)
        if asked:
            word = asked.group(1)
            wanted = _ASKED_UNIT_WORD.get(word.lower(), word)
            read_in = block.guess_unit or block.unit
            if read_in != wanted and not read_in.startswith(wanted + "/"):  # "B/param" answers "how many bytes"
                problems.append(f"{where}: the question asks for {word} but a bare guess is read in "
                                f"{(block.guess_unit or block.unit)!r}: set guess_unit = {wanted!r}")
        if _SHARE_WORDS.search(block.question) and block.unit not in SHARE_UNITS:
            problems.append(f"{where}: the question asks for a share but unit = {block.unit!r}: use \"fraction\" "
                            "(a metric from 0 to 1) or \"%\" (a metric in percent)")
    return problems


# ---- exercises ----------------------------------------------------------------------------------

def check_exercises(lesson: Lesson, *, run_torch: bool = True) -> list[str]:
    """Each exercise's starting point fails its check and its solution passes (rustlings' rule: an
    exercise that starts solved, or cannot be solved, teaches nothing). Checks that run a loop with
    torch are skipped when run_torch is False or torch is not installed."""
    import importlib.util

    from tutor.labs.exercise_checks import CHECKS

    problems = []
    has_torch = importlib.util.find_spec("torch") is not None
    for block in lesson.blocks:
        if not isinstance(block, Exercise):
            continue
        check = CHECKS[block.check]
        if check.needs_torch and not (run_torch and has_torch):
            continue
        where = f"{_where(lesson, block.line)}: exercise {block.id}"
        start, solution = check.run(block.start), check.run(block.solution)
        if start.passed:
            problems.append(f"{where}: its starting point already passes ({start.message}): start from one that fails")
        if not solution.passed:
            problems.append(f"{where}: its solution fails its own check: {solution.message}")
    return problems


# ---- choice quizzes that ask for application, not recall ----------------------------------------

RECALL_RUN = 8
"""Consecutive words a choice quiz's right answer may share with the prose above it before it is a
sentence read back rather than an idea applied to a new case."""
RECALL_MIN_WORDS = 3
"""Answers shorter than this ("FP16", "It doubles") are not judged: a name or a number is no sentence."""


def _words(text: str) -> list[str]:
    """Lowercased words of `text` with punctuation removed ("KV-cache, grows!" -> kv cache grows)."""
    return re.sub(r"[^\w\s]|_", " ", text.lower()).split()


def shared_run(answer: str, prose: str) -> int:
    """The longest run of consecutive words of `answer` that also appears, in order, in `prose`."""
    words, above = _words(answer), _words(prose)
    runs = [0] * (len(above) + 1)
    best = 0
    for word in words:
        previous, runs = runs, [0] * (len(above) + 1)
        for index, other in enumerate(above, start=1):
            if word == other:
                runs[index] = previous[index - 1] + 1
                best = max(best, runs[index])
    return best


def _choice_verdicts(lesson: Lesson) -> list[tuple[Quiz, str, int, int]]:
    """(quiz, right answer as rendered, its words, the longest run it shares with the prose above)
    for each choice quiz, in order; a quiz that does not render is left to check_values."""
    verdicts = []
    above: list[str] = []
    for block in lesson.blocks:
        try:
            rendered = render_block(block)
        except UserError:
            continue
        if isinstance(rendered, Prose):
            above.append(rendered.text)
            continue
        if not isinstance(block, Quiz) or not isinstance(rendered, Quiz) or block.kind != "choice":
            continue
        if not isinstance(rendered.answer, int) or not 0 <= rendered.answer < len(rendered.choices):
            continue  # check_quizzes reports it
        answer = rendered.choices[rendered.answer]
        verdicts.append((block, answer, len(_words(answer)), shared_run(answer, "\n".join(above))))
    return verdicts


def recall_run_limit(answer_words: int) -> int:
    """The shared run that makes an answer recall: RECALL_RUN words, or the whole of a shorter answer."""
    return min(RECALL_RUN, answer_words)


def check_recall_choices(lesson: Lesson) -> list[str]:
    """No choice quiz's right answer repeats the prose above it: a run of RECALL_RUN consecutive
    words (or the whole of a shorter answer of RECALL_MIN_WORDS+ words), after lowercasing and
    dropping punctuation, is a sentence the learner just read, not a new case worked out."""
    problems = []
    for quiz, answer, count, run in _choice_verdicts(lesson):
        if count >= RECALL_MIN_WORDS and run >= recall_run_limit(count):
            shown = answer if len(answer) <= 60 else answer[:57] + "..."
            problems.append(f"{_where(lesson, quiz.line)}: quiz {quiz.id}: its right answer {shown!r} repeats "
                            f"{run} consecutive words of the prose above: ask for a case the prose does not state")
    return problems


def check_application_choice(lesson: Lesson) -> list[str]:
    """A lesson holds at least one choice quiz that asks for application: a right answer of
    RECALL_MIN_WORDS+ words that shares no recall run with the prose above it."""
    applied = [quiz for quiz, _, count, run in _choice_verdicts(lesson)
               if count >= RECALL_MIN_WORDS and run < recall_run_limit(count)]
    if applied:
        return []
    return [f"{_where(lesson, 1)}: no choice quiz asks for application: give one a new case (another model, "
            f"machine or layout) whose right answer, of {RECALL_MIN_WORDS}+ words, the prose above does not state"]
