"""Running the code a learner typed into a lesson's ```exercise block, for tutor.labs.exercise_checks.

The code runs in the worker process, on the learner's own machine, as the learner's own program: this
is not a sandbox. Its job is to turn whatever the code does into one line the learner can act on: a
syntax error or an exception becomes "line N: ...", a missing function "define a function named f".
An exercise about arithmetic a library would do (rounding to BF16, an absmax scale) refuses imports,
so the learner's answer has to hold the idea rather than call the cast that has it.
"""

from __future__ import annotations

import ast
import builtins
import textwrap
from collections.abc import Callable
from types import CodeType
from typing import Any

FILENAME = "<your code>"
"""The file name the learner's code is compiled under: how a traceback's line is found to be theirs."""
WITHOUT_IMPORTS = ("__import__", "open", "eval", "exec", "compile")
"""Builtins left out when imports are refused: each would reach a module or run text as code."""


class Refused(Exception):
    """The answer cannot be run, or failed while running: one line for the learner."""


def compile_answer(answer: str) -> CodeType:
    """The learner's text compiled; Refused naming the line of a syntax error."""
    try:
        return compile(textwrap.dedent(answer), FILENAME, "exec")
    except SyntaxError as error:
        raise Refused(f"line {error.lineno}: {error.msg}") from None


def imports_in(answer: str) -> list[str]:
    """The modules the learner's code imports, and the builtins it would reach modules through."""
    names = []
    for node in ast.walk(ast.parse(textwrap.dedent(answer))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append(node.module or ".")
        elif isinstance(node, ast.Name) and node.id in (*WITHOUT_IMPORTS, "__builtins__"):
            names.append(node.id)
    return names


def _where(error: BaseException) -> str:
    """"line N: " for the deepest frame of the learner's code in the error's traceback, else ""."""
    line = ""
    traceback = error.__traceback__
    while traceback is not None:
        if traceback.tb_frame.f_code.co_filename == FILENAME:
            line = f"line {traceback.tb_lineno}: "
        traceback = traceback.tb_next
    return line


def run_code(code: CodeType, namespace: dict) -> None:
    """Run the learner's code in `namespace`; Refused with the line of the learner's that raised."""
    try:
        exec(code, namespace)  # the learner's own code, on their own machine, in the worker process
    except Exception as error:
        raise Refused(f"{_where(error)}{type(error).__name__}: {error}") from None


def learner_function(answer: str, name: str, *, imports: bool = True, given: dict | None = None) -> Callable[..., Any]:
    """The function `name` that the learner's code defines, with `given` names in its globals.
    imports=False refuses an import before running anything and leaves __import__ out of the builtins."""
    code = compile_answer(answer)
    namespace: dict = {}
    if not imports:
        found = imports_in(answer)
        if found:
            raise Refused(f"no imports here ({', '.join(found)}): the exercise is the arithmetic a library would "
                          "do for you, with Python's own numbers and operators")
        namespace["__builtins__"] = {key: value for key, value in vars(builtins).items() if key not in WITHOUT_IMPORTS}
    namespace.update(given or {})
    run_code(code, namespace)
    function = namespace.get(name)
    if not callable(function):
        raise Refused(f"define a function named {name}")
    return function


def call(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """function(*args, **kwargs); Refused naming the call and the learner's line when it raises."""
    try:
        return function(*args, **kwargs)
    except Exception as error:
        shown = ", ".join([*(_short(a) for a in args), *(f"{k}={_short(v)}" for k, v in kwargs.items())])
        name = getattr(function, "__name__", "your function")
        raise Refused(f"{name}({shown}) raised {_where(error)}{type(error).__name__}: {error}") from None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
