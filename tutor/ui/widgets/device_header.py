"""The top line of every screen: the app's name, where the learner is, and the detected device."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from tutor.ui.host import tutor_app

if TYPE_CHECKING:
    from tutor.hardware.machine import Machine
    from tutor.worker.client import WorkerState


def device_title(machine: Machine) -> str:
    """One line naming the device measurements run on: torch's cuda:0 (and how many more GPUs), or
    'CPU only (<why no GPU>)' with the CPU's model."""
    gpus = machine.gpus
    # The GPU torch calls cuda:0 (CUDA_VISIBLE_DEVICES renumbers NVML's list), as the live pane shows it.
    first = machine.gpu_for("cuda:0") or (gpus[0] if gpus else None)
    if first is not None:
        more = f" (+{len(gpus) - 1} more)" if len(gpus) > 1 else ""
        memory = first.memory_total_bytes
        size = f", {memory / 2**30:.0f} GiB" if memory else ""
        return f"GPU {first.index}: {first.name}{size}{more}"
    reason = machine.nvml.reason or "no NVIDIA GPU found"
    # "no NVIDIA driver found (NVML: Shared Library Not Found)" -> one level of brackets
    reason = re.sub(r"^(.*?) \(NVML: (.*)\)$", r"\1: \2", reason)
    model = machine.cpu.model_name or "unknown CPU"
    return f"CPU only ({reason}) · {model}"


def device_label(machine: Machine) -> str:
    """The header's short form of `device_title`: the GPU as is, else why there is none in two or
    three words ('no NVIDIA GPU', 'NVML unavailable'); the full reason stays in the live pane and F1."""
    if machine.gpus:
        return device_title(machine)
    reason = machine.nvml.reason or ""
    no_gpu = machine.nvml.available or not reason or reason.startswith("no NVIDIA driver")
    model = machine.cpu.model_name or "unknown CPU"
    return f"CPU only · {'no NVIDIA GPU' if no_gpu else 'NVML unavailable'} · {model}"


class DeviceHeader(Widget):
    """A one-line header: 'tensor-tutor', the current place (screen or lesson), the device.

    The place always shows in full: the device is shortened first (`label`, from `device_label`),
    then cut with an ellipsis; the full device line is the header's tooltip."""

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

    worker = reactive("", layout=False)
    """The measurement process's state in a few words (WorkerState.short): 'loading torch…',
    'measuring…'; '' when the app has no measurement process."""

    def __init__(self, device: str, place: str = "", *, label: str | None = None, id: str | None = None) -> None:
        super().__init__(id=id)
        self.device = device
        self.label = label or device
        self.place = place
        self.tooltip = device

    def show_device(self, device: str, label: str | None = None) -> None:
        """Show a new device line (the machine detected after the first paint)."""
        self.label = label or device
        self.tooltip = device
        self.device = device
        self.refresh()

    def on_mount(self) -> None:
        app = tutor_app(self.app)
        if app is not None:  # another host app has no measurement process
            self.watch(self.app, "worker_state", self._worker_state_changed)

    def _worker_state_changed(self, state: WorkerState) -> None:
        self.worker = state.short

    def render(self) -> Text:
        return header_line(self.place, self.label, self.size.width, self.worker)


def header_line(place: str, device: str, width: int, worker: str = "") -> Text:
    """' tensor-tutor  <place>  · <worker>   <device> ' in `width` cells: the place always whole (it
    is where the learner is), then the measurement process's state, then the device, cut with an
    ellipsis or left out when there is no room."""
    left = Text.assemble(("tensor-tutor", "bold"), ("  " + place if place else ""))
    if left.cell_len + 2 > width:  # so narrow that the place alone fills it: the place wins
        left = Text(place or "tensor-tutor", style="bold")
        left.truncate(max(width - 2, 1), overflow="ellipsis")
        return Text.assemble(" ", left, " ")
    if worker and left.cell_len + len(worker) + 5 <= width:
        left.append("  · ", style="dim")
        left.append(worker, style="bold")
    right = Text(device, style="italic")
    room = width - left.cell_len - 4
    if right.cell_len > room:
        if room < 8:  # no room for a device name that still reads
            return Text.assemble(" ", left, " ")
        right.truncate(room, overflow="ellipsis")
    space = width - left.cell_len - right.cell_len - 2
    return Text.assemble(" ", left, " " * space, right, " ")
