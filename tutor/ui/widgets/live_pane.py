"""The live pane: this machine's peaks and 1-4 Hz traces of what it is doing right now.

The pane never samples anything itself. A `tutor.hardware.Sampler` (or a fake with the same
`samples()` method) fills a ring buffer from its own thread; the pane copies the buffer on a
timer, which costs a lock and a list copy, so the UI never waits on NVML or psutil.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Static

from tutor.theory.units import GiB
from tutor.ui.widgets.device_header import device_title

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


@dataclass(frozen=True)
class Series:
    """One trace: its label, readings, scale and the latest reading in words."""

    label: str
    values: tuple[float | None, ...]
    low: float
    high: float
    reading: str


def host_series(samples: Sequence[Any]) -> list[Series]:
    """CPU load (mean over logical cores, %) and RAM used, from Sampler samples."""
    loads = [sum(s.cpu_percent) / len(s.cpu_percent) if s.cpu_percent else None for s in samples]
    used = [s.ram_used_bytes for s in samples]
    total = next((s.ram_total_bytes for s in reversed(samples) if s.ram_total_bytes), None)
    latest = samples[-1] if samples else None
    cores = len(latest.cpu_percent) if latest is not None and latest.cpu_percent else None
    load_now = loads[-1] if loads else None
    load_text = "N/A" if load_now is None else f"{load_now:5.1f} %" + (f" of {cores} cores" if cores else "")
    used_now = used[-1] if used else None
    ram_text = "N/A" if used_now is None else f"{used_now / GiB:.1f}" + (
        f" / {total / GiB:.1f} GiB" if total else " GiB")
    return [
        Series("CPU load", tuple(loads), 0.0, 100.0, load_text),
        Series("RAM used", tuple(None if u is None else float(u) for u in used), 0.0, float(total or 1), ram_text),
    ]


def gpu_series(samples: Sequence[Any], gpu: Any) -> list[Series]:
    """Utilization, memory, SM clock, power and temperature of one GPU; N/A where NVML is silent."""
    def field(name: str) -> list[float | None]:
        values: list[float | None] = []
        mig = getattr(gpu, "mig_index", None)
        for sample in samples:
            match = next((g for g in sample.gpus
                          if g.index == gpu.index and getattr(g, "mig_index", None) == mig), None)
            value = getattr(match, name, None) if match is not None else None
            values.append(None if value is None else float(value))
        return values

    def last(values: list[float | None]) -> float | None:
        return values[-1] if values else None

    util, memory = field("utilization_pct"), field("memory_used_bytes")
    clock, power, temp = field("sm_clock_mhz"), field("power_w"), field("temperature_c")
    total = getattr(gpu, "memory_total_bytes", None)
    clock_max = getattr(gpu, "sm_clock_max_mhz", None)
    power_limit = getattr(gpu, "power_limit_w", None)

    def show(value: float | None, text: str) -> str:
        return "N/A" if value is None else text

    u, m, c, p, t = last(util), last(memory), last(clock), last(power), last(temp)
    return [
        Series("GPU util", tuple(util), 0.0, 100.0, show(u, f"{u or 0:5.1f} %")),
        Series("GPU memory", tuple(memory), 0.0, float(total or max([v or 0 for v in memory] + [1.0])),
               show(m, f"{(m or 0) / GiB:.1f}" + (f" / {total / GiB:.0f} GiB" if total else " GiB"))),
        Series("SM clock", tuple(clock), 0.0, float(clock_max or max([v or 0 for v in clock] + [1.0])),
               show(c, f"{c or 0:.0f} MHz")),
        Series("Power", tuple(power), 0.0, float(power_limit or max([v or 0 for v in power] + [1.0])),
               show(p, f"{p or 0:.0f} W" + (f" / {power_limit:.0f} W" if power_limit else ""))),
        Series("Temperature", tuple(temp), 0.0, 100.0, show(t, f"{t or 0:.0f} °C")),
    ]


def shown_gpu(machine: Any) -> Any:
    """The GPU the pane shows: the one torch calls cuda:0 (CUDA_VISIBLE_DEVICES and MIG respected),
    None on a machine without one, so the traces and the peaks describe the same device."""
    gpus = getattr(machine, "gpus", None)
    if not gpus:
        return None
    gpu_for = getattr(machine, "gpu_for", None)
    return gpu_for("cuda:0") if gpu_for is not None else gpus[0]


def peak_lines(machine: Any) -> list[str]:
    """The theoretical peaks the measurements are read against, with N/A where none is known."""
    device = "cuda:0" if shown_gpu(machine) is not None else "cpu"
    lines = []
    for dtype in PEAK_DTYPES:
        try:
            peak = machine.peak_tflops(device, dtype)
        except Exception:  # an odd machine description must not take the pane down
            peak = None
        lines.append(f"peak {dtype}: " + ("N/A" if peak is None else f"{peak:.3g} TFLOP/s"))
    try:
        bandwidth = machine.peak_memory_gbps(device)
    except Exception:
        bandwidth = None
    lines.append("peak memory: " + ("N/A (measure it: bandwidth)" if bandwidth is None else f"{bandwidth:,.0f} GB/s"))
    return lines


class Trace(Widget):
    """One labelled sparkline with its latest reading: one line when wide enough, else two."""

    DEFAULT_CSS = """
    Trace { height: auto; }
    """

    ONE_LINE_WIDTH = 60
    HEAD_WIDTH = 30

    series: reactive[Series | None] = reactive(None, layout=True)
    """The trace shown; None before the first sample."""

    def get_content_height(self, container: Any, viewport: Any, width: int) -> int:
        return 1 if width >= self.ONE_LINE_WIDTH or self.series is None else 2

    def render(self) -> Text:
        series = self.series
        if series is None:
            return Text("waiting for the first sample…", style="dim")
        width = max(self.size.width, 1)
        head = Text.assemble((series.label, "bold"), " ", series.reading)
        if width >= self.ONE_LINE_WIDTH:
            head.truncate(self.HEAD_WIDTH, overflow="ellipsis", pad=True)
            spark_width = width - self.HEAD_WIDTH - 1
            return Text.assemble(head, " ", (spark_text(series.values, series.low, series.high, spark_width), "green"))
        spark = Text(spark_text(series.values, series.low, series.high, width), style="green")
        return Text("\n").join([head, spark])


class LivePane(VerticalScroll):
    """The device, its peaks, and traces from the sampler, refreshed `1 / interval_s` times a second."""

    HELP = """\
