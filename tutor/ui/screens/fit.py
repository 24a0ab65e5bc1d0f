"""The Fit screen: `tensor-tutor fit` as a form. Pick a model and a layout; the memory per device,
term by term, follows as you type, against this machine's memory, with what would make it fit; beside
it the time, as `tensor-tutor time` answers it (step by phase, tokens/s, MFU, the ceilings' sources),
and the memory alive over the training step or the prefill (`fit --timeline`), worked out in a thread."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Static
from textual.worker import get_current_worker

from tutor.calculators import FitTime, fit_time
from tutor.lessons.model import Calc
from tutor.ui.widgets.calc import DEFAULT_FIELDS, CalcBlock
from tutor.ui.widgets.device_header import DeviceHeader, device_label, device_title
from tutor.ui.widgets.time_panel import TimePanel, peak_text
from tutor.ui.widgets.footer import TutorFooter

if TYPE_CHECKING:
    from tutor.export import FitValues
    from tutor.answers.pictures import Chart
    from tutor.ui.services import Services


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
- **How long?** under the memory: the same answer as `tensor-tutor time MODEL` with the same fields:
  a training step by phase, tokens per second, MFU against the datasheet peak and against the measured
  matmul maximum, and where each ceiling came from (this machine's latest `bench` run, or a card's
  datasheet times a published achieved fraction). On this machine it needs a bench run (Bench, r).
- Under it the **memory alive over the step** (`fit --timeline`): a training step, or for inference the
  prefill, the peak marked with its phase; `t` on the picture leaves only its table.
- **Ctrl+S** saves the picture as SVG (its data as CSV and JSON beside it) under the data dir's
  exports folder and says where. Each file names the model, mode, dtype (and recipe), device, date
  (UTC) and tensor-tutor version; a figure's column ends with its unit (`memory_alive_gib`).
- Ctrl+P, *Export*: this report as JSON (the same as `tensor-tutor fit --json`), CSV or Markdown.
- Escape goes home.
"""

    BINDINGS = [Binding("escape", "app.home", "Home"), Binding("ctrl+s", "save_pictures", "Save SVG")]

    def __init__(self, services: Services, model: str | None = None, mode: str | None = None) -> None:
        super().__init__()
        self.services = services
        # The Fit screen's form is the "fit" calculator, the block a lesson's calc directive makes.
        self.form = Calc(kind="fit", model=model or "llama-3.1-8b", fields=DEFAULT_FIELDS["fit"],
                         values={"mode": mode or "inference"}, line=0, id="fit")
        self.asked = 0
        """How many times the form asked for the time; the answer shown is for `answered`."""
        self.answered = 0
        self.fit_time: FitTime | None = None
        """The time and timeline shown now (None: none yet, or the form has an error)."""

    @property
    def time_settled(self) -> bool:
        """The time shown answers the form as it is now (no worker still out)."""
        return self.asked > 0 and self.answered == self.asked

    def export_result(self) -> FitValues:
        """What Export saves from this screen: the form's values (tutor.export turns them into a fit report)."""
        from tutor.export import FitValues

        return FitValues(dict(self.query_one("#fit-form", CalcBlock).values), self.services.machine)

    def pictures(self) -> tuple[str, list[Chart]]:
        """What Ctrl+S saves: the memory timeline on screen (none while the form has no answer)."""
        from tutor.ui.widgets.plot import ChartView

        chart = self.query_one("#timeline", ChartView).chart
        return "fit-timeline", [chart] if chart is not None else []

    def action_save_pictures(self) -> None:
        from tutor.ui.commands import save_pictures

        save_pictures(self.app)

    def compose(self) -> ComposeResult:
        yield DeviceHeader(device_title(self.services.machine), "Fit check", label=device_label(self.services.machine))
        with VerticalScroll(id="fit"):
            yield CalcBlock(self.form, lesson_id="", services=self.services, id="fit-form")
            yield TimePanel(id="fit-time")
            yield Static(id="fit-peak")
            # textual-plot brings numpy: loaded when the Fit screen is built, not when the app starts.
            from tutor.ui.widgets.plot import ChartView

            yield ChartView(id="timeline")
        yield TutorFooter()

    def on_mount(self) -> None:
        form = self.query_one("#fit-form", CalcBlock)
        form.border_title = "Does it fit? (memory per device)"
        self.query_one("#fit-time", TimePanel).border_title = "How long? (tensor-tutor time)"
        form.focus()

    @on(CalcBlock.Computed, "#fit-form")
    def _form_computed(self, event: CalcBlock.Computed) -> None:
        self.asked += 1
        if event.error is not None:  # the form says what is wrong; no time for a question that makes no sense
            self.show_time(self.asked, None, "time: fix the field above first")
            return
        self.work_out_time(event.values, self.asked)

    @work(thread=True, exclusive=True, group="fit-time", exit_on_error=False, description="Fit screen's time")
    def work_out_time(self, values: dict[str, Any], asked: int) -> None:
        """The time and the timeline (tutor.calculators.fit_time: a tenth of a second for a large model on two
        cores, too long for the event loop), shown unless a newer question came in meanwhile."""
        from tutor.errors import UserError

        try:
            answer, problem = fit_time(values, self.services.machine), ""
        except (UserError, ValueError) as error:  # the memory answer above says it too
            answer, problem = None, f"time: {error}"
        if not get_current_worker().is_cancelled:
            self.app.call_from_thread(self.show_time, asked, answer, problem)

    def show_time(self, asked: int, answer: FitTime | None, problem: str = "") -> None:
        """Show the time panel, the peak and the timeline picture for question number `asked`."""
        if asked != self.asked:
            return  # an older question's answer: the newer one is on its way
        from tutor.answers.pictures import timeline_chart
        from tutor.ui.widgets.plot import ChartView

        self.fit_time = answer
        self.query_one("#fit-time", TimePanel).update_time(answer, problem)
        self.query_one("#fit-peak", Static).update(peak_text(answer) if answer is not None else "")
        view = self.query_one("#timeline", ChartView)
        view.chart = (timeline_chart(list(answer.timeline), peak_mark=True)
                      if answer is not None and answer.timeline else None)
        self.answered = asked
