#!/usr/bin/env bash
# The first run on a machine with NVIDIA GPUs: every GPU path once, in under 10 minutes, with a
# summary of what passed and our measurements against a plain torch loop (ratio ~1 is the goal).
#   bash benchmarks/gpu_first_run.sh            (PYTHON=... to pick the interpreter; OUT=... for the logs)
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
OUT=${OUT:-$(mktemp -d -t tensor-tutor-gpu-XXXX)}
mkdir -p "$OUT"
TT="$PYTHON -m tutor"
[ -f tutor/__main__.py ] || TT="tensor-tutor"
declare -A STATUS SECONDS_TAKEN

step() {  # step NAME TIMEOUT_S COMMAND...: output in $OUT/NAME.out, stderr in $OUT/NAME.err
    local name=$1 limit=$2; shift 2
    local start=$(date +%s)
    echo "== $name: $*" >&2
    timeout "$limit" "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
    local rc=$?
    SECONDS_TAKEN[$name]=$(( $(date +%s) - start ))
    STATUS[$name]=$([ $rc -eq 0 ] && echo ok || echo "FAILED (rc $rc, see $OUT/$name.err)")
}

GPUS=$($PYTHON -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)
if [ "$GPUS" = "0" ]; then echo "torch sees no CUDA GPU: nothing to verify here" >&2; exit 2; fi

step pytest_gpu 240 $PYTHON -m pytest -m gpu -q -p no:cacheprovider
step env 60 $TT env --json --torch
step bench_quick 120 $TT bench --quick --json
step lab_matmul 90 $TT lab matmul --json
step fit_device_0 60 $TT fit llama-3.1-8b --device 0 --json
step reference_loop 90 $PYTHON - <<'PY'
# A plain torch loop, nothing of ours: bf16 matmul TFLOP/s and device copy GB/s on cuda:0.
import json, torch
torch.backends.cuda.matmul.allow_tf32 = False
n, iters = 8192, 50
a, b = (torch.randn(n, n, device="cuda:0", dtype=torch.bfloat16) for _ in range(2))
start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
for _ in range(5): a @ b
torch.cuda.synchronize(); start.record()
for _ in range(iters): a @ b
stop.record(); torch.cuda.synchronize()
tflops = 2 * n**3 * iters / (start.elapsed_time(stop) / 1e3) / 1e12
x = torch.empty(2**28, device="cuda:0", dtype=torch.float32); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize(); start.record()
for _ in range(20): y.copy_(x)
stop.record(); torch.cuda.synchronize()
gbps = 2 * x.numel() * 4 * 20 / (start.elapsed_time(stop) / 1e3) / 1e9
print(json.dumps({"bf16_tflops": tflops, "copy_gbps": gbps}))
PY
if [ "$GPUS" -ge 2 ]; then
    step collective_nccl 120 $PYTHON -m torch.distributed.run --standalone --nproc-per-node="$GPUS" \
        -m tutor.bench.collective --json --budget 30 --sizes 1M,64M,256M
else
    STATUS[collective_nccl]="skipped (one GPU)"; SECONDS_TAKEN[collective_nccl]=0
fi
# Issue 9: the app's first number (lesson 1 through the measurement worker) against `bench matmul`.
step first_number 180 $PYTHON benchmarks/first_number.py --launches 3
# Issue 10: the multi-rank labs on NCCL, one GPU per rank (they pick NCCL when every rank has a GPU).
MULTI_RANK_LABS="lab_ddp lab_zero lab_pipeline lab_tensor lab_moe"
if [ "$GPUS" -ge 2 ]; then
    step lab_ddp 120 $TT lab ddp --json
    step lab_zero 120 $TT lab zero stage=3 --json
    step lab_pipeline 120 $TT lab pipeline --json
    step lab_tensor 120 $TT lab tensor --json
    step lab_moe 120 $TT lab moe ranks=2 --json
else
    for name in $MULTI_RANK_LABS; do STATUS[$name]="skipped (one GPU)"; SECONDS_TAKEN[$name]=0; done
fi

{ for name in pytest_gpu env bench_quick lab_matmul fit_device_0 reference_loop collective_nccl first_number $MULTI_RANK_LABS; do
      echo "$name	${SECONDS_TAKEN[$name]}	${STATUS[$name]}"; done; } >"$OUT/steps.tsv"

OUT="$OUT" $PYTHON - <<'PY'
import json, os
out = os.environ["OUT"]
def load(name, lines=False):
    try:
        text = open(os.path.join(out, f"{name}.out")).read()
        return [json.loads(l) for l in text.splitlines() if l.strip().startswith("{")] if lines else json.loads(text)
    except Exception:
        return None
print(f"\nGPU first run: logs in {out}")
for line in open(os.path.join(out, "steps.tsv")):
    name, seconds, status = line.rstrip("\n").split("\t")
    print(f"  {name:16} {seconds:>4} s  {status}")
env, bench, lab, fit, ref = load("env"), load("bench_quick"), load("lab_matmul"), load("fit_device_0"), load("reference_loop")
if env:
    for gpu in env.get("gpus", []):
        print(f"  NVML GPU {gpu['index']}: {gpu['name']} {gpu['uuid']} mig={gpu.get('mig_enabled')} "
              f"clock events={gpu.get('clock_event_reasons')} N/A={sorted(gpu.get('unavailable', {}))}")
    print(f"  torch vs NVML: {(env.get('torch') or {}).get('disagreement') or 'agree'}")
def ratio(ours, theirs):
    return f"{ours / theirs:.2f}" if ours and theirs else "n/a"
if ref:
    results = (bench or {}).get("results", []) if isinstance(bench, dict) else []
    bf16 = next((r for r in results if r.get("kind") == "matmul" and r.get("dtype") == "bf16"), {})
    copy = next((r for r in results if r.get("op") == "copy"), {})
    print(f"  bf16 matmul: bench {bf16.get('tflops_best')} TFLOP/s vs plain torch {ref['bf16_tflops']:.1f}: "
          f"ratio {ratio(bf16.get('tflops_best'), ref['bf16_tflops'])} (peak {bf16.get('peak_tflops')})")
    print(f"  device copy: bench {copy.get('gbps_best')} GB/s vs plain torch {ref['copy_gbps']:.0f}: "
          f"ratio {ratio(copy.get('gbps_best'), ref['copy_gbps'])}")
if lab:
    print(f"  lab matmul: {lab.get('summary')}")
if fit:
    device = fit.get("device") or {}
    print(f"  fit --device 0: {device.get('name')} capacity {device.get('capacity_bytes')} B "
          f"({device.get('source')}); verdict {fit.get('verdict', fit.get('fits'))}")
for row in (load("collective_nccl") or {}).get("results", []):  # one JSON object: {"device", "results"}
    print(f"  nccl {row.get('op'):15} {row.get('bytes'):>12} B busbw {row.get('busbw_gbps')} GB/s")
PY
grep -q FAILED "$OUT/steps.tsv" && exit 1 || exit 0
