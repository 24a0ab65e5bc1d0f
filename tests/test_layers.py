"""The dependency rule of DESIGN.md: each layer imported in a fresh interpreter pulls in only what it may.

`theory` is standard library only; the commands a user types for a quick answer (`fit`, `models`,
`env`) never import torch or textual; nothing below `ui` imports textual.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "textual", "numpy")


def modules_after_import(statement: str) -> set[str]:
    """The top-level module names present in sys.modules after running `statement` in a new interpreter."""
    code = f"{statement}\nimport sys, json\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(result.stdout.strip().splitlines()[-1]))


def test_theory_imports_only_the_standard_library() -> None:
    statement = "import pkgutil, importlib, tutor.theory\n" + (
        "for m in pkgutil.iter_modules(tutor.theory.__path__):\n"
        "    importlib.import_module('tutor.theory.' + m.name)"
    )
    loaded = modules_after_import(statement)
    # What the interpreter loads before any import of ours is not theory's doing: sitecustomize (Debian's
    # Python ships one), a .pth file's import (setuptools' _distutils_hack, a virtualenv's or uv's
    # _virtualenv, an editable install's finder), whatever this machine's Python and venv bring.
    at_start_up = modules_after_import("pass")
    third_party = loaded - at_start_up - set(sys.stdlib_module_names) - {"tutor"}
    assert not third_party, f"tutor.theory imported non-stdlib modules: {sorted(third_party)}"


@pytest.mark.parametrize("command", ["fit", "models", "env", "time"])
def test_quick_commands_do_not_import_torch_or_textual(command: str) -> None:
    loaded = modules_after_import(f"import tutor.cli, tutor.commands.{command}")
    assert not loaded & {"torch", "textual"}, f"`{command}` imports {sorted(loaded & {'torch', 'textual'})}"


@pytest.mark.parametrize(
    "argv",
    [["fit", "llama-3.1-8b", "--json"], ["models", "--json"], ["env", "--json"],
     ["time", "llama-3.1-8b", "--mode", "train", "--device", "h100", "--json"]],
)
def test_quick_commands_run_without_loading_torch_or_textual(argv: list[str]) -> None:
    statement = (
        "import sys, io, contextlib\nfrom tutor.cli import main\n"
        "buffer = io.StringIO()\n"
        "with contextlib.redirect_stdout(buffer):\n"
        "    try:\n"
        f"        main({argv!r})\n"
        "    except SystemExit as e:\n"
        "        assert not e.code, e.code"
    )
    loaded = modules_after_import(statement)
    assert not loaded & {"torch", "textual"}, f"{argv} loaded {sorted(loaded & {'torch', 'textual'})}"


def test_nothing_below_ui_imports_textual() -> None:
    statement = "import pkgutil, importlib, tutor\n" + (
        "for m in pkgutil.walk_packages(tutor.__path__, 'tutor.'):\n"
        "    if not m.name.startswith('tutor.ui'):\n"
        "        importlib.import_module(m.name)"
    )
    assert "textual" not in modules_after_import(statement)
