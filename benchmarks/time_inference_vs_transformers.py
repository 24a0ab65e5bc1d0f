"""`tensor-tutor time` (no --verify) for inference against transformers' own prefill and decode loop, on the CPU.

    python benchmarks/time_inference_vs_transformers.py [--models phi-3-mini-4k,olmo-2-7b,...,hf:gpt_oss]
        [--size medium] [--batches 1,8] [--no-bench]

What a user does: one `tensor-tutor bench --quick` on this machine, then `tensor-tutor time MODEL --device cpu`.
Here, for each architecture (a preset, or `hf:MODEL_TYPE` for transformers' default config of a family with no
preset), its config scaled down (tutor.bench.step_verify.SIZES) is written as a config.json and:
  - predicted: `time_report` for it on this machine's CPU, from the bench run and the family's host costs
    (tutor.bench.host_costs, measured on first use), eager engine;
  - measured: the real transformers model (random weights, fp32, SDPA where the family has it) running the loop
    `generate` runs: a prefill of `seq` tokens (logits of the last position), then decode steps of one token per
    sequence with its DynamicCache, at each batch.
Everything on one thread (torch.set_num_threads(1); bench under taskset on CPU 0), timed on this thread's CPU
time, so a shared machine's other programs do not count. Prints measured / predicted; goals: prefill within 20%,
decode within 25%. Before the host's code was counted (time without --verify), decode was 3.3-3.8x too fast.
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


def family_config(name: str) -> dict:
    if name.startswith("hf:"):
        from transformers import AutoConfig

        config = AutoConfig.for_model(name[3:]).to_dict()
        config["model_type"] = name[3:]
        return config
    from tutor.model_files import read_model_config

    return read_model_config(name).config


def measure(torch, config: dict, *, seq: int, batches: list[int]) -> dict:
    """The real loop: prefill seconds at batch 1, decode seconds per step at each batch (medians, CPU time)."""
    from tutor.bench.step_verify import CLOCK, tiny_model  # noqa: F401  (tiny_model's attention fallback)
    from transformers import AutoConfig, AutoModelForCausalLM

    hf = AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
    try:
        hf._attn_implementation = "sdpa"
        model = AutoModelForCausalLM.from_config(hf, dtype=torch.float32)
    except ValueError:
        hf._attn_implementation = "eager"
        model = AutoModelForCausalLM.from_config(hf, dtype=torch.float32)
    model = model.float().eval()
    vocab = config["vocab_size"]
    out = {}
    with torch.no_grad():
        ids = torch.randint(0, vocab, (1, seq))
        model(input_ids=ids, use_cache=True, logits_to_keep=1)
        times = []
        for _ in range(PREFILL_REPEATS):
            start = CLOCK()
            model(input_ids=ids, use_cache=True, logits_to_keep=1)
            times.append(CLOCK() - start)
        out["prefill"] = statistics.median(times)
        for batch in batches:
            ids = torch.randint(0, vocab, (batch, seq))
            result = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            cache, token = result.past_key_values, ids[:, -1:]
            times = []
            for index in range(DECODE_STEPS + 2):
                start = CLOCK()
                result = model(input_ids=token, past_key_values=cache, use_cache=True)
                elapsed = CLOCK() - start
                cache = result.past_key_values
                if index >= 2:
                    times.append(elapsed)
            out[f"decode@{batch}"] = statistics.median(times)
    return out


def predict(path: Path, *, seq: int, batches: list[int]) -> dict:
    from tutor.fit_answer import fit_model
    from tutor.theory.fit import FitRequest
    from tutor.time_answer import time_report

    found = fit_model(str(path), None)
    request = FitRequest(mode="inference", batch=1, seq_len=seq, dtype="fp32")
    report = time_report(found.arch, request, "cpu", name=found.name, source=found.source,
                         config=found.found.config if found.found is not None else None)
    out = {"prefill": report["prefill"]["seconds"], "framework": report["sources"]["framework"]}
    for batch in batches:
        row = next(r for r in report["decode"] if r["engine"] == "eager" and r["batch"] == batch) \
            if batch in (1, 8, 32, 128) else None
        if row is None:
            raise SystemExit(f"batch {batch} is not one of time's decode batches")
        out[f"decode@{batch}"] = row["seconds_per_step"]
        out[f"host@{batch}"] = row["host_share"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--size", default="medium", help="a size of tutor.bench.step_verify.SIZES")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--no-bench", action="store_true",
                        help="use the bench run already in $TENSOR_TUTOR_DATA_DIR (default: a fresh one-thread run)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    warnings.filterwarnings("ignore")
    if not os.environ.get("TENSOR_TUTOR_DATA_DIR"):
        os.environ["TENSOR_TUTOR_DATA_DIR"] = tempfile.mkdtemp(prefix="tt-time-inf-")
    if not args.no_bench:
        started = time.perf_counter()
        subprocess.run(["taskset", "-c", "0", sys.executable, "-m", "tutor", "bench", "--quick", "--json"],
                       check=True, stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
        print(f"bench --quick on one core: {time.perf_counter() - started:.0f} s "
              f"(data in {os.environ['TENSOR_TUTOR_DATA_DIR']})")
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    from tutor.bench.step_verify import SIZES, sized_config

    layers, hidden, heads, seq, _batch, vocab = SIZES[args.size]
    header = f"{'model':<20} {'prefill':>8}" + "".join(f" {'decode@' + str(b):>9} {'host':>5}" for b in batches)
    print(header + "   (measured / predicted; host: the host's code's share of the predicted eager step)")
    worst = {"prefill": 1.0, "decode": 1.0}
    for name in args.models.split(","):
        try:
            config = sized_config(family_config(name), layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab)
            folder = Path(tempfile.mkdtemp(prefix="tt-arch-"))
            (folder / "config.json").write_text(json.dumps(config))
            predicted = predict(folder / "config.json", seq=seq, batches=batches)
            measured = measure(torch, config, seq=seq, batches=batches)
        except Exception as error:  # one family that does not build must not hide the others
            print(f"{name:<20} failed: {type(error).__name__}: {str(error)[:150]}")
            continue
        ratios = {key: measured[key] / predicted[key] for key in measured}
        if args.json:
            print(json.dumps({"model": name, "measured": measured, "predicted": predicted, "ratios": ratios}))
            continue
        worst["prefill"] = max(worst["prefill"], ratios["prefill"], 1 / ratios["prefill"])
        line = f"{name:<20} {ratios['prefill']:8.3f}"
        for batch in batches:
            ratio = ratios[f"decode@{batch}"]
            worst["decode"] = max(worst["decode"], ratio, 1 / ratio)
            line += f" {ratio:9.3f} {predicted[f'host@{batch}']:5.0%}"
        print(line)
    if not args.json:
        print(f"worst factor: prefill {worst['prefill']:.3f} (goal 1.20), decode {worst['decode']:.3f} (goal 1.25)")


if __name__ == "__main__":
    main()
