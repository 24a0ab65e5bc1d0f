"""`tensor-tutor lessons`: the curriculum, track by track, with the learner's progress."""

from __future__ import annotations

import json

import click


@click.command("lessons")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--check", is_flag=True,
              help="Lint the lessons instead (for authors): every block, value, quiz answer and probe.")
def lessons(as_json: bool, check: bool) -> None:
    """List the lessons in order, with their track, length and whether you completed them."""
    if check:
        _check()
        return
    from tutor.lessons import ProgressStore, load_curriculum

    curriculum = load_curriculum()
    progress = ProgressStore()
    if progress.warning:
        click.echo(f"tensor-tutor: warning: {progress.warning}", err=True)
    rows = [{"id": info.id, "title": info.title, "track": info.track, "minutes": info.minutes,
             "completed": progress.is_completed(info.id)} for info in curriculum.lessons]
    tracks = []
    for track in curriculum.tracks:
        done, total = progress.track_progress(track)
        tracks.append({"id": track.id, "title": track.title, "summary": track.summary,
                       "lessons": list(track.lesson_ids), "completed": done, "total": total})
    if as_json:
        click.echo(json.dumps({"lessons": rows, "tracks": tracks}, indent=2))
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"{len(rows)} lessons in {len(tracks)} tracks (open one: tensor-tutor learn ID)",
                  title_justify="left")
    for column, justify in (("lesson", "left"), ("title", "left"), ("min", "right"), ("done", "center")):
        table.add_column(column, justify=justify)
    for track in tracks:
        table.add_section()
        table.add_row(f"[bold]{escape(track['title'])}[/bold]", escape(track["summary"]), "",
                      f"{track['completed']}/{track['total']}")
        for row in rows:
            if row["track"] == track["id"]:
                table.add_row(row["id"], escape(row["title"]), str(row["minutes"]), "yes" if row["completed"] else "")
    Console().print(table)


def _check() -> None:
    """Print every lint problem, one per line; exit 1 when there is any."""
    import importlib.util

    from tutor.lessons import lessons_root
    from tutor.lessons.lint import lint_curriculum

    probes = None
    if importlib.util.find_spec("tutor.labs") is not None:
        from tutor.labs import PROBES as probes
    root = lessons_root()
    problems = lint_curriculum(root, probes)
    for problem in problems:
        click.echo(problem)
    skipped = "" if probes is not None else " (probes not checked: tutor.labs is missing)"
    click.echo(f"{root}: {len(problems)} problem(s){skipped}", err=True)
    if problems:
        raise SystemExit(1)
