"""transformers' import without its scan of every model folder, which is cached per installation.

Importing any part of transformers (5.x) runs `transformers/__init__.py` and
`transformers/models/__init__.py`, and each calls `define_import_structure`, which reads every file
of every model folder (about 560 folders) for its `__all__`, to build the lazy module's table of
names: about 0.7 s of CPU, each time a process imports transformers (transformers' own
`utils/import_utils.py`). The table depends only on the files installed, so `install()` makes that
function read it from the data dir (transformers-import/<hash>.json), keyed by the transformers
version, the folder scanned and the modification times of its model folders (a folder's time changes
when a file in it is added, removed or replaced), and compute and store it on a miss. Anything
unexpected (another transformers layout, an unreadable or malformed cache) falls back to
transformers' own function: the cache can cost nothing but its own speed-up.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.abc
import importlib.machinery
import os
import sys
from importlib import metadata
from typing import Any

MODULE = "transformers.utils.import_utils"
FUNCTION = "define_import_structure"
CACHE_FOLDER = "transformers-import"
CACHE_LIMIT_BYTES = 8 * 1024 * 1024
FORMAT = 1


def structure_json(structure: dict) -> list:
    """define_import_structure's {frozenset(backends): {module: set(names)}} as JSON lists."""
    return [[sorted(backends), {module: sorted(names) for module, names in modules.items()}]
            for backends, modules in structure.items()]


def structure_from_json(value: object) -> dict:
    """structure_json's inverse; ValueError for anything else."""
    if not isinstance(value, list):
        raise ValueError("not a list")
    out: dict = {}
    for item in value:
        backends, modules = item
        if not isinstance(modules, dict) or not all(isinstance(b, str) for b in backends):
            raise ValueError("malformed entry")
        out[frozenset(backends)] = {str(module): {str(n) for n in names} for module, names in modules.items()}
    return out


def _folders_signature(module_path) -> str:
    folder = os.path.dirname(module_path) if str(module_path).endswith(".py") else str(module_path)
    stamps = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False) or entry.name.endswith(".py"):
                stamps.append(f"{entry.name}:{entry.stat(follow_symlinks=False).st_mtime_ns}")
    return "|".join(sorted(stamps))


def cache_key(module_path, prefix) -> str:
    """The hash of what the table depends on: version, folder, prefix and the folders' times."""
    text = (f"{FORMAT}|{metadata.version('transformers')}|{os.path.abspath(str(module_path))}|{prefix}|"
            f"{_folders_signature(module_path)}")
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def cached(original):
    """`original` (define_import_structure) served from, and stored to, the data dir."""
    from tutor.files.storage import data_dir, read_json, write_json_atomic

    @functools.wraps(original)
    def define_import_structure(module_path, prefix=None):
        try:
            path = data_dir() / CACHE_FOLDER / f"{cache_key(module_path, prefix)}.json"
            stored: dict[str, Any]
            stored, _warning = read_json(path, {}, limit=CACHE_LIMIT_BYTES)
            if stored.get("format") == FORMAT:
                return structure_from_json(stored["structure"])
        except (OSError, ValueError, TypeError, KeyError, metadata.PackageNotFoundError):
            return original(module_path, prefix)
        structure = original(module_path, prefix)
        try:
            write_json_atomic(path, {"format": FORMAT, "structure": structure_json(structure)})
        except (OSError, TypeError, ValueError):
            pass  # a read-only data dir: the next process scans again, nothing worse
        return structure

    return define_import_structure


class _Loader(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def __getattr__(self, name):  # get_source, get_filename, ... for tracebacks and inspect
        return getattr(self._loader, name)

    def exec_module(self, module):
        self._loader.exec_module(module)
        original = getattr(module, FUNCTION, None)
        if callable(original):
            setattr(module, FUNCTION, cached(original))


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Cache the scan for the next import of transformers in this process (none if it is imported)."""
    if "transformers" in sys.modules or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())
