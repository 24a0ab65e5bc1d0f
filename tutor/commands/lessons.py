"""`tensor-tutor lessons`: the curriculum, track by track, with the learner's progress;
`tensor-tutor lessons show ID`: one lesson as plain text, for reading without the app."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click
from tutor.commands.json_output import echo_json

if TYPE_CHECKING:
    from tutor.labs import Probe
    from tutor.lessons.learner import LessonDevice
    from tutor.lessons.model import Lesson, Quiz
    from tutor.lessons.progress import ProgressStore


@click.group("lessons", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (each lesson with its blocks).")
@click.option("--check", is_flag=True,
              help="Lint the lessons instead (for authors): every block, value, quiz answer and lab.")
@click.pass_context
def lessons(ctx: click.Context, as_json: bool, check: bool) -> None:
    """List the lessons in order, with their track, length and whether you completed them.

    `tensor-tutor lessons show ID` prints one lesson as plain text."""
    if ctx.invoked_subcommand is not None:
        return
    if check:
        _check()
        return
    from tutor.lessons import ProgressStore, load_curriculum

    curriculum = load_curriculum()
    progress = ProgressStore()
    if progress.warning:
        click.echo(f"tensor-tutor: warning: {progress.warning}", err=True)
    if as_json:
        rows = [{"id": info.id, "title": info.title, "track": info.track, "minutes": info.minutes,
                 "completed": progress.is_completed(info.id),
                 "blocks": [{"kind": block.directive, "id": block.id}
                            for block in curriculum.lesson(info.id).interactive_blocks]}
                for info in curriculum.lessons]
        tracks = []
        for track in curriculum.tracks:
            done, total = progress.track_progress(track)
            tracks.append({"id": track.id, "title": track.title, "summary": track.summary,
                           "lessons": list(track.lesson_ids), "completed": done, "total": total})
        echo_json({"lessons": rows, "tracks": tracks})
        return
    from rich.console import Console
    from tutor.safe_text import markup_escape as escape
    from rich.table import Table

    from tutor.commands.tables import ID_COLUMN, PROSE_COLUMN

    table = Table(title=f"{len(curriculum.lessons)} lessons in {len(curriculum.tracks)} tracks "
                        "(open one: tensor-tutor learn ID)", title_justify="left")
    # The id is what a learner types: it keeps its full width; the title wraps instead.
    table.add_column("lesson", justify="left", **ID_COLUMN)
    table.add_column("title", justify="left", **PROSE_COLUMN)
    table.add_column("min", justify="right", **ID_COLUMN)
    table.add_column("done", justify="center", **ID_COLUMN)
    for track in curriculum.tracks:
        done, total = progress.track_progress(track)
        table.add_section()
        table.add_row(f"[bold]{escape(track.title)}[/bold]", escape(track.summary), "", f"{done}/{total}")
        for info in curriculum.lessons:
            if info.track == track.id:
                table.add_row(info.id, escape(info.title), str(info.minutes),
                              "yes" if progress.is_completed(info.id) else "")
    Console().print(table)


@lessons.command("show")
@click.argument("lesson_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print the lesson as one JSON object.")
def show(lesson_id: str, as_json: bool) -> None:
    """Print lesson ID as plain text: values computed for this machine, each block as its prompt
    (quiz questions and choices as you would get them in the app; answers are not printed)."""
    from tutor.hardware import detect_machine
    from tutor.lessons import ProgressStore, load_curriculum

    curriculum = load_curriculum()
    lesson = curriculum.lesson(lesson_id)
    progress = ProgressStore()
    learner_id = progress.learner_id  # first: creating it may fail to save, which the warning then says
    if progress.warning:
        click.echo(f"tensor-tutor: warning: {progress.warning}", err=True)
    blocks = shown_blocks(lesson, learner_id=learner_id, device=detect_machine(), progress=progress)
    if as_json:
        echo_json({"id": lesson.id, "title": lesson.info.title, "track": lesson.info.track,
                   "minutes": lesson.info.minutes, "blocks": blocks})
        return
    click.echo(lesson_text(lesson, blocks))


def shown_blocks(lesson: Lesson, *, learner_id: str, device: LessonDevice,
                 progress: ProgressStore | None = None) -> list[dict[str, Any]]:
    """Each block of the lesson as the learner gets it: kind, id and its prompt fields, rendered."""
    from tutor.lessons.learner import learner_view
    from tutor.lessons.model import Bits, Calc, Exercise, Measure, Predict, Prose, Quiz

    result = []
    for block in lesson.blocks:
        round_ = progress.round_of(lesson.id, block.id) if progress is not None else 0
        view = learner_view(block, learner_id=learner_id, lesson_id=lesson.id, device=device, round_=round_)
        entry: dict[str, Any] = {"kind": block.directive, "id": block.id, "line": block.line}
        if isinstance(view, Prose):
            entry["text"] = view.text
        elif isinstance(view, Quiz):
            entry.update(question=view.question, answer_kind=view.kind, choices=list(view.choices),
                         unit=_quiz_unit(view), hints=len(view.hints))
        elif isinstance(view, Predict):
            entry.update(question=view.question, probe=view.probe, params=view.params, metric=view.metric,
                         unit=view.unit, guess_unit=view.guess_unit or view.unit, explain=view.explain)
        elif isinstance(view, Measure):
            entry.update(probe=view.probe, params=view.params, explain=view.explain)
        elif isinstance(view, Calc):
            entry.update(calculator=view.kind, model=view.model, fields=list(view.fields),
                         values={name: _plain(value) for name, value in view.values.items()})
            if view.goal is not None:
                entry.update(goal=view.goal_text, goal_device=view.goal.device, devices_max=view.goal.devices_max,
                             devices_min=view.goal.devices_min)
        elif isinstance(view, Bits):
            entry.update(value=view.value, formats=list(view.formats))
        elif isinstance(view, Exercise):
            entry.update(task=view.task, check=view.check, language=view.language, start=view.start,
                         hints=len(view.hints))
        result.append(entry)
    return result


def _quiz_unit(quiz: Quiz) -> str:
    from tutor.lessons.grading import quiz_unit

    return quiz_unit(quiz)


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


def _params_text(params: dict[str, object]) -> str:
    return ", ".join(f"{name}={value}" for name, value in params.items()) or "defaults"


def lesson_text(lesson: Lesson, blocks: list[dict[str, Any]]) -> str:
    """The lesson as plain text: prose as written (values computed), each block as a labelled prompt."""
    info = lesson.info
    lines = [info.title, f"{info.track} · {info.minutes} min" + (f" · after {', '.join(info.prerequisites)}"
                                                               if info.prerequisites else ""), ""]
    for block in blocks:
        kind = block["kind"]
        if kind == "prose":
            lines += [block["text"], ""]
            continue
        lines.append(f"[{kind} {block['id']}]")
        if kind == "quiz":
            lines.append(block["question"])
            lines += [f"  {chr(ord('a') + i)}) {choice}" for i, choice in enumerate(block["choices"])]
            if block["answer_kind"] == "number":
                lines.append(f"  answer: a number{' in ' + block['unit'] if block['unit'] else ''}")
        elif kind == "predict":
            lines.append(block["question"])
            asked = block["guess_unit"]
            lines.append(f"  commit a guess{' in ' + asked if asked else ''}, then lab "
                         f"{block['probe']} ({_params_text(block['params'])}) measures {block['metric']}")
            if block["explain"]:
                lines.append(f"  after it measures: {block['explain']}")
        elif kind == "measure":
            lines.append(f"  runs lab {block['probe']} ({_params_text(block['params'])})")
            if block["explain"]:
                lines.append(block["explain"])
        elif kind == "calc":
            lines.append(f"  {block['calculator']} calculator; fields: {', '.join(block['fields'])}")
            if block["values"]:
                lines.append(f"  starting values: {_params_text(block['values'])}")
            if block.get("goal"):
                lines.append(f"  goal: {block['goal']}")
        elif kind == "bits":
            lines.append(f"  {block['value']} in {', '.join(block['formats'])}")
        elif kind == "exercise":
            lines.append(block["task"])
            lines.append(f"  starting point (edit it, then check it: tensor-tutor lab exercise check={block['check']} "
                         "answer=...):")
            lines += [f"    {line}" for line in block["start"].splitlines()]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _check() -> None:
    """Print every lint problem, one per line; exit 1 when there is any."""
    import importlib.util

    from tutor.lessons import lessons_root
    from tutor.lessons.lint import lint_curriculum

    probes: Mapping[str, Probe] | None = None
    if importlib.util.find_spec("tutor.labs") is not None:
        from tutor.labs import PROBES

        probes = PROBES
    root = lessons_root()
    problems = lint_curriculum(root, probes)
    for problem in problems:
        click.echo(problem)
    skipped = "" if probes is not None else " (labs not checked: tutor.labs is missing)"
    click.echo(f"{root}: {len(problems)} problem(s){skipped}", err=True)
    if problems:
        raise SystemExit(1)
