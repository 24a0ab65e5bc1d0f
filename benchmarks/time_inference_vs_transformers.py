"""`tensor-tutor time` (no --verify) for inference against transformers' own prefill and decode loop, on the CPU.

    python benchmarks/time_inference_vs_transformers.py [--models phi-3-mini-4k,olmo-2-7b,...,hf:gpt_oss]
        [--size medium] [--batches 1,8] [--no-bench] [--device cpu|cuda:0] [--budget S] [--json]

What a user does: one `tensor-tutor bench --quick` on this machine, then `tensor-tutor time MODEL --device cpu`.
Here, for each architecture (a preset, or `hf:MODEL_TYPE` for transformers' default config of a family with no
preset), its config scaled down (tutor.trace.step_verify.SIZES) is written as a config.json and:
  - predicted: `time_report` for it on this machine's CPU, from the bench run and the family's host costs
    (tutor.trace.host_costs, measured on first use), eager engine;
  - measured: the real transformers model (random weights, fp32, SDPA where the family has it) running the loop
    `generate` runs: a prefill of `seq` tokens (logits of the last position), then decode steps of one token per
    sequence with its DynamicCache, at each batch.
On the CPU everything runs on one thread (torch.set_num_threads(1); bench under taskset on CPU 0), timed on this
thread's CPU time, so a shared machine's other programs do not count. On CUDA (`--device cuda:0`, the GPU kit)
the model is built on the GPU in bf16 at `--size gpu` (4 layers of the family's own width ratio at hidden 4096,
2048 tokens) and timed on the wall clock after the queue drains; `time` answers for `--device 0` from the
latest bench run. Prints measured / predicted; goals: prefill within 20%, decode within 25%. Before the host's
code was counted (time without --verify), decode on the CPU was 3.3-3.8x too fast, and on an H200 15x.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

DEFAULT_MODELS = ("phi-3-mini-4k,olmo-2-7b,gemma-2-2b,mistral-7b,mixtral-8x7b,qwen1.5-moe-a2.7b,deepseek-v3,"
                  "hf:gpt_oss,hf:nemotron,llama-3.2-1b,qwen3-0.6b")
DECODE_STEPS = 16
PREFILL_REPEATS = 5
GPU_SIZE = (4, 4096, 32, 2048, 1, 32000)  # (layers, hidden, heads, sequence, batch, vocabulary) for --size gpu
GPU_MODELS = "llama-3.1-8b,mixtral-8x7b,gemma-2-2b,qwen3-8b"


def family_config(name: str) -> dict:
    if name.startswith("hf:"):
        from transformers import AutoConfig

        config = AutoConfig.for_model(name[3:]).to_dict()
        config["model_type"] = name[3:]
        return config
    from tutor.files.models import read_model_config

    return read_model_config(name).config


def measure(torch, config: dict, *, seq: int, batches: list[int], device: str = "cpu") -> dict:
    """The real loop: prefill seconds at batch 1, decode seconds per step at each batch (medians; CPU: this
    thread's CPU time, CUDA: the wall clock after the queue drains)."""
    from tutor.trace.step_verify import build_as_run, host_clock

    cuda = device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    clock = host_clock(torch, device)
    model = build_as_run(torch, config, dtype, device)[0].eval()
    vocab = config["vocab_size"]
    out = {}
    with torch.no_grad():
        ids = torch.randint(0, vocab, (1, seq), device=device)
        model(input_ids=ids, use_cache=True, logits_to_keep=1)
        times = []
        for _ in range(PREFILL_REPEATS):
            start = clock()
            model(input_ids=ids, use_cache=True, logits_to_keep=1)
            times.append(clock() - start)
        out["prefill"] = statistics.median(times)
        for batch in batches:
            ids = torch.randint(0, vocab, (batch, seq), device=device)
            result = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            cache, token = result.past_key_values, ids[:, -1:]
            times = []
            for index in range(DECODE_STEPS + 2):
                start = clock()
                result = model(input_ids=token, past_key_values=cache, use_cache=True)
                elapsed = clock() - start
                cache = result.past_key_values
                if index >= 2:
                    times.append(elapsed)
            out[f"decode@{batch}"] = statistics.median(times)
    del model
    if cuda:
        torch.cuda.empty_cache()
    return out


def predict(path: Path, *, seq: int, batches: list[int], device: str = "cpu") -> dict:
    from tutor.answers.fit import fit_model
    from tutor.theory.fit import FitRequest
    from tutor.answers.time import time_report

    found = fit_model(str(path), None)
    cuda = device.startswith("cuda")
    request = FitRequest(mode="inference", batch=1, seq_len=seq, dtype="bf16" if cuda else "fp32")
    report = time_report(found.arch, request, device.split(":")[1] if cuda else "cpu", name=found.name,
                         source=found.source,
                         config=found.found.config if found.found is not None else None)
    out = {"prefill": report["prefill"]["seconds"], "framework": report["sources"]["framework"],
           "prefill_bound": report["prefill"]["bound"]}
    for batch in batches:
        row = next(r for r in report["decode"] if r["engine"] == "eager" and r["batch"] == batch) \
            if batch in (1, 8, 32, 128) else None
        if row is None:
            raise SystemExit(f"batch {batch} is not one of time's decode batches")
        out[f"decode@{batch}"] = row["seconds_per_step"]
        out[f"host@{batch}"] = row["host_share"]
        out[f"bound@{batch}"] = row["bound"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None, help=f"default: {DEFAULT_MODELS} (CUDA: {GPU_MODELS})")
    parser.add_argument("--size", default=None, help="a size of tutor.trace.step_verify.SIZES, or gpu "
                                                     "(default: medium on the CPU, gpu on CUDA)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda:N")
    parser.add_argument("--budget", type=float, default=None, help="start no new model after this many seconds")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--no-bench", action="store_true",
                        help="use the bench run already in $TENSOR_TUTOR_DATA_DIR (default: a fresh one-thread run)")
    parser.add_argument("--json", action="store_true", help="one JSON object with every model's figures")
    args = parser.parse_args()
    cuda = args.device.startswith("cuda")
    models = args.models or (GPU_MODELS if cuda else DEFAULT_MODELS)
    size = args.size or ("gpu" if cuda else "medium")
    started_all = time.perf_counter()
    batches = [int(b) for b in args.batches.split(",")]
    warnings.filterwarnings("ignore")
    if not os.environ.get("TENSOR_TUTOR_DATA_DIR"):
        os.environ["TENSOR_TUTOR_DATA_DIR"] = tempfile.mkdtemp(prefix="tt-time-inf-")
    if not args.no_bench and cuda:
        raise SystemExit("on CUDA run `tensor-tutor bench --quick` first and pass --no-bench")
    if not args.no_bench:
        started = time.perf_counter()
        subprocess.run(["taskset", "-c", "0", sys.executable, "-m", "tutor", "bench", "--quick", "--json"],
                       check=True, stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
        print(f"bench --quick on one core: {time.perf_counter() - started:.0f} s "
              f"(data in {os.environ['TENSOR_TUTOR_DATA_DIR']})", file=sys.stderr if args.json else sys.stdout)
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    if not cuda:
        torch.set_num_threads(1)
    from tutor.trace.step_verify import SIZES, sized_config

    layers, hidden, heads, seq, _batch, vocab = GPU_SIZE if size == "gpu" else SIZES[size]
    report: dict = {"device": args.device, "size": size, "models": []}
    header = f"{'model':<20} {'prefill':>8}" + "".join(f" {'decode@' + str(b):>9} {'host':>5}" for b in batches)
    if not args.json:
        print(header + "   (measured / predicted; host: the host's code's share of the predicted eager step)")
    worst = {"prefill": 1.0, "decode": 1.0}
    for name in models.split(","):
        if args.budget is not None and time.perf_counter() - started_all > args.budget:
            report["models"].append({"model": name, "skipped": f"past the {args.budget:g} s budget"})
            continue
        try:
            config = sized_config(family_config(name), layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab)
            folder = Path(tempfile.mkdtemp(prefix="tt-arch-"))
            (folder / "config.json").write_text(json.dumps(config))
            predicted = predict(folder / "config.json", seq=seq, batches=batches, device=args.device)
            measured = measure(torch, config, seq=seq, batches=batches, device=args.device)
        except Exception as error:  # one family that does not build must not hide the others
            report["models"].append({"model": name, "failed": f"{type(error).__name__}: {str(error)[:300]}"})
            if not args.json:
                print(f"{name:<20} failed: {type(error).__name__}: {str(error)[:150]}")
            continue
        ratios = {key: measured[key] / predicted[key] for key in measured}
        report["models"].append({"model": name, "measured": measured, "predicted": predicted, "ratios": ratios})
        if args.json:
            continue
        worst["prefill"] = max(worst["prefill"], ratios["prefill"], 1 / ratios["prefill"])
        line = f"{name:<20} {ratios['prefill']:8.3f}"
        for batch in batches:
            ratio = ratios[f"decode@{batch}"]
            worst["decode"] = max(worst["decode"], ratio, 1 / ratio)
            line += f" {ratio:9.3f} {predicted[f'host@{batch}']:5.0%}"
        print(line)
    if args.json:
        print(json.dumps(report))
    else:
        print(f"worst factor: prefill {worst['prefill']:.3f} (goal 1.20), decode {worst['decode']:.3f} (goal 1.25)")


if __name__ == "__main__":
    main()
