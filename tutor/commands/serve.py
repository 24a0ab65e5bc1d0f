"""`tensor-tutor serve`: the tutor app in a browser, through textual-serve.

Each browser tab starts its own `python -m tutor learn` process on this machine, so every tab's
measurements run on this machine's hardware. Bound to localhost unless --host says otherwise.
"""

from __future__ import annotations

import shlex
import sys

import click

from tutor.errors import UserError

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def app_command(lesson_id: str | None = None) -> str:
    """The shell command textual-serve runs for each browser session."""
    parts = [sys.executable, "-m", "tutor", "learn"] + ([lesson_id] if lesson_id else [])
    return shlex.join(parts)


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (localhost only by default).")
@click.option("--port", default=8000, show_default=True, type=int, help="TCP port.")
@click.argument("lesson_id", required=False)
def serve(host: str, port: int, lesson_id: str | None) -> None:
    """Run the tutor app in a browser: open http://HOST:PORT."""
    if not 1 <= port <= 65535:
        raise UserError(f"--port must be from 1 to 65535, got {port}")
    if lesson_id is not None:
        from tutor.lessons import load_curriculum

        lesson_id = load_curriculum().lesson(lesson_id).info.id
    try:
        from textual_serve.server import Server
    except ImportError:
        raise UserError("serving in a browser needs textual-serve: pip install textual-serve") from None
    if host not in LOCAL_HOSTS:
        click.echo(f"tensor-tutor: warning: listening on {host}: anyone who can reach it can run "
                   "benchmarks on this machine", err=True)
    click.echo(f"tensor-tutor: serving the app at http://{host}:{port} (Ctrl-C stops)", err=True)
    Server(app_command(lesson_id), host=host, port=port, title="tensor-tutor").serve()
