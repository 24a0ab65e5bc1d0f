"""The labs as data: each lab's name, the module that holds it, its title and its parameters' names.

Importing this module imports no lab: the app lists and starts labs, and the CLI lists them and
completes their names, from this table alone. A lab's module is imported only when the lab is loaded
(`load_lab`): to run it (in the measurement worker, or by `tensor-tutor lab`), to validate or list
its parameters (`lab NAME --help`, the lesson lint), or to draw a result it returned. The lab's module declares its
parameters in full (tutor.labs._params.Param: kind, default, range, unit); `param_names` here is the
list the app needs before any lab is loaded (whether a lab takes `device`), and a test checks it
against the module's declaration.

To add a lab: write its module (a `make_probe(...)` at module level), then add one `LabEntry` to
`LABS` below.
"""

from __future__ import annotations

import difflib
import importlib
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from tutor.errors import UserError
from tutor.labs.probe import Probe, ProbeResult, ProgressFn


@dataclass(frozen=True)
class LabEntry:
    """Where a lab lives and what is known of it without importing it."""

    name: str
    module: str
    attribute: str
    title: str
    param_names: tuple[str, ...]

    def load(self) -> Probe:
        """The lab itself: imports its module (and only that module's imports; torch stays unloaded)."""
        probe = getattr(importlib.import_module(self.module), self.attribute)
        if not isinstance(probe, Probe) or probe.name != self.name:
            raise AssertionError(f"{self.module}.{self.attribute} is not the lab {self.name!r}")
        return probe


