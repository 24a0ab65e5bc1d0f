"""The top line of every screen: the app's name, where the learner is, and the detected device."""

from __future__ import annotations

import re
from typing import Any

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget


def device_title(machine: Any) -> str:
    """One line naming the device measurements run on: torch's cuda:0 (and how many more GPUs), or
    'CPU only (<why no GPU>)' with the CPU's model."""
    gpus = list(getattr(machine, "gpus", []) or [])
    # The GPU torch calls cuda:0 (CUDA_VISIBLE_DEVICES renumbers NVML's list), as the live pane shows it.
    gpu_for = getattr(machine, "gpu_for", None)
    first = (gpu_for("cuda:0") if gpu_for else None) or (gpus[0] if gpus else None)
    if first is not None:
        more = f" (+{len(gpus) - 1} more)" if len(gpus) > 1 else ""
        memory = getattr(first, "memory_total_bytes", None)
        size = f", {memory / 2**30:.0f} GiB" if memory else ""
        index = getattr(first, "index", 0)
        return f"GPU {index}: {first.name}{size}{more}"
    nvml = getattr(machine, "nvml", None)
    reason = getattr(nvml, "reason", None) or "no NVIDIA GPU found"
    # "no NVIDIA driver found (NVML: Shared Library Not Found)" -> one level of brackets
    reason = re.sub(r"^(.*?) \(NVML: (.*)\)$", r"\1: \2", reason)
    cpu = getattr(machine, "cpu", None)
    model = getattr(cpu, "model_name", None) or "unknown CPU"
    return f"CPU only ({reason}) · {model}"


class DeviceHeader(Widget):
    """A one-line header: 'tensor-tutor', the current place (screen or lesson), the device."""

    DEFAULT_CSS = """
    DeviceHeader {
        dock: top;
        height: 1;
        background: $panel;
        color: $foreground;
    }
    """

    place = reactive("", layout=False)
    """Where the learner is: 'Home', a lesson title, 'Bench', 'Fit'."""

    device = reactive("", layout=False)
    """The device line from `device_title`."""

    def __init__(self, device: str, place: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.device = device
        self.place = place

    def render(self) -> Text:
        width = self.size.width
        left = Text.assemble(("tensor-tutor", "bold"), ("  " + self.place if self.place else ""))
        right = Text(self.device, style="italic")
        space = width - left.cell_len - right.cell_len - 2
        if space < 1:
            # Narrow terminals: the device wins over the place, then is cut with an ellipsis.
            left = Text("tensor-tutor", style="bold")
            space = width - left.cell_len - right.cell_len - 2
            if space < 1:
                right.truncate(max(width - left.cell_len - 3, 1), overflow="ellipsis")
                space = 1
        return Text.assemble(" ", left, " " * space, right, " ")
