"""Plain torch (and plain NVML) reference loops for benchmarks/gpu_first_run.sh: nothing of tensor-tutor's.

Each subcommand prints one JSON object; the first-run script sets tensor-tutor's figure beside it as a
ratio (ours / plain, ~1 is the goal).

    python benchmarks/gpu_reference.py matmul [--dtypes fp32,tf32,bf16,fp16,fp8] [--n 8192]
    python benchmarks/gpu_reference.py memory            # device copy (HBM) and pinned H2D / D2H, GB/s
    python benchmarks/gpu_reference.py free              # the driver's free memory: torch.cuda.mem_get_info and NVML
    python benchmarks/gpu_reference.py step MODEL [--seq 4096] [--batch 1]
                                                         # a real bf16 training step of a preset on cuda:0:
                                                         # torch.cuda.max_memory_allocated
    python benchmarks/gpu_reference.py sampler [--seconds 10]
                                                         # tensor-tutor's live sampler and a plain NVML poll,
                                                         # side by side, while a matmul loop loads GPU 0

Timing: CUDA events around `iters` launches after warm-up, best of 3 repeats (the best, as vendors
quote peaks). FLOPs 2 n^3 per matmul; a copy moves 2 x bytes (read + write).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _timed(torch, fn, iters: int, repeats: int = 3) -> float:
    """Best seconds per call over `repeats` runs of `iters` calls, after 3 warm-up calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        stop.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(stop) / 1e3 / iters)
    return best


def matmul(dtypes: list[str], n: int) -> dict:
    import torch

    out = {}
    for name in dtypes:
        torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
        try:
            if name == "fp8":
                a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
                b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()  # _scaled_mm: column-major B
                one = torch.ones((), device="cuda")
                fn = lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
            else:
                dtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
                         "fp16": torch.float16}[name]
                a, b = (torch.randn(n, n, device="cuda", dtype=dtype) for _ in range(2))
                fn = lambda: a @ b  # noqa: E731
            seconds = _timed(torch, fn, iters=20)
            out[name] = {"tflops": 2 * n**3 / seconds / 1e12, "n": n}
        except (RuntimeError, TypeError, AttributeError) as error:  # fp8 needs sm_89+ and a torch with _scaled_mm
            out[name] = {"error": str(error).splitlines()[0][:200]}
    torch.backends.cuda.matmul.allow_tf32 = False
    return {"matmul": out, "torch": torch.__version__}


def memory() -> dict:
    import torch

    x = torch.empty(2**28, device="cuda", dtype=torch.float32)  # 1 GiB
    y = torch.empty_like(x)
    copy_s = _timed(torch, lambda: y.copy_(x), iters=10)
    host = torch.empty(2**26, dtype=torch.float32, pin_memory=True)  # 256 MiB pinned
    dev = torch.empty(2**26, device="cuda", dtype=torch.float32)
    h2d_s = _timed(torch, lambda: dev.copy_(host, non_blocking=True), iters=10)
    d2h_s = _timed(torch, lambda: host.copy_(dev, non_blocking=True), iters=10)
    nbytes, small = x.numel() * 4, host.numel() * 4
    return {"copy_gbps": 2 * nbytes / copy_s / 1e9, "h2d_gbps": small / h2d_s / 1e9,
            "d2h_gbps": small / d2h_s / 1e9, "copy_bytes": nbytes, "transfer_bytes": small}


def free() -> dict:
    import torch

    free_b, total_b = torch.cuda.mem_get_info(0)
    out = {"torch_free_bytes": free_b, "torch_total_bytes": total_b}
    try:
        import pynvml

        pynvml.nvmlInit()
        info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))
        out.update(nvml_free_bytes=int(info.free), nvml_total_bytes=int(info.total))
        pynvml.nvmlShutdown()
    except Exception as error:  # noqa: BLE001 - a reference: whatever NVML says is reported, not raised
        out["nvml_error"] = str(error)[:200]
    return out


def step(model: str, seq: int, batch: int, device: str = "cuda") -> dict:
    """One real training step of `model` (a preset name) as `fit --recipe bf16 --trace` builds it:
    bf16 weights, SDPA, Adam (torch's default foreach on CUDA), labels = ids; the peak of step 2.
    (`--device cpu` runs the same code for a smoke test, without the CUDA memory figures.)"""
    import torch
    import transformers

    config = json.loads((ROOT / "tutor" / "presets" / f"{model}.json").read_text())
    fields = {k: v for k, v in config.items() if k != "model_type"}
    hf_config = transformers.AutoConfig.for_model(config["model_type"], **fields)
    started = time.perf_counter()
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with torch.device(device):
        try:
            net = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16,
                                                                attn_implementation="sdpa")
        except TypeError:  # transformers 4.x names it torch_dtype
            net = transformers.AutoModelForCausalLM.from_config(hf_config, torch_dtype=torch.bfloat16,
                                                                attn_implementation="sdpa")
    net.config.use_cache = False
    net.train()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-5)
    ids = torch.randint(0, hf_config.vocab_size, (batch, seq), device=device)
    built = time.perf_counter()
    seconds = []
    for i in range(2):  # the first step creates Adam's states; the second is the steady state fit describes
        if i == 1:
            sync()
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated() if cuda else None
        t0 = time.perf_counter()
        loss = net(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss
        sync()
        seconds.append(time.perf_counter() - t0)
    params = sum(p.numel() for p in net.parameters())
    peak, reserved = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()) if cuda else (None, None)
    del optimizer  # its state is the training step's, not the inference's
    inference = eager_inference(torch, net, hf_config.vocab_size, device, sync, prompt=min(PROMPT, seq))
    return {"model": model, "params": params, "seq": seq, "batch": batch, "train": {"median_s": seconds[-1]},
            **inference,
            "max_memory_allocated_bytes": peak,
            "allocated_before_step_bytes": before,
            "max_memory_reserved_bytes": reserved, "device": device,
            "build_s": built - started, "step_s": seconds, "torch": torch.__version__,
            "transformers": transformers.__version__}


