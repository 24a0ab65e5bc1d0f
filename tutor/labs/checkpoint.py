"""checkpoint-write: write and read back a real training checkpoint, and say what it holds.

A mixed-precision Adam checkpoint holds, per parameter, the 16-bit weights and the optimizer:
the fp32 master copy and Adam's m and v (tutor.theory.memory.model_state_bytes_per_param minus
the gradients, which are not saved): 2 + 12 = 14 bytes. The probe builds such a state_dict of
about size_mb, writes it with torch.save + fsync into a temporary file in dir= (or the temp dir),
reads it back with torch.load, and times both with tutor.bench's timing core. The file has no
name (tempfile.TemporaryFile), so nothing is left behind whatever stops the lab.
"""

from __future__ import annotations

import errno
import math
import os
import shutil
import tempfile
import threading
import time
from fractions import Fraction

from tutor.errors import UserError
from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import Param, budget_param, make_probe
from tutor.formatting import format_bytes, format_number, format_rate

# Parameters per tensor of the synthetic checkpoint (a 512 x 512 matrix).
TENSOR_PARAMS = 2**18
MAX_ITERS = 5


def checkpoint_bytes_per_param(recipe: str = "mixed", optimizer: str = "adam") -> Fraction:
    """Bytes per parameter a training checkpoint stores: weights + optimizer (master and states);
    gradients are recomputed after a resume, so they are not saved. Mixed + Adam: 2 + 12 = 14
    (ZeRO, Rajbhandari et al. arXiv 1910.02054 §3.1, without the 2-byte gradients)."""
    from tutor.theory.memory import model_state_bytes_per_param

    per_param = model_state_bytes_per_param(recipe, optimizer)
    return per_param.weights + per_param.optimizer


def _filesystem(path: str) -> str:
    """The filesystem type under `path` ('ext4', 'tmpfs', ...) as psutil reports it, or ''."""
    import psutil

    best = ""
    fstype = ""
    real = os.path.realpath(path)
    for partition in psutil.disk_partitions(all=True):
        mount = partition.mountpoint
        if (real == mount or real.startswith(mount.rstrip("/") + "/")) and len(mount) > len(best):
            best, fstype = mount, partition.fstype
    return fstype


CHECKPOINT_SLACK_BYTES = 2**20
"""Room for torch.save's pickle and zip records beside the tensors' bytes (measured: well under 1 MiB here)."""


def checkpoint_folder(folder: str | None, needed_bytes: int) -> str:
    """Where the checkpoint goes (dir=, else the system temp dir), refused in one line before anything is
    built when it is missing, a file, not writable, or has less room than the checkpoint needs."""
    if folder is not None and not folder.strip():
        raise UserError("dir= needs a directory (or leave it out for the system temp dir)")
    named = f"dir={folder}" if folder is not None else f"the temp dir {tempfile.gettempdir()}"
    path = os.path.expanduser(folder) if folder is not None else tempfile.gettempdir()
    if not os.path.exists(path):
        raise UserError(f"{named}: no such directory")
    if not os.path.isdir(path):
        raise UserError(f"{named}: is a file, not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"{named}: not writable by this user")
    free = shutil.disk_usage(path).free
    if free < needed_bytes:
        from tutor.formatting import format_bytes

        raise UserError(f"{named}: {format_bytes(free)} free, the checkpoint needs about {format_bytes(needed_bytes)}; "
                        "choose another dir= or a smaller size_mb=")
    return path


def _write_failed(named: str, folder: str, error: Exception) -> UserError:
    """One line for a write that failed. torch.save reports a full disk as a RuntimeError ("unexpected pos"),
    so the room left decides whether the disk was full."""
    try:
        full = shutil.disk_usage(folder).free < CHECKPOINT_SLACK_BYTES
    except OSError:
        full = False
    if full or (isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)):
        why = "the disk is full"
    else:
        why = error.strerror if isinstance(error, OSError) and error.strerror else f"{type(error).__name__}: {error}"
    return UserError(f"writing the checkpoint in {named} failed: {why}")


