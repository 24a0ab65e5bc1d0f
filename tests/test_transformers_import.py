"""The cached table of transformers' lazy module (tutor.trace.transformers_import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from transformers.utils import import_utils

from tutor.trace import transformers_import

from tests.subprocess_env import pythonpath

MODELS = Path(transformers.__file__).parent / "models"


def original():
    function = import_utils.define_import_structure
    return getattr(function, "__wrapped__", function)


@pytest.fixture(autouse=True)
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    return tmp_path


def test_the_cached_table_is_transformers_own_and_is_read_back_without_scanning(data_dir) -> None:
    calls = []

    def scan(module_path, prefix=None):
        calls.append(module_path)
        return original()(module_path, prefix)

    define = transformers_import.cached(scan)
    first = define(MODELS, prefix="models")
    assert first == original()(MODELS, prefix="models")
    files = list((data_dir / transformers_import.CACHE_FOLDER).glob("*.json"))
    assert len(files) == 1 and len(calls) == 1
    again = define(MODELS, prefix="models")
    assert again == first and again is not first and len(calls) == 1  # read back, a fresh copy to mutate
    assert define(str(MODELS / "__init__.py")) == original()(str(MODELS / "__init__.py"))  # another key
    assert len(calls) == 2


def test_a_malformed_cache_falls_back_to_the_scan(data_dir) -> None:
    define = transformers_import.cached(original())
    path = data_dir / transformers_import.CACHE_FOLDER / f"{transformers_import.cache_key(MODELS, 'models')}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"format": transformers_import.FORMAT, "structure": [["torch"]]}))
    assert define(MODELS, prefix="models") == original()(MODELS, prefix="models")


def test_a_fresh_process_with_the_cache_imports_transformers_as_before(data_dir) -> None:
    script = ("from tutor.trace.transformers_import import install; install()\n"
              "import transformers, transformers.models.llama.modeling_llama as m\n"
              "from transformers.utils import import_utils as u\n"
              "print(hasattr(u.define_import_structure, '__wrapped__'), m.LlamaForCausalLM.__name__,"
              " transformers.AutoConfig.__name__)")
    env = {**os.environ, "PYTHONPATH": pythonpath(Path(__file__).resolve().parent.parent)}
    for _ in range(2):  # the first process writes the cache, the second reads it
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["True", "LlamaForCausalLM", "AutoConfig"]
    assert list((data_dir / transformers_import.CACHE_FOLDER).glob("*.json"))