LABS: dict[str, LabEntry] = {entry.name: entry for entry in (
    LabEntry("matmul", "tutor.labs.throughput", "MATMUL", "Matrix multiply throughput",
             ("dtypes", "budget_s", "device")),
    LabEntry("bandwidth", "tutor.labs.throughput", "BANDWIDTH", "Memory bandwidth", ("ops", "budget_s", "device")),
    LabEntry("cast-error", "tutor.labs.precision", "CAST_ERROR", "Rounding error of a real cast",
             ("dtype", "values", "count", "source", "seed", "budget_s")),
    LabEntry("activation-memory", "tutor.labs.activation_memory", "ACTIVATION_MEMORY",
             "Activation memory of a transformer block",
             ("style", "hidden", "heads", "kv_heads", "ffn", "seq", "batch", "layers", "attention", "dropout", "dtype",
              "seed", "device")),
    LabEntry("training-step", "tutor.labs.training_step", "TRAINING_STEP", "Memory of one training step",
             ("style", "hidden", "heads", "layers", "vocab", "batch", "seq", "recipe", "optimizer", "seed", "device")),
    LabEntry("moe-routing", "tutor.labs.moe_routing", "MOE_ROUTING", "Mixture-of-experts routing",
             ("tokens", "experts", "top_k", "skew", "trials", "capacity_factor", "seed", "budget_s")),
    LabEntry("collective", "tutor.labs.collective", "COLLECTIVE", "Collective communication",
             ("ranks", "sizes", "ops", "backend", "budget_s")),
    LabEntry("checkpoint-write", "tutor.labs.checkpoint", "CHECKPOINT_WRITE", "Writing a checkpoint",
             ("size_mb", "model", "dir", "budget_s")),
    LabEntry("fit", "tutor.labs.fit_probe", "FIT", "Does it fit here?",
             ("model", "mode", "dtype", "recipe", "optimizer", "batch", "seq", "attention", "capacity", "device")),
    LabEntry("kv-cache", "tutor.labs.inference", "KV_CACHE", "The KV cache, measured as it grows",
             ("layers", "hidden", "heads", "kv_heads", "prompt", "tokens", "dtype", "seed", "budget_s", "device")),
    LabEntry("prefill-decode", "tutor.labs.inference", "PREFILL_DECODE", "Prefill against decode on the roofline",
             ("hidden", "layers", "prompt", "dtype", "seed", "budget_s", "device")),
    LabEntry("decode-engines", "tutor.labs.decode_engines", "DECODE_ENGINES",
             "Decode: eager, the host floor and CUDA graphs",
             ("layers", "hidden", "heads", "kv_heads", "prompt", "tokens", "dtype", "graphs", "seed", "budget_s",
              "device")),
    LabEntry("ttft-tpot", "tutor.labs.serving_latency", "TTFT_TPOT",
             "Prefill against decode: time to first token and time per token",
             ("layers", "hidden", "heads", "kv_heads", "prompt", "tokens", "batch", "dtype", "seed", "budget_s",
              "device")),
    LabEntry("batch-decode", "tutor.labs.serving_latency", "BATCH_DECODE",
             "Batched decode: static against continuous batching",
             ("layers", "hidden", "heads", "kv_heads", "prompt", "batches", "steps", "requests", "output_max", "dtype",
              "seed", "budget_s", "device")),
    LabEntry("kv-pages", "tutor.labs.kv_pages", "KV_PAGES", "The KV cache as pages: reserved, paged and shared",
             ("model", "requests", "prompt_max", "output_max", "max_len", "block_size", "shared_prefix", "kv_dtype",
              "seed")),
    LabEntry("speculative", "tutor.labs.speculative", "SPECULATIVE", "Speculative decoding with a draft model",
             ("layers", "hidden", "heads", "kv_heads", "draft_layers", "refine", "draft_tokens", "prompt", "tokens",
              "seed", "budget_s", "device")),
    LabEntry("host-overhead", "tutor.labs.host_overhead", "HOST_OVERHEAD",
             "The host's cost per operation and per decode step", ("layers", "heads", "kv_heads", "seed", "budget_s")),
    LabEntry("moe-alltoall", "tutor.labs.expert_parallel", "MOE_ALLTOALL", "Expert-parallel all-to-all volume",
             ("tokens", "experts", "top_k", "ep", "hidden", "skew", "steps", "seed", "budget_s")),
    LabEntry("quant-error", "tutor.labs.quantization", "QUANT_ERROR", "Quantization error of a weight matrix",
             ("rows", "cols", "group_size", "outliers", "outlier_scale", "seed", "budget_s")),
    LabEntry("fp8-scaling", "tutor.labs.fp8_scaling", "FP8_SCALING",
             "FP8 scaling recipes: per tensor, delayed and per block",
             ("rows", "cols", "outliers", "outlier_scale", "history", "growth", "gradient_spread", "seed", "budget_s")),
    LabEntry("loss-scaling", "tutor.labs.loss_scaling", "LOSS_SCALING", "FP16 training with and without a loss scaler",
             ("hidden", "batch", "steps", "loss_factor", "init_scale", "lr", "seed", "budget_s")),
    LabEntry("grad-accumulation", "tutor.labs.grad_accumulation", "GRAD_ACCUMULATION",
             "Gradient accumulation against one big batch",
             ("batch", "micro_batches", "hidden", "layers", "seed", "budget_s")),
    LabEntry("fp64-cost", "tutor.labs.fp64", "FP64_COST", "What FP64 costs", ("size", "count", "seed", "budget_s")),
    LabEntry("checkpoint-interval", "tutor.labs.checkpoint_interval", "CHECKPOINT_INTERVAL", "How often to checkpoint",
             ("model", "mtbf_hours", "size_mb", "work_hours", "runs", "seed", "budget_s")),
    LabEntry("moe", "tutor.labs.moe", "MOE", "A real mixture-of-experts layer",
             ("experts", "top_k", "hidden", "ffn", "clusters", "tokens", "steps", "scoring", "skew", "aux_alpha",
              "bias_rate", "capacity_factor", "runs", "ranks", "seed")),
    LabEntry("ddp", "tutor.labs.ddp", "DDP", "Data parallelism with DDP",
             ("ranks", "steps", "hidden", "layers", "batch", "seq", "bucket_cap_mb", "seed", "budget_s")),
    LabEntry("zero", "tutor.labs.zero", "ZERO", "ZeRO and FSDP: sharding the model states",
             ("stage", "ranks", "hidden", "layers", "batch", "seq", "seed", "budget_s")),
    LabEntry("pipeline", "tutor.labs.pipeline", "PIPELINE", "Pipeline parallelism for real",
             ("stages", "microbatches", "schedule", "hidden", "layers_per_stage", "microbatch_tokens", "steps", "seed")),
    LabEntry("tensor", "tutor.labs.tensor_parallel", "TENSOR", "Tensor parallelism for real",
             ("ranks", "hidden", "heads", "ffn_multiplier", "seq", "batch", "qkv", "seed")),
    LabEntry("profile-step", "tutor.labs.profile_step", "PROFILE_STEP", "Reading a profiler trace of one training step",
             ("hidden", "layers", "seq", "batch", "vocab", "steps", "top", "seed", "device")),
    LabEntry("exercise", "tutor.labs.exercise", "EXERCISE", "Check an exercise", ("check", "answer")),
    LabEntry("step-time", "tutor.labs.step_time", "STEP_TIME", "How long a step takes: predicted, then measured",
             ("model", "size")),
    LabEntry("evaluation", "tutor.labs.evaluation", "EVALUATION",
             "A held-out loss every N steps: its time, and no_grad and eval()",
             ("steps", "eval_every", "eval_batches", "train_batches", "batch", "hidden", "layers", "dropout", "lr",
              "seed", "budget_s")),
    LabEntry("time-to-train", "tutor.labs.time_to_train", "TIME_TO_TRAIN", "How long a training run takes on a cluster",
             ("model", "tokens", "device", "devices", "tp", "pp", "seq", "batch", "mfu")),
)}


def lab_entry(name: str) -> LabEntry:
    """The entry of the lab called `name`; a UserError listing the labs (closest first) otherwise."""
    if name in LABS:
        return LABS[name]
    close = difflib.get_close_matches(str(name), list(LABS), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UserError(f"unknown lab {name!r}{hint}; choose one of: {', '.join(LABS)}")


def load_lab(name: str) -> Probe:
    """The lab called `name`, its module imported now (UserError for an unknown name)."""
    return lab_entry(name).load()


class LoadedLabs(Mapping[str, Probe]):
    """The labs by name, each module imported when its lab is first looked up (not when listed)."""

    def __getitem__(self, name: str) -> Probe:
        if name not in LABS:
            raise KeyError(name)
        return LABS[name].load()

    def __iter__(self) -> Iterator[str]:
        return iter(LABS)

    def __len__(self) -> int:
        return len(LABS)

    def __contains__(self, name: object) -> bool:
        return name in LABS


def run_lab(name: str, params: dict | None = None, *, progress: ProgressFn | None = None,
            cancel: threading.Event | None = None) -> ProbeResult:
    """Run the lab `name` with `params` (defaults filled in); progress and cancel are optional."""
    probe = load_lab(name)
    return probe.run(dict(params or {}), progress or (lambda fraction, message: None), cancel or threading.Event())


__all__ = ["LABS", "LabEntry", "LoadedLabs", "lab_entry", "load_lab", "run_lab"]
