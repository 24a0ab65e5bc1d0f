"""tutor.labs.registry: the labs as data (no lab module imported to list them), each entry resolving
to its lab, and `tensor-tutor lab NAME --help` listing what the lab validates with."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from tests.cli_runner import run
from tutor.errors import UserError
from tutor.labs.registry import LABS, lab_entry, load_lab

LAB_MODULES = sorted({entry.module for entry in LABS.values()})


def _loaded_after(statement: str) -> list[str]:
    """tutor.labs.* modules (and torch/textual) in sys.modules after `statement`, in a fresh interpreter."""
    code = (f"{statement}\nimport sys, json\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('tutor.labs.') or m in ('torch', 'textual'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_registry_imports_no_lab_module() -> None:
    loaded = _loaded_after("import tutor.labs, tutor.labs.registry\nassert len(tutor.labs.PROBES) == len(tutor.labs.registry.LABS) >= 22")
    assert loaded == ["tutor.labs.probe", "tutor.labs.registry"]


def test_importing_the_app_imports_no_lab_module() -> None:
    loaded = _loaded_after("import tutor.ui.app")
    assert not set(loaded) & set(LAB_MODULES), loaded
    assert "torch" not in loaded


APP_FIRST_PAINT = """
import asyncio, json, sys
from tutor.worker.client import WorkerClient
WorkerClient.start = lambda self: None  # no measurement process: only this process's imports matter here
from tutor.ui.app import TutorApp
from tutor.ui.services import default_services

async def main():
    app = TutorApp(default_services())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.pause()
        print(json.dumps({"screen": type(app.screen).__name__,
                          "loaded": sorted(m for m in sys.modules if m.startswith("tutor.labs.") or m == "torch")}))