## Live pane

What this machine is doing right now, sampled from a background thread (1 to 4 times a second):

- **CPU load** is the mean over all logical cores; **RAM used** is total minus available.
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
    """

    can_focus = True

    def __init__(self, machine: Any, sampler: Any, *, interval_s: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.machine = machine
        self.sampler = sampler
        self.interval_s = interval_s if interval_s is not None else getattr(sampler, "interval_s", 0.5)
        self.border_title = "This machine, live"

    def compose(self) -> ComposeResult:
        yield Static(device_title(self.machine), id="device")
        yield Static("\n".join(peak_lines(self.machine)), id="peaks")
        count = 5 if shown_gpu(self.machine) is not None else 2
        for index in range(count):
            yield Trace(id=f"trace-{index}")

    def on_mount(self) -> None:
        self.refresh_traces()
        self.set_interval(self.interval_s, self.refresh_traces)

    def refresh_traces(self) -> None:
        """Copy the sampler's buffer into the traces (cheap: never waits on a device)."""
        samples = self.sampler.samples()
        gpu = shown_gpu(self.machine)
        series = gpu_series(samples, gpu) if gpu is not None else host_series(samples)
        for index, item in enumerate(series):
            try:
                self.query_one(f"#trace-{index}", Trace).series = item if samples else None
            except Exception:  # the pane is being torn down
                return
