"""The Fit screen: `tensor-tutor fit` as a form. Pick a model and a layout; the memory per device,
term by term, follows as you type, against this machine's memory, with what would make it fit."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen

from tutor.ui.widgets.calc import DEFAULT_FIELDS, CalcBlock
from tutor.ui.widgets.device_header import DeviceHeader, device_label, device_title
from tutor.ui.widgets.footer import TutorFooter

if TYPE_CHECKING:
    from tutor.export import FitValues
    from tutor.ui.services import Services


@dataclass(frozen=True)
class FitForm:
    """The Fit screen's calculator, shaped like a lesson's Calc block."""

    model: str = "llama-3.1-8b"
    mode: str = "inference"
    kind: str = "fit"
    fields: tuple[str, ...] = DEFAULT_FIELDS["fit"]  # every `tensor-tutor fit` option a learner sets
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
- *device* is the card to fit on: `this` (this machine: its GPU's free memory, else the RAM
  available now), a card by name (`h100`, `h200`, `a100-40gb`, `rtx-4090`, `l4`, `mi300x`: Right
  completes a name; `tensor-tutor models --devices` lists them), a size (`24GiB`, `80GB`) or `cpu`.
- *seq* takes `4096` or `128k` (binary k: 128k = 131,072 tokens, Llama-3.1's context).
- *mode* train adds gradients and optimizer states (*recipe*, *optimizer*); *zero*, *dp*, *tp*,
  *pp*, *ep* shard them; GPUs = dp x tp x pp. *sp* (sequence parallelism) splits the activations
  tensor parallelism leaves whole.
- *recompute* (none, selective, full) trades a second forward pass for activation memory;
  *attention* eager keeps the s x s scores, sdpa (transformers' default) and flash do not.
- *impl* is the code the activations assume: `hf`, transformers modules as written (fp32 norm
  copies, unfused SwiGLU, an fp32 loss head), or `fused`, Megatron-style kernels (Korthikanti et
  al. 2022). Switch it to see what fusion buys.
- Training shows two columns: each category at its own maximum over the step, and what is alive
  at the **peak**, the one moment that must fit (early in backward, before most gradients exist,
  or inside the optimizer step). The total is that peak plus the overhead.
- When it does not fit, the screen names the fields to change and to what.
- Ctrl+P, *Export*: this report as JSON (the same as `tensor-tutor fit --json`), CSV or Markdown.
- Escape goes home.
"""

    BINDINGS = [Binding("escape", "app.home", "Home")]

    def __init__(self, services: Services, model: str | None = None, mode: str | None = None) -> None:
        super().__init__()
        self.services = services
        self.form = FitForm(model=model or "llama-3.1-8b", values={"mode": mode or "inference"})

    def export_result(self) -> FitValues:
        """What Export saves from this screen: the form's values (tutor.export turns them into a fit report)."""
        from tutor.export import FitValues

        return FitValues(dict(self.query_one("#fit-form", CalcBlock).values), self.services.machine)

    def compose(self) -> ComposeResult:
        yield DeviceHeader(device_title(self.services.machine), "Fit check", label=device_label(self.services.machine))
        with VerticalScroll(id="fit"):
            yield CalcBlock(self.form, lesson_id="", services=self.services, id="fit-form")
        yield TutorFooter()

    def on_mount(self) -> None:
        form = self.query_one("#fit-form", CalcBlock)
        form.border_title = "Does it fit? (memory per device)"
        form.focus()
