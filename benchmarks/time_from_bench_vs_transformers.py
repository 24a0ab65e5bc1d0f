"""`tensor-tutor time` from a plain bench run against the real transformers model, per family and phase, on the CPU.

    python benchmarks/time_from_bench_vs_transformers.py [--models mistral-7b,phi-3-mini-4k,hf:falcon,...]
        [--size small] [--no-bench] [--rounds 3] [--json]

What a user does: one `tensor-tutor bench --quick`, then `tensor-tutor time MODEL`. Here bench runs once on one
thread (OMP_NUM_THREADS=1, taskset on CPU 0), and for each architecture (a preset, or `hf:MODEL_TYPE` for
transformers' default config of a family with no preset) scaled down (tutor.trace.step_verify.SIZES) and written as
a config.json:
  - predicted: `time_report` for it on this machine's CPU from that bench run (the family's host costs measured on
    first use): a training step (fp32, AdamW) by phase, a prefill and a decode step at the same batch;
  - measured: the real model (random weights, fp32, the attention transformers runs it with) on one thread
    (torch.set_num_threads(1)), timed on this thread's CPU time: training steps by phase (forward with the loss,
    backward, AdamW step + zero_grad), a prefill (logits of the last position) and decode steps on its cache.
Everything is repeated in rounds (medians). Each family runs in a process of its own, as a user's training or
`time --verify` does: glibc's malloc adapts its thresholds to the largest blocks a process has freed (mallopt(3)), so a
family measured after a larger one in the same process finds its blocks on recycled pages where a process of its own
page-faults them in (tutor.theory.step_operations.fresh_block). Prints measured / predicted per phase; goal: step,
forward, backward, optimizer and prefill within 20%. The load average is printed, since the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

DEFAULT_MODELS = ("mistral-7b,phi-3-mini-4k,gemma-2-2b,olmo-2-7b,qwen1.5-moe-a2.7b,mixtral-8x7b,deepseek-v3,"
                  "hf:gpt_neox,hf:falcon,hf:cohere,hf:nemotron,hf:granite,llama-3.2-1b")
WARMUP = 2
DECODE_STEPS = 8


def family_config(name: str) -> dict:
    if name.startswith("hf:"):
        from transformers import AutoConfig

        config = AutoConfig.for_model(name[3:]).to_dict()
        config["model_type"] = name[3:]
        # transformers' to_dict writes the fields it derives as None (Nemotron's head_dim): left to the class.
        return {k: v for k, v in config.items() if v is not None}
    from tutor.files.models import read_model_config

    return read_model_config(name).config


def measure(torch, config: dict, *, batch: int, seq: int, rounds: int) -> dict:
    """Medians over rounds of the real model's phases, on this thread's CPU time."""
    from tutor.trace.step_verify import CLOCK, build_as_run, timed_training_step

    model, hf = build_as_run(torch, config, torch.float32)
    vocab = config["vocab_size"]
    ids = torch.randint(0, vocab, (batch, seq))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    phases: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": [], "prefill": [], "decode": []}
    for round_index in range(rounds):
        model.train()
        for index in range((WARMUP if round_index == 0 else 0) + 2):
            forward, backward, step = timed_training_step(model, ids, optimizer)
            if index >= (WARMUP if round_index == 0 else 0):
                phases["forward"].append(forward)
                phases["backward"].append(backward)
                phases["optimizer"].append(step)
        model.eval()
        with torch.no_grad():
            for index in range(3):
                start = CLOCK()
                out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
                if index:
                    phases["prefill"].append(CLOCK() - start)
            cache, token = out.past_key_values, ids[:, -1:]
            for index in range(DECODE_STEPS + 2):
                start = CLOCK()
                out = model(input_ids=token, past_key_values=cache, use_cache=True)
                if index >= 2:
                    phases["decode"].append(CLOCK() - start)
                cache = out.past_key_values
    result = {name: statistics.median(values) for name, values in phases.items()}
    result["step"] = result["forward"] + result["backward"] + result["optimizer"]
    result["attention"] = hf._attn_implementation
    return result


def predict(path: Path, *, batch: int, seq: int, attention: str) -> dict:
    from tutor.answers.fit import fit_model
    from tutor.answers.time import time_report
    from tutor.theory.fit import FitRequest

    found = fit_model(str(path), None)
    config = found.found.config if found.found is not None else None
    train = FitRequest(mode="train", recipe="fp32", dtype="fp32", optimizer="adamw", batch=batch, seq_len=seq,
                       attention=attention, gpu=False)
    report = time_report(found.arch, train, "cpu", name=found.name, source=found.source, config=config)
    out = dict(report["step"]["phases"])
    out["step"] = report["step"]["seconds"]
    infer = FitRequest(mode="inference", batch=batch, seq_len=seq, dtype="fp32", attention=attention, gpu=False)
    inference = time_report(found.arch, infer, "cpu", name=found.name, source=found.source, config=config)
    out["prefill"] = inference["prefill"]["seconds"]
    decode = [r for r in inference["decode"] if r["engine"] == "eager"]
    # time reports decode at its own batches: the step at this batch, linear between the two around it.
    below = max((r for r in decode if r["batch"] <= batch), key=lambda r: r["batch"])
    above = min((r for r in decode if r["batch"] >= batch), key=lambda r: r["batch"])
    span = above["batch"] - below["batch"]
    share = (batch - below["batch"]) / span if span else 0.0
    out["decode"] = below["seconds_per_step"] + share * (above["seconds_per_step"] - below["seconds_per_step"])
    out["notes"] = report["notes"]
    return out


PHASES = ("step", "forward", "backward", "optimizer", "prefill", "decode")


def measure_family(name: str, size: str, rounds: int) -> dict:
    """One family's prediction and measurement, in the process of its own that main starts for it."""
    import torch
    import transformers

    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    from tutor.trace.step_verify import SIZES, build_as_run, sized_config

    layers, hidden, heads, seq, batch, vocab = SIZES[size]
    try:
        config = sized_config(family_config(name), layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab)
        folder = Path(tempfile.mkdtemp(prefix="tt-arch-"))
        (folder / "config.json").write_text(json.dumps(config))
        attention = build_as_run(torch, sized_config(config, layers=1, hidden=64, heads=2, seq=8, vocab=64),
                                 torch.float32)[1]._attn_implementation
        predicted = predict(folder / "config.json", batch=batch, seq=seq, attention=attention)
        measured = measure(torch, config, batch=batch, seq=seq, rounds=rounds)
    except Exception as error:  # one family that fails must not hide the others
        return {"failed": f"{type(error).__name__}: {error}"}
    return {"measured": measured, "predicted": predicted}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--size", default="small", help="a size of tutor.trace.step_verify.SIZES")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-bench", action="store_true",
                        help="use the bench run already in $TENSOR_TUTOR_DATA_DIR (default: a fresh one-thread run)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if not os.environ.get("TENSOR_TUTOR_DATA_DIR"):
        os.environ["TENSOR_TUTOR_DATA_DIR"] = tempfile.mkdtemp(prefix="tt-time-bench-")
    os.environ["OMP_NUM_THREADS"] = "1"  # what `time` predicts for: the threads of a new process here
    if not args.no_bench:
        subprocess.run(["taskset", "-c", "0", sys.executable, "-m", "tutor", "bench", "--quick", "--json"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ)
    from tutor.trace.step_verify import SIZES

    layers, hidden, heads, seq, batch, vocab = SIZES[args.size]
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}; size {args.size}: {layers} layers, "
          f"hidden {hidden}, batch {batch} x {seq}; data {os.environ['TENSOR_TUTOR_DATA_DIR']}")
    print(f"{'model':<20}" + "".join(f" {p:>9}" for p in PHASES) + "   (measured / predicted)")
    rows = []
    spawn = multiprocessing.get_context("spawn")
    for name in args.models.split(","):
        started = time.perf_counter()
        with spawn.Pool(1) as pool:
            outcome = pool.apply(measure_family, (name, args.size, args.rounds))
        if "failed" in outcome:
            print(f"{name:<20} failed: {outcome['failed'][:200]}")
            rows.append({"model": name, "failed": outcome["failed"][:300]})
            continue
        measured, predicted = outcome["measured"], outcome["predicted"]
        ratios = {p: measured[p] / predicted[p] for p in PHASES}
        rows.append({"model": name, "measured": measured, "predicted": predicted, "ratios": ratios})
        print(f"{name:<20}" + "".join(f" {ratios[p]:9.3f}" for p in PHASES)
              + f"   [{time.perf_counter() - started:.0f} s, {measured['attention']}, load {os.getloadavg()[0]:.2f}]")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
