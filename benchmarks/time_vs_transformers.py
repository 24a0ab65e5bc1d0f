"""`tensor-tutor time --verify` at several architectures and sizes: measured / predicted, per phase.

    python benchmarks/time_vs_transformers.py [--models llama-3.2-1b,gpt2,qwen3-0.6b] [--sizes small,medium,large]
                                              [--recipe fp32|lora]

For each preset and size: the architecture scaled down (tutor.trace.step_verify.SIZES), the ceilings
measured at its own shapes in the same process, then training steps, a prefill and decode steps, in
rounds (ceilings, steps, three times). Prints measured / predicted for the step and each phase
(forward, backward, optimizer), the prefill and the decode tokens per second. Goals: step
within 15% (1.00 +- 0.15), phases within 25%, decode tokens/s within 15%. Times are this thread's CPU
time with torch on one thread (the machine may be shared); the wall-clock step is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama-3.2-1b,gpt2,qwen3-0.6b")
    parser.add_argument("--sizes", default="small,medium,large")
    parser.add_argument("--recipe", default="fp32", choices=("fp32", "lora"),
                        help="full fp32 training, or LoRA r=16 on a frozen fp32 base (training step only)")
    parser.add_argument("--json", action="store_true", help="one JSON object per run")
    args = parser.parse_args()

    from tutor.trace.step_verify import run_verification
    from tutor.files.models import read_model_config

    print(f"{'model':<14} {'size':<7} {'step':>6} {'fwd':>6} {'bwd':>6} {'opt':>6} {'prefill':>8} {'decode t/s':>10} "
          f"{'min t/s':>8} {'wall s':>7}  (measured / predicted; decode: measured median / predicted tokens/s, "
          "then the fastest step's)")
    for model in args.models.split(","):
        for size in args.sizes.split(","):
            start = time.perf_counter()
            result = run_verification(read_model_config(model).config, size, recipe=args.recipe)
            if args.json:
                print(json.dumps({"preset": model, **result}))
                continue
            ratio = lambda row: row["measured_s"] / row["predicted_s"]  # noqa: E731
            phases = result["phases"]
            if "decode" not in result:  # LoRA: the training step only
                print(f"{model:<14} {size:<7} {ratio(result):6.3f} {ratio(phases['forward']):6.3f} "
                      f"{ratio(phases['backward']):6.3f} {ratio(phases['optimizer']):6.3f} {'-':>8} {'-':>10} {'-':>8} "
                      f"{result['measured_wall_s']:7.3f}  [{time.perf_counter() - start:.0f} s] {result['scaled']}")
                continue
            decode = result["decode"]
            print(f"{model:<14} {size:<7} {ratio(result):6.3f} {ratio(phases['forward']):6.3f} "
                  f"{ratio(phases['backward']):6.3f} {ratio(phases['optimizer']):6.3f} {ratio(result['prefill']):8.3f} "
                  f"{decode['measured_tokens_per_second'] / decode['predicted_tokens_per_second']:10.3f} "
                  f"{decode['measured_min_tokens_per_second'] / decode['predicted_tokens_per_second']:8.3f} "
                  f"{result['measured_wall_s']:7.3f}  [{time.perf_counter() - start:.0f} s] {result['scaled']}")


if __name__ == "__main__":
    main()
