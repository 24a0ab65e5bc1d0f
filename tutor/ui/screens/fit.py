"""The Fit screen: `tensor-tutor fit` as a form. Pick a model and a layout; the memory per device,
term by term, follows as you type, against this machine's memory, with what would make it fit."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer

from tutor.ui.widgets.calc import CalcBlock
from tutor.ui.widgets.device_header import DeviceHeader, device_title


@dataclass(frozen=True)
class FitForm:
    """The Fit screen's calculator, shaped like a lesson's Calc block."""

    model: str = "llama-3.1-8b"
    mode: str = "inference"
    kind: str = "fit"
    fields: tuple[str, ...] = ("model", "mode", "dtype", "recipe", "batch", "seq", "dp", "tp", "pp", "zero",
                               "recompute", "attention", "impl")
    values: dict[str, Any] = field(default_factory=dict)
    id: str = "fit"
    line: int = 0
    directive: ClassVar[str] = "calc"


class FitScreen(Screen):
    """Does a model fit this machine for inference or training?"""

    CSS_PATH = "fit.tcss"
    HELP = """\
## Fit check

The same computation as `tensor-tutor fit MODEL`: weights, gradients, optimizer states,
activations and KV cache per device, each with its formula, against this machine's memory
(a GPU's total memory, or the RAM available now on a CPU-only machine).

- **Tab** moves between fields; the result follows as you type.
- *mode* train adds gradients and optimizer states; *zero*, *dp*, *tp*, *pp* shard them.
- *recompute* (none, selective, full) trades a second forward pass for activation memory;
  *attention* eager keeps the s x s scores, sdpa (transformers' default) and flash do not.
- *impl* is the code the activations assume: `hf`, transformers modules as written (fp32 norm
  copies, unfused SwiGLU, an fp32 loss head), or `fused`, Megatron-style kernels (Korthikanti et
  al. 2022). Switch it to see what fusion buys.
- Training shows two columns: each category at its own maximum over the step, and what is alive
  at the **peak**, the one moment that must fit (early in backward, before most gradients exist,
  or inside the optimizer step). The total is that peak plus the overhead.
- Escape goes home.
"""

    BINDINGS = [Binding("escape", "app.home", "Home")]

    def __init__(self, services: Any, model: str | None = None, mode: str | None = None) -> None:
        super().__init__()
        self.services = services
        self.form = FitForm(model=model or "llama-3.1-8b", values={"mode": mode or "inference"})

    def compose(self) -> ComposeResult:
        yield DeviceHeader(device_title(self.services.machine), "Fit check")
        with VerticalScroll(id="fit"):
            yield CalcBlock(self.form, lesson_id="", services=self.services, id="fit-form")
        yield Footer()

    def on_mount(self) -> None:
        form = self.query_one("#fit-form", CalcBlock)
        form.border_title = "Does it fit? (memory per device)"
        form.focus()