asyncio.run(main())
"""


def test_the_app_with_its_real_services_shows_home_without_importing_a_lab(tmp_path) -> None:
    env = {**os.environ, "TENSOR_TUTOR_DATA_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", APP_FIRST_PAINT], capture_output=True, text=True, env=env,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["screen"] == "HomeScreen"
    # Not even the registry: the app builds its lab proxies on first use (tutor.ui.services.ProbesWhenUsed).
    assert report["loaded"] == []


def test_building_the_apps_labs_imports_no_lab_module() -> None:
    loaded = _loaded_after("from tutor.labs.registry import LABS\nfrom tutor.worker.client import WorkerClient\n"
                           "from tutor.worker.proxies import worker_labs\n"
                           "labs = worker_labs(WorkerClient(), LABS)\n"
                           "assert labs['ddp'].title == 'Data parallelism with DDP'\n"
                           "assert 'device' in labs['matmul'].param_names")
    assert not set(loaded) & set(LAB_MODULES), loaded


def test_looking_a_lab_up_imports_its_module_only() -> None:
    loaded = _loaded_after("import tutor.labs\ntutor.labs.PROBES['moe-routing']")
    assert set(loaded) & set(LAB_MODULES) == {"tutor.labs.moe_routing"}


@pytest.mark.parametrize("name", list(LABS))
def test_every_registered_lab_resolves_and_declares_what_it_validates(name: str) -> None:
    entry = LABS[name]
    probe = entry.load()
    assert (probe.name, probe.title) == (entry.name, entry.title)
    declared = tuple(param.name for param in probe.params)
    assert declared == entry.param_names, f"registry says {entry.param_names}, {entry.module} declares {declared}"
    assert tuple(probe.check_params({})) == declared
    assert probe.default_params == {param.name: param.default for param in probe.params}
    assert set(probe.params_schema) == set(declared)


def test_an_unknown_lab_is_called_a_lab() -> None:
    with pytest.raises(UserError, match=r"unknown lab 'ddq' \(did you mean 'ddp'\?\); choose one of: matmul"):
        lab_entry("ddq")
    with pytest.raises(UserError, match="unknown lab"):
        load_lab("no-such-lab")


def _help(name: str) -> str:
    code, out, err = run(["lab", name, "--help"])
    assert code == 0 and not err, err
    return out


def _parameter_entries(text: str) -> dict[str, str]:
    """The Parameters section as {name: its entry on one line} (a long KEY=DEFAULT wraps the text below it)."""
    section = text.split("Parameters (", 1)[1].split("\nOptions:", 1)[0].splitlines()[1:]
    entries: dict[str, str] = {}
    name = None
    for line in section:
        if line.startswith("  ") and not line.startswith("   "):
            name = line.split()[0].split("=", 1)[0]
            entries[name] = line.strip()
        elif name is not None and line.strip():
            entries[name] += " " + line.strip()
    return entries


@pytest.mark.parametrize("name", list(LABS))
def test_lab_help_lists_every_parameter_with_its_default_and_range(name: str) -> None:
    probe = load_lab(name)
    text = _help(name)
    assert text.startswith(f"Usage: tensor-tutor lab {name} [KEY=VALUE]...")
    assert probe.title in text
    entries = _parameter_entries(text)
    assert list(entries) == [param.name for param in probe.params]
    for param in probe.params:
        line = " ".join(entries[param.name].split()).replace("- ", "-")  # help text wraps after a hyphen too
        assert line.startswith(param.name if param.default is None else f"{param.name}={param.typed_default} "), line
        assert " ".join(param.help.split()) in line, line
        assert param.accepted[:1].upper() + param.accepted[1:] in line, line
        if param.shown_unit:
            assert f"unit: {param.shown_unit}" in line, line


def test_lab_help_shows_defaults_ranges_and_units_as_the_lab_checks_them() -> None:
    def entries(name: str) -> dict[str, str]:
        return {key: " ".join(text.split()) for key, text in _parameter_entries(_help(name)).items()}

    ddp = entries("ddp")
    assert ddp["ranks"].startswith("ranks=2 ") and "2 to 64" in ddp["ranks"]
    assert ddp["budget_s"].startswith("budget_s=6.0 ") and ddp["budget_s"].endswith("0.1 to 120; unit: s.")
    assert ddp["bucket_cap_mb"].startswith("bucket_cap_mb=0.25 ") and "unit: MiB" in ddp["bucket_cap_mb"]
    assert ddp["seed"].endswith("At least 0.")
    collective = entries("collective")
    assert collective["sizes"].startswith("sizes=1MiB ") and "64 B to 1 GiB; unit: bytes" in collective["sizes"]
    assert collective["ops"].startswith("ops=all_reduce,all_gather,reduce_scatter ")
    assert "One or more of all_reduce, all_gather, reduce_scatter" in collective["ops"]
    fit = entries("fit")
    assert fit["capacity"].startswith("capacity a memory size") and fit["capacity"].endswith("Text or none.")


def test_a_default_shown_by_help_is_one_the_lab_accepts() -> None:
    """What --help prints as KEY=DEFAULT, typed back, gives the lab's default."""
    from tutor.commands.lab import _params

    for name in LABS:
        probe = load_lab(name)
        typed = [entry.split()[0] for entry in _parameter_entries(_help(name)).values()]
        typed = [word for word in typed if "=" in word]  # a bare KEY has no default value to type
        assert probe.check_params(_params(tuple(typed))) == probe.check_params({}), name


def test_lab_help_of_an_unknown_lab_is_one_line_and_exit_2() -> None:
    done = subprocess.run([sys.executable, "-m", "tutor", "lab", "ddq", "--help"], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "tensor-tutor: error: unknown lab 'ddq' (did you mean 'ddp'?); choose one of: " + ", ".join(LABS)]


def test_lab_without_a_name_still_has_its_own_help_and_lists_the_labs() -> None:
    code, general, _err = run(["lab", "--help"])
    assert code == 0 and "Usage: tensor-tutor lab [OPTIONS] [NAME] [PARAMS]..." in general
    assert "lab NAME --help` lists NAME's parameters" in general
    code, listed, _err = run(["lab"])
    assert code == 0 and [line.split()[0] for line in listed.splitlines()] == list(LABS)