def _checkpoint_write(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    per_param = checkpoint_bytes_per_param()
    model_bytes = None
    if params["model"]:
        from tutor.files.models import resolve_model
        from tutor.theory.models import count_parameters

        arch, _source = resolve_model(params["model"])
        model_params = count_parameters(arch).total
        model_bytes = math.ceil(model_params * per_param)
    n_params = max(TENSOR_PARAMS, int(params["size_mb"] * 2**20 / per_param)) // TENSOR_PARAMS * TENSOR_PARAMS
    target = checkpoint_folder(params["dir"], math.ceil(n_params * per_param) + CHECKPOINT_SLACK_BYTES)
    named = f"dir={params['dir']}" if params["dir"] is not None else target
    progress(0.0, "loading torch")
    import torch

    from tutor.bench.timing import BenchCancelled, time_case

    start = time.perf_counter()  # the budget is for writing, not for loading torch

    generator = torch.Generator().manual_seed(0)
    progress(0.05, f"building a checkpoint of {n_params:,} parameters")
    model, master, states = {}, {}, {}
    for index in range(n_params // TENSOR_PARAMS):
        if cancel.is_set():
            return ProbeResult("checkpoint-write", (), {}, "cancelled while building the checkpoint", True, "cpu")
        weight = torch.randn(512, TENSOR_PARAMS // 512, generator=generator)
        model[f"layers.{index}.weight"] = weight.to(torch.bfloat16)
        master[index] = weight
        states[index] = {"step": torch.tensor(1.0), "exp_avg": torch.randn_like(weight) * 1e-3,
                         "exp_avg_sq": torch.rand(weight.shape, generator=generator) * 1e-6}
    state = {"model": model, "optimizer": {"state": states, "master_weights": master}, "step": 1}
    rows: list[Measurement] = []
    metrics: dict[str, float] = {}
    cancelled = False
    writing = reading = None
    file_bytes = 0
    try:
        # A file without a name (O_TMPFILE on Linux; created and unlinked at once elsewhere), so no
        # signal, cancel or crash at any point can leave a checkpoint behind.
        with tempfile.TemporaryFile(prefix="tensor-tutor-ckpt-", dir=target) as handle:
            fstype = _filesystem(target)

            def write() -> None:
                try:
                    handle.seek(0)
                    handle.truncate()
                    torch.save(state, handle)
                    handle.flush()
                    os.fsync(handle.fileno())
                except (OSError, RuntimeError) as error:
                    raise _write_failed(named, target, error) from None

            def read() -> None:
                handle.seek(0)
                torch.load(handle, weights_only=True)

            remaining = params["budget_s"] - (time.perf_counter() - start)
            try:
                progress(0.2, "writing (torch.save + fsync)")
                writing = time_case(write, budget_s=max(remaining / 2, 0.05), min_iters=1, max_iters=MAX_ITERS,
                                    cancel=cancel)
                file_bytes = os.fstat(handle.fileno()).st_size
                if cancel.is_set():
                    raise BenchCancelled("cancelled after writing")
                progress(0.6, "reading back (torch.load)")
                remaining = params["budget_s"] - (time.perf_counter() - start)
                reading = time_case(read, budget_s=max(remaining, 0.05), min_iters=1, max_iters=MAX_ITERS, cancel=cancel)
            except BenchCancelled:
                cancelled = True
                file_bytes = os.fstat(handle.fileno()).st_size
    except OSError as error:  # the folder removed or made read-only since the check
        raise _write_failed(named, target, error) from None
    where = f"{params['dir'] or tempfile.gettempdir()} ({fstype or 'filesystem unknown'})"
    tmpfs_note = "; tmpfs lives in RAM: this is memory speed, not a disk" if fstype == "tmpfs" else ""
    if writing is not None:
        metrics["write_gbps"] = file_bytes / writing.median_s / 1e9
        rows.append(Measurement(f"write {file_bytes / 2**20:.0f} MiB with torch.save + fsync", metrics["write_gbps"],
                                "GB/s", note=f"median of {writing.iters}; {where}{tmpfs_note}", rate=True))
    if reading is not None:
        metrics["read_gbps"] = file_bytes / reading.median_s / 1e9
        rows.append(Measurement("read back with torch.load", metrics["read_gbps"], "GB/s",
                                note="usually from the OS page cache just after the write: a cold read "
                                     "from disk is slower", rate=True))
    if file_bytes:
        metrics["file_bytes"] = float(file_bytes)
        metrics["bytes_per_param"] = file_bytes / n_params
        metrics["theory_bytes_per_param"] = float(per_param)
        rows.append(Measurement("checkpoint bytes per parameter", metrics["bytes_per_param"], "B/param",
                                float(per_param),
                                "bf16 weights 2 + fp32 master 4 + Adam m 4 + v 4 (tutor.theory.memory, mixed + adam)",
                                "gradients are not saved; the small excess is pickle and tensor metadata"))
    if model_bytes is not None:
        metrics["model_checkpoint_bytes"] = float(model_bytes)
        rows.append(Measurement(f"checkpoint of {params['model']}", None, "bytes", float(model_bytes),
                                "parameters (counted from the model config) x 14 B"))
        if "write_gbps" in metrics:
            metrics["model_checkpoint_write_s"] = model_bytes / (metrics["write_gbps"] * 1e9)
            rows.append(Measurement("time to write it here at the measured rate", metrics["model_checkpoint_write_s"],
                                    "s", note="a rate measured on a small file: a large one may hit the disk's "
                                              "sustained speed instead of its cache"))
    progress(1.0, "done")
    summary = (f"wrote {format_bytes(file_bytes)} at {format_rate(metrics.get('write_gbps'), 'GB/s')}, "
               f"read at {format_rate(metrics.get('read_gbps'), 'GB/s')}; "
               f"{format_number(metrics.get('bytes_per_param'))} B/param (theory {format_number(float(per_param))})")
    return ProbeResult(probe="checkpoint-write", rows=tuple(rows), metrics=metrics, summary=summary,
                       cancelled=cancelled, device="cpu")


CHECKPOINT_WRITE = make_probe(
    name="checkpoint-write",
    title="Writing a checkpoint",
    description="Builds a mixed-precision Adam checkpoint (bf16 weights, fp32 master, m and v), writes it "
                "with torch.save and fsync, reads it back, and sets its bytes per parameter beside the theory.",
    needs_torch=True,
    params=(
        Param("size_mb", "float", 64.0, "approximate checkpoint size in MiB", minimum=1.0, maximum=2048.0),
        Param("model", "text", None, "a preset (e.g. llama-3.1-8b): how long its checkpoint would take here",
              optional=True),
        Param("dir", "text", None, "directory for the temporary file (default: the system temp dir)", optional=True),
        budget_param(5.0),
    ),
    metrics=("write_gbps", "read_gbps", "file_bytes", "bytes_per_param", "theory_bytes_per_param",
             "model_checkpoint_bytes", "model_checkpoint_write_s"),
    body=_checkpoint_write,
    metrics_of=lambda p: ("write_gbps", "read_gbps", "file_bytes", "bytes_per_param", "theory_bytes_per_param")
    + (("model_checkpoint_bytes", "model_checkpoint_write_s") if p["model"] else ()),
)
