"""Shell completion of the names a command takes: model presets, lesson ids, labs, lab parameters, devices.

click completes commands and options by itself (`_TENSOR_TUTOR_COMPLETE=bash_source tensor-tutor`,
see the README); this module adds the values. COMPLETERS maps (command, parameter) to the function
that lists the values; tutor.cli attaches them when it loads a command (`attach`), so a command's
module declares its parameters as usual and this table is the one place completions live. Every
completer is cheap (no torch, no textual) and says nothing on failure: a broken completion must
never print into the user's shell.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import click
from click.shell_completion import CompletionItem

Completer = Callable[[click.Context, click.Parameter, str], list[CompletionItem]]


def _matching(items: Iterable[tuple[str, str]], incomplete: str) -> list[CompletionItem]:
    """(value, help) pairs whose value starts with what was typed."""
    return [CompletionItem(value, help=text or None) for value, text in items if value.startswith(incomplete)]


def preset_items() -> list[tuple[str, str]]:
    """Every bundled model preset (tutor.files.models), with its display name."""
    from tutor.files.models import list_presets

    return [(info.name, info.display_name) for info in list_presets()]


def lesson_items() -> list[tuple[str, str]]:
    """Every lesson id of the shipped curriculum, with its title."""
    from tutor.lessons import load_curriculum

    return [(info.id, info.title) for info in load_curriculum().lessons]


def lab_items() -> list[tuple[str, str]]:
    """Every lab's name and title, from the registry (no lab module is imported)."""
    from tutor.labs.registry import LABS

    return [(name, entry.title) for name, entry in LABS.items()]


def cuda_device_count() -> int:
    """GPUs NVML sees (0 without a driver); the index a `cuda:N` completion offers."""
    from tutor.hardware.nvidia import open_nvml, shutdown_nvml

    pynvml, _problem = open_nvml()
    if pynvml is None:
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:  # an NVML failure is "no GPU here" for a completion
        return 0
    finally:
        shutdown_nvml(pynvml)


def run_device_items(*, auto: bool = False) -> list[tuple[str, str]]:
    """Where a measurement can run: cpu, cuda, and cuda:N for each GPU here (plus `auto` for labs)."""
    items = [("auto", "the first GPU, else cpu")] if auto else []
    items.append(("cpu", "this machine's CPU"))
    count = cuda_device_count()
    if count:
        items.append(("cuda", "the first GPU"))
        items.extend((f"cuda:{index}", f"GPU {index}") for index in range(count))
    return items


def fit_device_items() -> list[tuple[str, str]]:
    """What `fit --device` takes by name: cpu, this machine's GPUs, and the cards of the spec table."""
    from tutor.hardware.specs import gpu_names

    return [item for item in run_device_items() if item[0] != "cuda"] + [(name, "a card from the spec table")
                                                                        for name in gpu_names()]


def _safe(items: Callable[[], list[tuple[str, str]]]) -> Completer:
    def complete(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
        try:
            return _matching(items(), incomplete)
        except Exception:  # completion runs inside the user's shell: never a traceback there
            return []

    complete.__name__ = f"complete_{items.__name__.removesuffix('_items')}"
    return complete


complete_presets = _safe(preset_items)
complete_lessons = _safe(lesson_items)
complete_labs = _safe(lab_items)
complete_run_devices = _safe(run_device_items)
complete_fit_devices = _safe(fit_device_items)


def lab_param_items(lab: str, typed: str, key: str | None = None) -> list[tuple[str, str]]:
    """KEY=VALUE words for the lab `lab`: each parameter with its default while the key is typed,
    then the values it accepts (choices, devices, presets) once `KEY=` is. `key` is a KEY already
    typed as its own word (bash splits `KEY=VALUE` at the `=`): then the bare values are offered."""
    from tutor.labs.registry import LABS

    if lab not in LABS:
        return []
    params = {param.name: param for param in LABS[lab].load().params}
    bare = key is not None
    if key is None:
        key, sep, _value = typed.partition("=")
        if not sep:
            return [(f"{name}={param.typed_default or ''}", param.help) for name, param in params.items()]
    param = params.get(key)
    if param is None:
        return []
    if param.choices:
        values = [(choice, "") for choice in param.choices]
    elif key == "device":
        values = run_device_items(auto=True)
    elif key == "model":
        values = preset_items()
    else:
        values = [(param.typed_default, "the default")] if param.typed_default is not None else []
    return values if bare else [(f"{key}={value}", text) for value, text in values]


def complete_lab_params(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """`tensor-tutor lab NAME <TAB>`: the lab's KEY=VALUE parameters."""
    try:
        lab = str(ctx.params.get("name") or "")
        before = tuple(ctx.params.get("params") or ())
        if len(before) >= 2 and before[-1] == "=":  # bash: words KEY, =, then the value being typed
            return _matching(lab_param_items(lab, "", key=before[-2]), incomplete)
        return _matching(lab_param_items(lab, incomplete), incomplete)
    except Exception:  # as in _safe
        return []


COMPLETERS: dict[tuple[str, str], Completer] = {
    ("fit", "model"): complete_presets,
    ("fit", "device"): complete_fit_devices,
    ("bench", "device"): complete_run_devices,
    ("lab", "name"): complete_labs,
    ("lab", "params"): complete_lab_params,
    ("learn", "lesson_id"): complete_lessons,
    ("lessons", "lesson_id"): complete_lessons,
    ("serve", "lesson_id"): complete_lessons,
}
"""(top-level command, parameter name) -> completer; it applies to the command's subcommands too."""


def attach(name: str, command: click.Command) -> click.Command:
    """`command` (the top-level command `name`) with the completers of COMPLETERS on its parameters
    and its subcommands' (as click's `shell_complete=` argument would set them)."""
    commands = [command]
    while commands:
        current = commands.pop()
        for param in current.params:
            completer = COMPLETERS.get((name, param.name or ""))
            if completer is not None and getattr(param, "_custom_shell_complete", None) is None:
                param._custom_shell_complete = completer
        if isinstance(current, click.Group):
            commands.extend(current.commands.values())
    return command


__all__ = ["COMPLETERS", "attach", "complete_lab_params", "complete_labs", "complete_lessons", "complete_presets",
           "complete_fit_devices", "complete_run_devices", "lab_param_items"]
