"""The host's side of an eager inference step: what the framework's own code costs per decoder layer.

transformers runs a decode step op by op from Python: per decoder layer some tens of modules and
operators, each dispatched by PyTorch and, on a GPU, launched as a kernel. At batch 1 that code, not
the memory bandwidth, is what a GPU waits on (Llama-3.1-8B on an H200: 55.9 ms per token in eager
transformers against a 3.4 ms bandwidth floor, measured by this project); on a CPU it adds to the
kernels' own time. How much it costs depends on the family's code (a mixture-of-experts layer runs
one expert's code per expert its tokens touch) and on this host, so it is measured, per family and
device, the way `time --verify` measures it: the same family at width 64 with 1 and 3 layers, per
layer the difference (tutor.trace.step_verify.framework_seconds), for a prefill, for decode steps
at batch 1 and 8, and for a training step's forward (with the loss) and backward (modes TRAIN_FORWARD and
TRAIN_BACKWARD): on a CPU that code runs on the same cores as the kernels, so a training step pays it too.

A measurement takes a few seconds (torch and transformers load); it is kept in the user cache folder
(`host-costs.json`), keyed by the family's code at that size, the device, the CPU and the torch and
transformers versions, so the next `time` of the same family answers at once. Set
TENSOR_TUTOR_MEASURE_HOST=0 to never measure (only what the cache holds is used).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from tutor.theory.step_operations import LAYER_CODE, MODEL_CODE
from tutor.theory.step_time import HostCosts

CACHE_FILE = "host-costs.json"
FORMAT = 2  # 2: the training step's forward and backward measured too
CACHE_LIMIT_BYTES = 1 << 20
MEASURE_ENV = "TENSOR_TUTOR_MEASURE_HOST"
DECODE_BATCHES = (1, 8)
TRAIN_FORWARD, TRAIN_BACKWARD = "train-forward", "train-backward"
"""HostCosts modes of a training step's phases (batch 1, sequence of 8 at width 64: the code, not the work)."""
REFERENCE_MODEL = "llama-3.1-8b"
"""The family the card-by-name host assumption was measured on (its per-layer code; tutor.bench.ceilings)."""


def cache_path() -> Path:
    """$TENSOR_TUTOR_DATA_DIR/cache/host-costs.json when that is set (tests, a portable setup), else in
    platformdirs' user cache folder (~/.cache/tensor-tutor on Linux), beside the curriculum index."""
    from tutor.files.storage import APP_NAME, DATA_DIR_ENV

    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return Path(override).expanduser() / "cache" / CACHE_FILE
    import platformdirs

    return Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False)) / CACHE_FILE


def _cpu_name() -> str:
    try:
        from tutor.hardware.cpu import detect_cpu

        return detect_cpu().model_name or platform.machine()
    except Exception:  # the key only needs to change with the machine; any stable name will do
        return platform.processor() or platform.machine()


