"""tutor.theory computes; it reads no file (DESIGN.md: theory is pure formulas). Reading config.json files,
the presets and safetensors headers is tutor.files.models' job, so a formula cannot depend on what is on disk.

Each module of tutor/theory is parsed with `ast` (not imported) and every construct that reaches the file
system is named with its line: the builtin open(), the pathlib methods that read or list, an import of a
module whose job is files (os, pathlib, importlib.resources, io, shutil, ...), and any os.* call.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tutor.theory

THEORY = Path(tutor.theory.__file__).parent
MODULES = sorted(THEORY.glob("*.py"))

# Modules whose purpose is the file system (or that hand out file handles and paths).
FILE_MODULES = frozenset({
    "os", "os.path", "pathlib", "io", "shutil", "glob", "tempfile", "fileinput", "mmap", "stat",
    "importlib", "importlib.resources", "importlib.abc", "pkgutil", "codecs", "zipfile", "tarfile", "gzip", "bz2",
    "lzma", "sqlite3", "subprocess", "linecache",
})
# Methods of Path (and of importlib.resources traversables) that read, write, open or list.
FILE_METHODS = frozenset({
    "open", "read_text", "read_bytes", "write_text", "write_bytes", "iterdir", "glob", "rglob", "walk",
    "exists", "is_file", "is_dir", "stat", "lstat", "readlink", "resolve", "expanduser", "joinpath", "files",
})
FILE_BUILTINS = frozenset({"open", "__import__"})


def _imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return []


def file_access(source: str) -> list[str]:
    """Every construct in `source` that reaches the file system, as 'line N: what'."""
    found = []
    for node in ast.walk(ast.parse(source)):
        for name in _imported(node):
            if name in FILE_MODULES or name.split(".")[0] in {"os", "pathlib", "io", "shutil", "importlib"}:
                found.append(f"line {node.lineno}: imports {name}")
        if isinstance(node, ast.Call):
            function = node.func
            if isinstance(function, ast.Name) and function.id in FILE_BUILTINS:
                found.append(f"line {node.lineno}: calls {function.id}()")
            if isinstance(function, ast.Attribute) and function.attr in FILE_METHODS:
                found.append(f"line {node.lineno}: calls .{function.attr}()")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os":
            found.append(f"line {node.lineno}: uses os.{node.attr}")
    return sorted(set(found), key=lambda line: int(line.split()[1].rstrip(":")))


def test_every_theory_module_is_checked() -> None:
    names = {path.stem for path in MODULES}
    assert {"models", "safetensors_header", "fit", "memory"} <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda path: path.name)
def test_theory_module_reads_no_file(path: Path) -> None:
    found = file_access(path.read_text(encoding="utf-8"))
    assert not found, f"tutor/theory/{path.name} reaches the file system (move it to tutor/files/models.py): " + (
        "; ".join(found))


@pytest.mark.parametrize("snippet", [
    "open('config.json').read()",
    "with open(path, 'rb') as f: pass",
    "Path(p).read_text()",
    "p.read_bytes()",
    "p.open('rb')",
    "folder.glob('*.safetensors')",
    "from importlib import resources",
    "resources.files('tutor.presets')",
    "import importlib.resources",
    "import os",
    "import os.path",
    "from os import path",
    "from pathlib import Path",
    "import pathlib",
    "os.stat(p)",
    "os.listdir('.')",
    "import io",
    "__import__('os')",
])
def test_the_check_names_each_way_to_read_a_file(snippet: str) -> None:
    assert file_access(snippet), snippet


@pytest.mark.parametrize("snippet", [
    "import json\njson.loads(raw)",
    "import math, re, struct\nstruct.unpack('<Q', prefix)",
    "from dataclasses import dataclass, replace",
    "text.split(',')",
    "header.items()",
])
def test_pure_code_passes_the_check(snippet: str) -> None:
    assert file_access(snippet) == []