PROMPT = 2048
DECODE_BATCHES = (1, 8)
DECODE_STEPS = 16


def eager_inference(torch, net, vocab: int, device: str, sync, prompt: int = PROMPT) -> dict:
    """After the training steps, the same model as `generate` runs it: a prefill of `prompt` tokens (logits of the
    last position), then decode steps of one token per sequence on transformers' DynamicCache, at batch 1 and 8
    (medians, wall clock after the queue drains). The optimizer's state is dropped first."""
    import statistics

    net.zero_grad(set_to_none=True)
    net.eval()
    net.config.use_cache = True
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    out: dict = {"decode": {}}
    with torch.no_grad():
        ids = torch.randint(0, vocab, (1, prompt), device=device)
        times = []
        for index in range(4):
            sync()
            t0 = time.perf_counter()
            net(input_ids=ids, use_cache=True, logits_to_keep=1)
            sync()
            if index:
                times.append(time.perf_counter() - t0)
        out["prefill"] = {"tokens": prompt, "median_s": statistics.median(times), "all_s": times}
        for batch in DECODE_BATCHES:
            ids = torch.randint(0, vocab, (batch, prompt), device=device)
            cache = net(input_ids=ids, use_cache=True, logits_to_keep=1).past_key_values
            token, steps = ids[:, -1:], []
            for index in range(DECODE_STEPS + 2):
                sync()
                t0 = time.perf_counter()
                cache = net(input_ids=token, past_key_values=cache, use_cache=True).past_key_values
                sync()
                if index >= 2:
                    steps.append(time.perf_counter() - t0)
            out["decode"][str(batch)] = {"context": prompt, "median_step_s": statistics.median(steps)}
            del cache
    return out


def sampler(seconds: float) -> dict:
    """Load GPU 0 with a bf16 matmul loop; meanwhile tensor-tutor's Sampler runs at its own rate and a
    plain NVML loop polls at 4 Hz; both series' means are reported (ratio ours / plain ~1)."""
    import pynvml
    import torch

    sys.path.insert(0, str(ROOT))
    from tutor.hardware.sampler import Sampler

    stop = threading.Event()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def load() -> None:
        while not stop.is_set():
            for _ in range(20):
                a @ a
            torch.cuda.synchronize()

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    time.sleep(1.0)  # the load is running before either sampler starts
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    plain: list[tuple[float, float, float]] = []
    ours = Sampler(interval_s=0.25)
    ours.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
        clock = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
        power = pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3
        plain.append((float(util), float(clock), float(power)))
        time.sleep(0.25)
    ours.stop()
    stop.set()
    loader.join(timeout=10)
    pynvml.nvmlShutdown()
    samples = [s for s in ours.samples() if s.gpus]
    gpu0 = [next((g for g in s.gpus if g.index == 0 and g.mig_index is None), None) for s in samples]
    gpu0 = [g for g in gpu0 if g is not None]

    def mean(values):
        values = [v for v in values if v is not None]
        return sum(values) / len(values) if values else None

    return {"seconds": seconds, "ours": {"samples": len(samples), "utilization_pct": mean(g.utilization_pct for g in gpu0),
                                         "sm_clock_mhz": mean(g.sm_clock_mhz for g in gpu0),
                                         "power_w": mean(g.power_w for g in gpu0)},
            "plain": {"samples": len(plain), "utilization_pct": mean(p[0] for p in plain),
                      "sm_clock_mhz": mean(p[1] for p in plain), "power_w": mean(p[2] for p in plain)}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    m = sub.add_parser("matmul")
    m.add_argument("--dtypes", default="fp32,tf32,bf16,fp16,fp8")
    m.add_argument("--n", type=int, default=8192)
    sub.add_parser("memory")
    sub.add_parser("free")
    s = sub.add_parser("step")
    s.add_argument("model")
    s.add_argument("--seq", type=int, default=4096)
    s.add_argument("--batch", type=int, default=1)
    s.add_argument("--device", default="cuda")
    p = sub.add_parser("sampler")
    p.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    if args.what == "matmul":
        result = matmul(args.dtypes.split(","), args.n)
    elif args.what == "memory":
        result = memory()
    elif args.what == "free":
        result = free()
    elif args.what == "step":
        result = step(args.model, args.seq, args.batch, args.device)
    else:
        result = sampler(args.seconds)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
