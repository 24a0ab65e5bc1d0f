"""The README's pictures, from real runs on this machine: docs/pictures/*.svg.

    python benchmarks/readme_pictures.py [--out docs/pictures] [--budget 30]

- memory-timeline.svg: one bf16 training step of the small Llama of benchmarks/fit_vs_transformers.py
  (random weights, CPU, transformers' own code), measured storage by storage at every decoder layer's
  boundary (tutor.trace.memory_trace.measure_training_timeline), drawn over the timeline fit predicts
  for it (tutor.theory.fit_timeline.training_timeline);
- prefill-timeline.svg: the same model's prefill (generate()'s call), measured
  (measure_prefill_timeline) over fit's prefill_timeline;
- bandwidth-sweep.svg: `tensor-tutor bench bandwidth --budget N --svg ...`, the STREAM-like sweep
  from below L1 to beyond the last-level cache with the caches `env` reports, run as a user runs it
  (its results go to a temporary data folder, not the notebook).

Each SVG holds the picture and its table, as `--svg` writes them (tutor.answers.pictures.save_svg). The numbers
are this machine's: rerun the script to redraw them; the README shows them by relative path.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def memory_timelines(out: Path) -> list[Path]:
    import torch

    from benchmarks.fit_vs_transformers import BATCH, CONFIGS, SEQ_LEN, architecture_for, build_model, fit_request
    from tutor.trace.memory_trace import measure_prefill_timeline, measure_training_timeline, token_ids, training_step
    from tutor.answers.pictures import save_svg, timeline_chart
    from tutor.theory.fit_timeline import prefill_timeline, training_timeline

    written = []
    run = CONFIGS["bf16"]
    hf_config, model = build_model("llama", run)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = token_ids(model.config.vocab_size, BATCH, SEQ_LEN, seed=1)
    training_step(model, optimizer, ids, labels=ids)  # the optimizer states exist: the steady state
    measured, step = measure_training_timeline(model, optimizer, ids, labels=ids)
    arch, _ = architecture_for("llama", hf_config)
    predicted = training_timeline(arch, fit_request(run, "hf", attention=model.config._attn_implementation))
    chart = timeline_chart([m.to_json() for m in predicted], [m.to_json() for m in measured], step.peak.bytes)
    written.append(save_svg([chart], out / "memory-timeline.svg"))

    run = CONFIGS["inference"]
    hf_config, model = build_model("llama", run)
    ids = token_ids(model.config.vocab_size, BATCH, SEQ_LEN, seed=1)
    measured, prefill = measure_prefill_timeline(model, ids)
    arch, _ = architecture_for("llama", hf_config)
    predicted = prefill_timeline(arch, fit_request(run, "hf", attention=model.config._attn_implementation))
    chart = timeline_chart([m.to_json() for m in predicted], [m.to_json() for m in measured], prefill.peak.bytes)
    written.append(save_svg([chart], out / "prefill-timeline.svg"))
    return written


def bandwidth_sweep(out: Path, budget: float) -> Path:
    target = out / "bandwidth-sweep.svg"
    with tempfile.TemporaryDirectory() as data:
        env = {**os.environ, "TENSOR_TUTOR_DATA_DIR": data, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
        subprocess.run([sys.executable, "-m", "tutor", "bench", "bandwidth", "--budget", f"{budget:g}",
                        "--svg", str(target)], check=True, env=env, stdout=subprocess.DEVNULL)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "pictures", help="folder for the SVG files")
    parser.add_argument("--budget", type=float, default=30.0, help="seconds for the bandwidth sweep (default 30)")
    options = parser.parse_args(argv)
    options.out.mkdir(parents=True, exist_ok=True)
    for path in [*memory_timelines(options.out), bandwidth_sweep(options.out, options.budget)]:
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