def _device_name(torch, device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(device)
    return "cpu"


def cache_key(config: dict, device: str) -> str:
    """What the measurement depends on: the family's code at the measured size, the device, the CPU that runs
    the host's code, and the torch and transformers versions (read from their metadata: no import, so a cached
    answer costs no torch start-up). PackageNotFoundError where either is not installed."""
    from importlib.metadata import version

    from tutor.trace.step_verify import FRAMEWORK_SHAPE, sized_config

    family = sized_config(config, layers=1, **FRAMEWORK_SHAPE)
    text = json.dumps([FORMAT, family, device, _cpu_name(), version("torch"), version("transformers")],
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _read_cache() -> dict:
    from tutor.files.storage import read_checked_json

    try:
        stored = read_checked_json(cache_path(), max_bytes=CACHE_LIMIT_BYTES, strings="keep")
    except (OSError, ValueError):  # no cache, or one refused (tutor.files.untrusted): measured again
        return {}
    return stored if isinstance(stored, dict) and stored.get("format") == FORMAT else {}


def _from_entry(entry) -> HostCosts | None:
    try:
        rows = tuple((str(mode), str(name), int(batch), float(seconds)) for mode, name, batch, seconds in entry["rows"])
        if not rows or any(seconds < 0 or seconds != seconds or seconds > 1.0 for *_, seconds in rows):
            return None
        from tutor.safe_text import strings_without_controls

        return HostCosts(rows, strings_without_controls(str(entry["source"])))
    except (KeyError, TypeError, ValueError):
        return None


def _store(key: str, costs: HostCosts) -> None:
    from tutor.files.storage import write_json_atomic

    stored = _read_cache()
    found = stored.get("entries")
    entries: dict = found if isinstance(found, dict) else {}
    entries[key] = {"rows": [list(row) for row in costs.rows], "source": costs.source}
    try:
        cache_path().parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(cache_path(), {"format": FORMAT, "entries": entries})
    except OSError:
        pass  # a cache that cannot be written only costs the next `time` the measurement


def measure_host_costs(config: dict, device: str = "cpu") -> HostCosts:
    """The framework's code per decoder layer and per model call on `device`, measured now (module docstring)."""
    import torch
    import transformers

    from tutor.trace.step_verify import framework_seconds

    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    threads = torch.get_num_threads()
    verbosity = transformers.logging.get_verbosity()
    torch.set_num_threads(1)  # at width 64 no op is split over threads; one thread times the code, not the pool
    # A config sized down warns (token ids, deprecated cache names): the user asked for a time, not those.
    transformers.logging.set_verbosity_error()
    try:
        rows = []
        measured = [("prefill", 1)] + [("decode", batch) for batch in DECODE_BATCHES]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for mode, batch in measured:
                for key, seconds in framework_seconds(torch, config, mode, device=device, batch=batch):
                    name = key.split(":", 1)[1]
                    rows.append((mode, name, batch, seconds))
            for key, seconds in framework_seconds(torch, config, "train", device=device):
                phase, name = key.split(":", 1)
                rows.append((TRAIN_FORWARD if phase == "forward" else TRAIN_BACKWARD, name, 1, seconds))
    finally:
        torch.set_num_threads(threads)
        transformers.logging.set_verbosity(verbosity)
    clock = "wall clock after the queue drains" if device.startswith("cuda") else "this thread's CPU time"
    where = _device_name(torch, device) if device.startswith("cuda") else f"the CPU ({_cpu_name()})"
    source = (f"measured {stamp} on {where}: {config.get('model_type', 'this')} family's own code at width 64 with "
              f"1 and 3 layers (training: 1 and 2), per layer the difference ({clock}; prefill at batch 1, decode at "
              f"batch {' and '.join(map(str, DECODE_BATCHES))}, a training step's forward and backward; torch "
              f"{torch.__version__})")
    return HostCosts(tuple(rows), source)


def host_costs_for(config: dict, device: str = "cpu", on_measure: Callable[[str], None] | None = None
                   ) -> HostCosts | None:
    """This family's host costs on `device` ("cpu" or "cuda:N"): from the cache, else measured now and kept;
    None where they cannot be had (no torch or transformers, no such device, measuring switched off, or the
    family does not build at width 64). `on_measure` is told, in a sentence, before a measurement starts."""
    try:
        key = cache_key(config, device)
    except Exception:  # no torch or transformers, or a config sized_config cannot read: no host term
        return None
    entry = (_read_cache().get("entries") or {}).get(key)
    found = _from_entry(entry) if isinstance(entry, dict) else None
    if found is not None or os.environ.get(MEASURE_ENV, "1") == "0":
        return found
    if on_measure is not None:
        on_measure(f"measuring the {config.get('model_type', 'model')} family's own code on {device} "
                   "(once per family; a few seconds)")
    try:
        costs = measure_host_costs(config, device)
    except Exception:  # a family transformers cannot build small, a device that went away: answer without it
        return None
    _store(key, costs)
    return costs


def per_layer_decode(costs: HostCosts, batch: int = 1) -> float:
    """Decode seconds per decoder layer at `batch` (0 where not measured)."""
    return costs.seconds("decode", LAYER_CODE, batch) or 0.0


def training_framework_seconds(costs: HostCosts) -> tuple[tuple[str, float], ...]:
    """The training step's framework code as Ceilings.named_seconds ("forward:" and "backward:" LAYER_CODE and
    MODEL_CODE, seconds per call), from the measured rows; empty where the training step was not measured."""
    out = []
    for mode, phase in ((TRAIN_FORWARD, "forward"), (TRAIN_BACKWARD, "backward")):
        for name in (LAYER_CODE, MODEL_CODE):
            seconds = costs.seconds(mode, name, 1)
            if seconds is not None:
                out.append((f"{phase}:{name}", seconds))
    return tuple(out)


__all__ = ["host_costs_for", "measure_host_costs", "per_layer_decode", "training_framework_seconds", "LAYER_CODE",
           "MODEL_CODE"]
