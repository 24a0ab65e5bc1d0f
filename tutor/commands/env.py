"""`tensor-tutor env`: what this machine is, and the theoretical peaks its measurements are read against.

Fast and torch-free: CPU from /proc and psutil, GPUs from NVML. `--torch` opts in to torch's view
of the devices (CUDA/ROCm/MPS), which costs the seconds of importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from tutor.commands.safe_text import as_text, markup_safe
from tutor.hardware import Machine, detect_machine
from tutor.hardware.machine import CPU_MEMORY_PEAK_NOTE, DTYPES, UNKNOWN_GPU
from tutor.hardware.nvidia import GpuInfo
from tutor.hardware.torch_devices import TorchView
from tutor.formatting import format_bytes, format_number, format_rate
from tutor.commands.json_output import echo_json

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.panel import Panel


def _na(value: object, unit: str = "", reason: str | None = None) -> str:
    if value is None:
        return reason or "N/A"
    return f"{value}{unit}"


def _rate(value: float | None, unit: str = "FLOP/s") -> str:
    return "-" if value is None else format_rate(value, unit)


def _torch_json(view: TorchView) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(view)


def _render(machine: Machine, torch_view: TorchView | None) -> None:
    from rich.console import Console, Group
    from rich.panel import Panel
    from rich.table import Table

    console = Console()
    cpu = machine.cpu
    info = Table.grid(padding=(0, 2))
    info.add_column(style="bold")
    info.add_column()
    info.add_row("model", as_text(f"{cpu.model_name} ({cpu.vendor or 'unknown vendor'}, {cpu.arch})"))
    info.add_row("cores", f"{_na(cpu.physical_cores)} physical, {_na(cpu.logical_cores)} logical")
    info.add_row("ISA", as_text(" ".join(cpu.flags) or "unknown"))
    caches = ", ".join(f"L{c.level}{'d' if c.kind == 'Data' else 'i' if c.kind == 'Instruction' else ''} "
                       f"{format_bytes(c.size_bytes)}" for c in cpu.caches)
    info.add_row("caches", caches or "unknown")
    current = f"{cpu.current_clock.hz / 1e9:.2f} GHz" if cpu.current_clock.hz else "unknown"
    info.add_row("clock now", f"{current} ({cpu.current_clock.source})")
    assumed = f"{cpu.peak_clock.hz / 1e9:.2f} GHz" if cpu.peak_clock.hz else "unknown"
    info.add_row("clock for peaks", f"{assumed} ({cpu.peak_clock.source})")
    peaks = Table(title="theoretical peak (dense) = physical cores x FLOP/cycle x clock", title_justify="left")
    peaks.add_column("dtype")
    peaks.add_column("peak", justify="right")
    peaks.add_column("per core per cycle", justify="right")
    peaks.add_column("unit / why not")
    for dtype in DTYPES:
        peak = cpu.peaks[dtype]
        per_cycle = format_number(peak.flops_per_cycle_per_core) if peak.flops_per_cycle_per_core else "-"
        unit = "OP/s" if dtype == "int8" else "FLOP/s"
        detail = peak.unit or ""
        if peak.note:
            detail = f"{detail}: {peak.note}" if detail else peak.note
        peaks.add_row(dtype, _rate(peak.flops or None, unit), per_cycle, detail)
    notes = [f"[yellow]note:[/] {markup_safe(note)}" for note in cpu.notes]
    console.print(Panel(Group(info, peaks, *notes), title="CPU", title_align="left"))

    ram = Table.grid(padding=(0, 2))
    ram.add_column(style="bold")
    ram.add_column()
    ram.add_row("total", format_bytes(cpu.ram_total_bytes) if cpu.ram_total_bytes else "unknown")
    ram.add_row("available", format_bytes(cpu.ram_available_bytes) if cpu.ram_available_bytes else "unknown")
    ram.add_row("peak bandwidth", CPU_MEMORY_PEAK_NOTE)
    console.print(Panel(ram, title="RAM", title_align="left"))

    nvml = machine.nvml
    if not machine.gpus:
        console.print(Panel(f"{markup_safe(nvml.reason or 'no NVIDIA GPU found')}\nThe CPU is measured alone; "
                            "GPU lessons show their theory without a measurement.",
                            title="NVIDIA GPUs", title_align="left"))
    for gpu in machine.gpus:
        console.print(_gpu_panel(machine, gpu))
    if machine.gpus:
        console.print(markup_safe(f"driver {nvml.driver_version or 'N/A'}, "
                                  f"CUDA driver API {nvml.cuda_driver_version or 'N/A'}"))
    if torch_view is not None:
        console.print(_torch_panel(torch_view))
        from tutor.hardware.torch_devices import accelerator_agreement

        disagreement = accelerator_agreement(len(machine.gpus), nvml.reason, torch_view)
        if disagreement:
            console.print(f"[yellow]{disagreement}[/]")
    versions = ", ".join(f"{k} {v}" for k, v in machine.versions.items() if v)
    console.print(f"[dim]{markup_safe(versions)}[/]")


def _gpu_panel(machine: Machine, gpu: GpuInfo) -> Panel:
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table

    na = gpu.unavailable

    def field(name: str, value: object, unit: str = "") -> str:
        return _na(value, unit, na.get(name))

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    if gpu.memory_total_bytes is not None:
        memory = (f"{format_bytes(gpu.memory_used_bytes or 0)} used of {format_bytes(gpu.memory_total_bytes, si_beside=True)}, "
                  f"{format_bytes(gpu.memory_free_bytes or 0)} free")
    else:
        memory = na.get("memory", "N/A")
    grid.add_row("memory", memory)
    grid.add_row("SM clock", f"{field('sm_clock_mhz', gpu.sm_clock_mhz, ' MHz')} "
                             f"(max {field('sm_clock_max_mhz', gpu.sm_clock_max_mhz, ' MHz')})")
    grid.add_row("memory clock", f"{field('memory_clock_mhz', gpu.memory_clock_mhz, ' MHz')} "
                                 f"(max {field('memory_clock_max_mhz', gpu.memory_clock_max_mhz, ' MHz')})")
    power = f"{gpu.power_w:.0f} W" if gpu.power_w is not None else na.get("power_w", "N/A")
    limit = f"{gpu.power_limit_w:.0f} W" if gpu.power_limit_w is not None else na.get("power_limit_w", "N/A")
    grid.add_row("power", f"{power} of {limit} limit")
    grid.add_row("temperature", field("temperature_c", gpu.temperature_c, " C"))
    util = (f"{gpu.utilization_gpu_pct}% of time a kernel ran, memory busy {gpu.utilization_memory_pct}%"
            if gpu.utilization_gpu_pct is not None else na.get("utilization", "N/A"))
    grid.add_row("utilization", util)
    grid.add_row("PCIe", f"gen {field('pcie_generation', gpu.pcie_generation)} x{field('pcie_width', gpu.pcie_width)} "
                         f"(max gen {field('pcie_generation_max', gpu.pcie_generation_max)} "
                         f"x{field('pcie_width_max', gpu.pcie_width_max)})")
    if gpu.clock_event_reasons is None:
        reasons = na.get("clock_event_reasons", "N/A")
    else:
        reasons = ", ".join(gpu.clock_event_reasons) or "none (clocks not held back)"
    grid.add_row("clock events", reasons)
    if gpu.processes is None:
        processes = na.get("processes", "N/A")
    else:
        processes = ", ".join(
            f"pid {p.pid}" + (f" ({format_bytes(p.used_memory_bytes)})" if p.used_memory_bytes else "")
            for p in gpu.processes) or "none"
    grid.add_row("processes", processes)
    spec = gpu.spec
    device = f"cuda:{gpu.index}"
    parts: list[RenderableType] = [grid]
    if spec is None:
        parts.append(f"[yellow]{UNKNOWN_GPU}[/] (no datasheet entry for {markup_safe(repr(gpu.name))})")
    else:
        table = Table(title=f"dense datasheet peaks of {spec.name}, TFLOP/s (int8: TOP/s)", title_justify="left")
        for dtype in DTYPES:
            table.add_column(dtype, justify="right")
        table.add_column("memory BW", justify="right")
        table.add_row(*[format_number(v, digits=4) if (v := spec.peak_tflops(d)) is not None else "-" for d in DTYPES],
                      format_rate(spec.bandwidth_gbps, "GB/s"))
        parts.append(table)
        if spec.derivation is not None:
            parts.append(f"[dim]the datasheet figure assumes an SM clock of {spec.derivation.boost_clock_mhz:g} MHz "
                         f"({spec.derivation.sm_count} SMs x {spec.derivation.fp16_flops_per_clock_per_sm} "
                         "FLOP/clock/SM)[/]")
        parts.append(f"[dim]source: {spec.source}[/]")
        if spec.notes:
            parts.append(f"[dim]note: {spec.notes}[/]")
        if spec.confidence != "datasheet":
            parts.append(f"[yellow]confidence {spec.confidence}[/]")
    title = f"GPU {gpu.index}: {markup_safe(gpu.name)} ({device} when CUDA_VISIBLE_DEVICES is unset)"
    return Panel(Group(*parts), title=title, title_align="left")


def _torch_panel(view: TorchView) -> Panel:
    from rich.panel import Panel
    from rich.table import Table

    if view.torch_version is None:
        return Panel(as_text(view.error or "torch unavailable"), title="torch", title_align="left")
    build = f"torch {view.torch_version}, CUDA {view.cuda_version or '-'}, HIP {view.hip_version or '-'}, " \
            f"CPU kernels {view.cpu_capability or '-'}"
    table = Table(title=build, title_justify="left")
    for column in ("device", "backend", "name", "memory", "SMs", "capability", "check"):
        table.add_column(column)
    for device in view.devices:
        table.add_row(device.device, device.backend, as_text(device.name),
                      format_bytes(device.total_memory_bytes, si_beside=True) if device.total_memory_bytes else "-",
                      str(device.sm_count or "-"),
                      ".".join(map(str, device.compute_capability)) if device.compute_capability else "-",
                      device.spec_check or "")
    if view.error:
        table.caption = markup_safe(view.error)
    return Panel(table, title="torch devices", title_align="left")


@click.command("env")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@click.option("--torch", "with_torch", is_flag=True,
              help="Also list torch's devices (CUDA/ROCm/MPS); imports torch, which takes seconds.")
def env(as_json: bool, with_torch: bool) -> None:
    """What this machine is: CPU, RAM, NVIDIA GPUs, drivers, and the theoretical peaks."""
    machine = detect_machine()
    torch_view = None
    if with_torch:
        from tutor.hardware.torch_devices import detect_torch_devices

        torch_view = detect_torch_devices()
    if as_json:
        data = machine.to_json()
        if torch_view is not None:
            from tutor.hardware.torch_devices import accelerator_agreement

            data["torch"] = _torch_json(torch_view)
            data["torch"]["disagreement"] = accelerator_agreement(len(machine.gpus), machine.nvml.reason, torch_view)
        echo_json(data)
        return
    _render(machine, torch_view)
