"""The live pane: this machine's peaks and 1-4 Hz traces of what it is doing right now.

The pane never samples anything itself. A `tutor.hardware.Sampler` (or a fake with the same
`samples()` method) fills a ring buffer from its own thread; the pane copies the buffer on a
timer, which costs a lock and a list copy, so the UI never waits on NVML or psutil.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.message import Message
from textual.containers import VerticalScroll
from textual.geometry import Size
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Static

from tutor.ui.host import tutor_app

from tutor.formatting import format_bytes, format_rate
from tutor.theory.units import GiB
from tutor.ui.widgets.charts import bar_text
from tutor.ui.widgets.device_header import device_label, device_title

if TYPE_CHECKING:
    from tutor.hardware.machine import Machine
    from tutor.hardware.nvidia import GpuInfo
    from tutor.hardware.sampler import GpuSample, Sample
    from tutor.labs.probe import ProbeResult
    from tutor.ui.services import SamplerLike

BARS = "▁▂▃▄▅▆▇█"
PEAK_DTYPES = ("fp32", "bf16", "fp16")


def spark_text(values: Sequence[float | None], low: float, high: float, width: int) -> str:
    """The last `width` values as block characters on a fixed scale low..high (a missing reading
    is a space), so 50 % CPU always looks the same height."""
    if width <= 0:
        return ""
    span = high - low if high > low else 1.0
    cells = []
    for value in list(values)[-width:]:
        if value is None:
            cells.append(" ")
            continue
        level = (min(max(value, low), high) - low) / span
        cells.append(BARS[min(int(level * len(BARS)), len(BARS) - 1)])
    return "".join(cells).rjust(width)


def spark_rows(values: Sequence[float | None], low: float, high: float, width: int, rows: int,
               mine: Sequence[float | None] | None = None) -> list[Text]:
    """A chart `rows` tall of the last `width` values on the fixed scale low..high, each column
    filled to its value in eighths of a row. With `mine` (this app's share of each value), the
    part of a column up to it is drawn in its own colour (cyan) under the others' (green)."""
    if width <= 0 or rows <= 0:
        return []
    span = high - low if high > low else 1.0
    blank: list[float | None] = [None] * width
    shown = (blank + list(values))[-width:]
    own = (blank + list(mine))[-width:] if mine is not None else blank

    def eighths(value: float | None) -> int:
        if value is None:
            return 0
        return round((min(max(value, low), high) - low) / span * rows * 8)

    levels, own_levels = [eighths(v) for v in shown], [eighths(v) for v in own]
    lines = []
    for row in range(rows - 1, -1, -1):  # top row first
        line = Text()
        run: list[str] = []
        run_style = "green"
        for level, own_level in zip(levels, own_levels):
            fill = min(max(level - row * 8, 0), 8)
            cell = BARS[fill - 1] if fill else " "
            style = "cyan" if mine is not None and own_level >= row * 8 + fill and fill else "green"
            if style != run_style and run:
                line.append("".join(run), style=run_style)
                run = []
            run_style = style
            run.append(cell)
        if run:
            # One span per run of a colour, not per cell: Textual converts every span of every
            # repainted trace at each sample, which cost tens of ms a chart on a loaded machine.
            line.append("".join(run), style=run_style)
        lines.append(line)
    return lines


def window_text(timestamps: Sequence[float], width: int) -> str:
    """The time the last `width` samples span, as 'last 30 s' / 'last 2 min'."""
    shown = list(timestamps)[-width:]
    if len(shown) < 2:
        return "just started"
    seconds = shown[-1] - shown[0]
    return f"last {seconds:.0f} s" if seconds < 120 else f"last {seconds / 60:.0f} min"


@dataclass(frozen=True)
class Series:
    """One trace: its label, readings, scale and the latest reading in words; `mine` is this
    app's part of each reading (its process and the worker it starts) where known."""

    label: str
    values: tuple[float | None, ...]
    low: float
    high: float
    reading: str
    scale: str = ""
    mine: tuple[float | None, ...] | None = None
    timestamps: tuple[float, ...] = ()


def host_series(samples: Sequence[Sample]) -> list[Series]:
    """CPU load (mean over logical cores, %) and RAM used, from Sampler samples, with this app's
    share of each where the sampler read it."""
    loads = [sum(s.cpu_percent) / len(s.cpu_percent) if s.cpu_percent else None for s in samples]
    used = [s.ram_used_bytes for s in samples]
    total = next((s.ram_total_bytes for s in reversed(samples) if s.ram_total_bytes), None)
    latest = samples[-1] if samples else None
    cores = len(latest.cpu_percent) if latest is not None and latest.cpu_percent else None
    app_cpu = [s.process_cpu_percent for s in samples]
    app_rss = [s.process_rss_bytes for s in samples]
    knows_app = any(value is not None for value in (*app_cpu, *app_rss))
    load_now = loads[-1] if loads else None
    load_text = "N/A" if load_now is None else f"{load_now:5.1f} %" + (f" of {cores} cores" if cores else "")
    if load_now is not None and app_cpu and app_cpu[-1] is not None:
        load_text += f", app {app_cpu[-1]:.0f} %"
    used_now = used[-1] if used else None
    ram_text = "N/A" if used_now is None else f"{used_now / GiB:.1f}" + (
        f" / {total / GiB:.1f} GiB" if total else " GiB")
    if used_now is not None and app_rss and app_rss[-1] is not None:
        ram_text += f", app {format_bytes(app_rss[-1])}"
    stamps = tuple(float(s.timestamp) for s in samples)
    return [
        Series("CPU load", tuple(loads), 0.0, 100.0, load_text, "0-100 %",
               tuple(app_cpu) if knows_app else None, stamps),
        Series("RAM used", tuple(None if u is None else float(u) for u in used), 0.0, float(total or 1), ram_text,
               f"0-{total / GiB:.0f} GiB" if total else "", 
               tuple(None if r is None else float(r) for r in app_rss) if knows_app else None, stamps),
    ]


def core_lines(sample: Sample | None, width: int, max_rows: int) -> Text:
    """This instant's load of every logical core: a labelled bar each where they fit in `max_rows`
    lines, else one block character per core (wrapped), so a 96-core machine still fits."""
    loads = list(sample.cpu_percent or ()) if sample is not None else []
    if not loads:
        return Text("per core: N/A", style="dim")
    text = Text("per core, now", style="bold")
    if len(loads) <= max_rows - 1:
        label_width = len(f"cpu {len(loads) - 1}")
        bar_width = max(width - label_width - 9, 4)
        for index, load in enumerate(loads):
            text.append(f"\n{f'cpu {index}':<{label_width}} ")
            text.append(bar_text(load / 100, bar_width), style="green")
            text.append(f" {load:5.1f} %")
        return text
    text.append(f" (one cell per core, of {len(loads)})", style="dim")
    text.append("\n")
    text.append("".join(BARS[min(int(load / 100 * len(BARS)), len(BARS) - 1)] for load in loads), style="green")
    return text


def gpu_series(samples: Sequence[Sample], gpu: GpuInfo) -> list[Series]:
    """Utilization, memory, SM clock, power and temperature of one GPU; N/A where NVML is silent."""
    def field(reading: Callable[[GpuSample], float | None]) -> list[float | None]:
        values: list[float | None] = []
        for sample in samples:
            match = next((g for g in sample.gpus if g.index == gpu.index and g.mig_index == gpu.mig_index), None)
            value = reading(match) if match is not None else None
            values.append(None if value is None else float(value))
        return values

    def last(values: list[float | None]) -> float | None:
        return values[-1] if values else None

    util, memory = field(lambda g: g.utilization_pct), field(lambda g: g.memory_used_bytes)
    clock, power, temp = field(lambda g: g.sm_clock_mhz), field(lambda g: g.power_w), field(lambda g: g.temperature_c)
    total, clock_max, power_limit = gpu.memory_total_bytes, gpu.sm_clock_max_mhz, gpu.power_limit_w

    def show(value: float | None, text: str) -> str:
        return "N/A" if value is None else text

    u, m, c, p, t = last(util), last(memory), last(clock), last(power), last(temp)
    memory_top = float(total or max([v or 0 for v in memory] + [1.0]))
    clock_top = float(clock_max or max([v or 0 for v in clock] + [1.0]))
    power_top = float(power_limit or max([v or 0 for v in power] + [1.0]))
    stamps = tuple(float(s.timestamp) for s in samples)
    return [
        Series("GPU util", tuple(util), 0.0, 100.0, show(u, f"{u or 0:5.1f} %"), "0-100 %", None, stamps),
        Series("GPU memory", tuple(memory), 0.0, memory_top,
               show(m, f"{(m or 0) / GiB:.1f}" + (f" / {total / GiB:.0f} GiB" if total else " GiB")),
               f"0-{memory_top / GiB:.0f} GiB", None, stamps),
        Series("SM clock", tuple(clock), 0.0, clock_top, show(c, f"{c or 0:.0f} MHz"),
               f"0-{clock_top:.0f} MHz", None, stamps),
        Series("Power", tuple(power), 0.0, power_top,
               show(p, f"{p or 0:.0f} W" + (f" / {power_limit:.0f} W" if power_limit else "")),
               f"0-{power_top:.0f} W", None, stamps),
        Series("Temperature", tuple(temp), 0.0, 100.0, show(t, f"{t or 0:.0f} °C"), "0-100 °C", None, stamps),
    ]


def shown_gpu(machine: Machine) -> GpuInfo | None:
    """The GPU the pane shows: the one torch calls cuda:0 (CUDA_VISIBLE_DEVICES and MIG respected),
    None on a machine without one, so the traces and the peaks describe the same device."""
    return machine.gpu_for("cuda:0") if machine.gpus else None


def measured_bandwidth(result: ProbeResult | None) -> tuple[str, float] | None:
    """(kernel, GB/s) of the fastest kernel in a bandwidth probe's result (metrics gbps_<op>), None
    for any other result or one that measured nothing."""
    if result is None or result.probe != "bandwidth":
        return None
    rates = [(key.removeprefix("gbps_"), float(value)) for key, value in result.metrics.items()
             if key.startswith("gbps_") and value]
    return max(rates, key=lambda item: item[1]) if rates else None


def peak_lines(machine: Machine, bandwidth_measured: tuple[str, float] | None = None) -> list[str]:
    """The theoretical peaks the measurements are read against, with N/A where none is known; a
    CPU's memory, which has no datasheet peak here, shows the bandwidth measured in this session."""
    device = "cuda:0" if shown_gpu(machine) is not None else "cpu"
    lines = []
    for dtype in PEAK_DTYPES:
        try:
            peak = machine.peak_tflops(device, dtype)
        except Exception:  # an odd machine description must not take the pane down
            peak = None
        lines.append(f"peak {dtype}: " + ("N/A" if peak is None else format_rate(peak, "TFLOP/s")))
    try:
        bandwidth = machine.peak_memory_gbps(device)
    except Exception:
        bandwidth = None
    if bandwidth is not None:
        lines.append(f"peak memory: {bandwidth:,.0f} GB/s")
    elif bandwidth_measured is not None:
        kernel, rate = bandwidth_measured
        lines.append(f"memory: {format_rate(rate, 'GB/s')} measured ({kernel}, best)")
    else:
        lines.append("peak memory: N/A (measure it: bandwidth)")
    return lines


def pane_device_line(machine: Machine) -> str:
    """The pane's device line: the GPU, or 'CPU only' with why in plain words (device_label), never
    NVML's raw error text (that stays in the tooltip and F1)."""
    if shown_gpu(machine) is not None:
        return device_title(machine)
    return device_label(machine)


class Trace(Widget):
    """One labelled trace: its latest reading, then a chart `chart_rows` tall with its scale and
    time window; at one row, a sparkline on the reading's line when wide enough, else below it."""

    DEFAULT_CSS = """
    Trace { height: auto; }
    """

    ONE_LINE_WIDTH = 60
    HEAD_WIDTH = 40

    series: reactive[Series | None] = reactive(None)
    """The trace shown; None before the first sample. A new reading repaints this trace only; the
    layout is redone only when the height changes (the first sample), not on every sample."""

    chart_rows: reactive[int] = reactive(1, layout=True)
    """How tall the chart is (the live pane shares its height out among its traces)."""

    def watch_series(self, old: Series | None, new: Series | None) -> None:
        if (old is None) != (new is None):
            self.refresh(layout=True)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        if self.series is None:
            return 1
        if self.chart_rows > 1:
            return 2 + self.chart_rows
        return 1 if width >= self.ONE_LINE_WIDTH else 2

    def render(self) -> Text:
        series = self.series
        if series is None:
            return Text("waiting for the first sample…", style="dim")
        width = max(self.size.width, 1)
        head = Text.assemble((series.label, "bold"), " ", series.reading)
        if self.chart_rows > 1:
            head.truncate(width, overflow="ellipsis")
            legend = Text(" · ".join(part for part in (series.scale, window_text(series.timestamps, width)) if part),
                          style="dim")
            if series.mine is not None:
                legend.append("  ")
                legend.append("█", style="cyan")
                legend.append(" app ", style="dim")
                legend.append("█", style="green")
                legend.append(" others", style="dim")
            legend.truncate(width, overflow="ellipsis")
            chart = spark_rows(series.values, series.low, series.high, width, self.chart_rows, series.mine)
            return Text("\n").join([head, legend, *chart])
        if width >= self.ONE_LINE_WIDTH:
            head.truncate(self.HEAD_WIDTH, overflow="ellipsis", pad=True)
            spark_width = width - self.HEAD_WIDTH - 1
            return Text.assemble(head, " ", (spark_text(series.values, series.low, series.high, spark_width), "green"))
        spark = Text(spark_text(series.values, series.low, series.high, width), style="green")
        head.truncate(width, overflow="ellipsis")
        return Text("\n").join([head, spark])


class CoreLoads(Widget):
    """Every logical core's load at the latest sample."""

    DEFAULT_CSS = """
    CoreLoads { height: auto; margin-top: 1; }
    """

    sample: reactive[Sample | None] = reactive(None)
    """The latest sample; a new one repaints, the layout follows only a change of core count."""
    max_rows: reactive[int] = reactive(9, layout=True)

    def watch_sample(self, old: Sample | None, new: Sample | None) -> None:
        def cores(sample: Sample | None) -> int:
            return len(sample.cpu_percent) if sample is not None and sample.cpu_percent else 0

        if cores(old) != cores(new):
            self.refresh(layout=True)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(core_lines(self.sample, width, self.max_rows).split("\n"))

    def render(self) -> Text:
        return core_lines(self.sample, max(self.size.width, 1), self.max_rows)


class LivePane(VerticalScroll):
    """The device, its peaks, and traces from the sampler, refreshed `1 / interval_s` times a second."""

    HELP = """\
## Live pane

What this machine is doing right now, sampled from a background thread (1 to 4 times a second):

- **CPU load** is the mean over all logical cores; **RAM used** is total minus available. Where
  known, the part used by this app (its own process and the measurement worker) is drawn in
  cyan under everybody else's (green); **per core** shows each core's load now.
- Each chart shows its **scale** (bottom to top) and the **time window** it covers.
- With an NVIDIA GPU: utilization, memory, SM clock, power and temperature from NVML.

The **peaks** are the theoretical figures that measurements are read against (datasheet for a
GPU, cores x FLOP/cycle x clock for a CPU). Run a measure block and watch the load rise.
"""

    DEFAULT_CSS = """
    LivePane {
        border: round $primary 50%;
        border-title-color: $text-primary;
        padding: 0 1;
    }
    LivePane #device { color: $text-muted; }
    LivePane #peaks { margin-bottom: 1; }
    LivePane .trace { margin-bottom: 1; }
    """

    can_focus = True

    def __init__(self, machine: Machine, sampler: SamplerLike, *, interval_s: float | None = None,
                 id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.machine = machine
        self.sampler = sampler
        self.interval_s = interval_s if interval_s is not None else sampler.interval_s
        self.border_title = "This machine, live"

    MAX_CHART_ROWS = 8

    def compose(self) -> ComposeResult:
        device = Static(pane_device_line(self.machine), id="device")
        device.tooltip = device_title(self.machine)
        yield device
        yield Static("\n".join(peak_lines(self.machine)), id="peaks")
        count = 5 if shown_gpu(self.machine) is not None else 2
        for index in range(count):
            yield Trace(id=f"trace-{index}", classes="trace")
        yield CoreLoads(id="cores")

    class Sampled(Message):
        """New samples, already turned into series by the pane's thread (only the newest matters)."""

        def __init__(self, samples: list[Sample], series: tuple[Series, ...]) -> None:
            super().__init__()
            self.samples, self.series = samples, series

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, LivePane.Sampled)

    def on_mount(self) -> None:
        self._stop = threading.Event()
        self._bandwidth: tuple[str, float] | None = None
        self.refresh_traces()
        # A plain daemon thread, not a Textual worker: it runs as long as the pane, and waiting for
        # the app's workers (tests, shutdown) must not wait for it.
        threading.Thread(target=self._sample_in_background, daemon=True, name="live-pane").start()

    def series_of(self, samples: list[Sample]) -> tuple[Series, ...]:
        gpu = shown_gpu(self.machine)
        return tuple(gpu_series(samples, gpu) if gpu is not None else host_series(samples))

    def _sample_in_background(self) -> None:
        """Copy the sampler's buffer and build the series off the event loop, every interval_s;
        post them only when a new sample came (the loop then only assigns and repaints)."""
        stop = self._stop
        last: tuple[int, float | None] | None = None
        while not stop.wait(self.interval_s):
            try:
                samples = list(self.sampler.samples())
                key = (len(samples), float(samples[-1].timestamp) if samples else None)
                if key == last:
                    continue
                last = key
                self.post_message(self.Sampled(samples, self.series_of(samples)))
            except Exception:  # a sampler or machine gone odd: the pane keeps its last picture
                continue

    @on(Sampled)
    def _sampled(self, message: Sampled) -> None:
        message.stop()
        self.show_samples(message.samples, message.series)

    def on_unmount(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()

    def on_resize(self) -> None:
        self.call_after_refresh(self.share_height)

    def share_height(self) -> None:
        """Give the traces the pane's height: charts several rows tall on a tall pane, one row when
        the pane is stacked under the lesson (narrow terminals)."""
        traces = list(self.query(Trace))
        if not traces or not self.is_mounted:
            return
        cores = self.query_one("#cores", CoreLoads)
        if self.screen.has_class("-narrow"):
            cores.display = False
            for trace in traces:
                trace.chart_rows = 1
            self.border_subtitle = self.window_subtitle(self.sampler.samples())
            return
        height = self.scrollable_content_region.height
        fixed = sum(self.query_one(name).outer_size.height for name in ("#device", "#peaks"))
        cores.display = True
        cores.max_rows = max(min(height // 4, 9), 2)
        cores_height = len(core_lines(cores.sample, max(self.scrollable_content_region.width, 1),
                                      cores.max_rows).split("\n")) + 1
        left = height - fixed - cores_height - len(traces)  # a blank line under each trace
        rows = min(max(left // len(traces) - 2, 1), self.MAX_CHART_ROWS)
        for trace in traces:
            trace.chart_rows = rows
        self.border_subtitle = self.window_subtitle(self.sampler.samples())

    def window_subtitle(self, samples: Sequence[Sample]) -> str:
        """The time window of one-row sparklines (stacked pane), whose lines have no room to say it;
        tall charts say it under their reading."""
        traces = list(self.query(Trace))
        if not samples or not traces or traces[0].chart_rows > 1:
            return ""
        width = traces[0].size.width
        spark_width = width - Trace.HEAD_WIDTH - 1 if width >= Trace.ONE_LINE_WIDTH else width
        return window_text([s.timestamp for s in samples], max(spark_width, 2))

    def refresh_traces(self) -> None:
        """Copy the sampler's buffer into the traces now (cheap: never waits on a device)."""
        samples = list(self.sampler.samples())
        self.show_samples(samples, self.series_of(samples))

    def session_bandwidth(self) -> tuple[str, float] | None:
        """The newest bandwidth measured in this session (the last result, else the kept ones)."""
        app = tutor_app(self.app)
        if app is None:  # another host app keeps no results
            return None
        found = measured_bandwidth(app.last_result)
        if found is None:
            from tutor.ui.widgets.measure import result_store  # the kept results live with the measure widget

            for kept in reversed(result_store(self.app).latest()):
                found = measured_bandwidth(kept.result)
                if found is not None:
                    break
        return found

    def show_samples(self, samples: list[Sample], series: tuple[Series, ...]) -> None:
        """Assign what changed: each trace's series, the per-core sample, the window, the peaks once
        a bandwidth measurement gives the memory a figure."""
        try:
            for index, item in enumerate(series):
                self.query_one(f"#trace-{index}", Trace).series = item if samples else None
            cores = self.query_one("#cores", CoreLoads)
            first_sample = cores.sample is None and bool(samples)
            cores.sample = samples[-1] if samples else None
            if first_sample:  # the per-core list now has its height: share the rest again
                self.call_after_refresh(self.share_height)
            subtitle = self.window_subtitle(samples)
            if subtitle != self.border_subtitle:
                self.border_subtitle = subtitle
            bandwidth = self.session_bandwidth() or self._bandwidth
            if bandwidth != self._bandwidth:
                self._bandwidth = bandwidth
                self.query_one("#peaks", Static).update("\n".join(peak_lines(self.machine, bandwidth)))
        except Exception:  # the pane is being torn down
            return
