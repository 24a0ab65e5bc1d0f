#!/usr/bin/env bash
# The first run on a machine with NVIDIA GPUs and no network: every GPU path once, then the whole test suite,
# each step under its own timeout and all of them under BUDGET_S (540 s), with a summary of what passed and
# each of our figures beside a plain torch (or NVML) loop as a ratio (~1 is the goal).
#
#   bash benchmarks/gpu_wheels.sh                 # once, where an index is reachable: benchmarks/wheelhouse/
#   bash benchmarks/gpu_first_run.sh              # on the GPU machine, from a copy of this tree + the wheelhouse
#   bash benchmarks/gpu_first_run.sh --dry-run    # the same up to "no CUDA GPU", then exit 0 (CI)
#
# PYTHON: the machine's own Python with its CUDA torch (default /opt/torch/.venv/bin/python3 if it exists,
# else python3). It is never changed: a venv made from it with --system-site-packages (plus a .pth naming its
# site-packages, for when that Python is itself a venv) gets the wheelhouse with --no-index, and the project
# runs from this tree through PYTHONPATH (no build backend, nothing fetched). The wheelhouse carries the test
# runner the project pins (pytest and its plugins), installed into the venv over whatever pytest the image has.
# OUT: the folder for the results (default a new folder under /tmp): summary.json, summary.txt, steps.log
# (every step's command, timeout, exit status and output), outputs.json (each step's JSON output),
# image-packages.json and kit-packages.json (every distribution the machine's Python and the kit's venv see,
# in import order) and, from the whole-suite step, pytest-junit.xml (every test, tracebacks kept),
# pytest-failures.txt (the failures, short) and pytest-output.txt (pytest's own output).
# The whole-suite step comes last: KIT_SUITE=tests/test_x.py for part of it, KIT_SUITE_WORKERS (default auto),
# KIT_TEST_TIMEOUT (per test, default 100 s). The dry run skips it; without a GPU (not dry) it still runs,
# then the kit exits 2.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
DRY_RUN=0
[ "${1:-}" = "--dry-run" ] && DRY_RUN=1
if [ -n "${PYTHON:-}" ]; then MACHINE_PYTHON=$PYTHON
elif [ -x /opt/torch/.venv/bin/python3 ]; then MACHINE_PYTHON=/opt/torch/.venv/bin/python3
else MACHINE_PYTHON=python3; fi
WHEELHOUSE=${WHEELHOUSE:-$ROOT/benchmarks/wheelhouse}
OUT=${OUT:-$(mktemp -d -t tensor-tutor-gpu-XXXX)}
mkdir -p "$OUT"
WORK=$(mktemp -d -t tt-kit-XXXX)   # each step's raw output; only the four files above go to OUT
VENV=${KIT_VENV:-$WORK/venv}
BUDGET_S=${BUDGET_S:-540}
T0=$(date +%s)
LOG=$OUT/steps.log
: >"$LOG"
STEPS=()
declare -A STATUS SECS LIMIT

say() { echo "$*" | tee -a "$LOG" >&2; }

record() {  # record NAME STATUS SECONDS LIMIT
    STEPS+=("$1"); STATUS[$1]=$2; SECS[$1]=$3; LIMIT[$1]=$4
    printf '%s\t%s\t%s\t%s\n' "$1" "$3" "$4" "$2" >>"$WORK/steps.tsv"
}

step() {  # step NAME TIMEOUT_S COMMAND...: its own timeout, clamped to what is left of BUDGET_S
    local name=$1 limit=$2; shift 2
    local left=$(( BUDGET_S - ($(date +%s) - T0) ))
    (( limit > left )) && limit=$left
    if (( limit < 5 )); then
        say "== $name: skipped (the run's $BUDGET_S s are spent)"
        record "$name" "skipped (out of time)" 0 0
        return
    fi
    echo "== $name (timeout $limit s): $*" >&2
    local start=$(date +%s)
    STEP_LIMIT=$limit timeout -k 5 "$limit" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err"
    local rc=$? status=ok
    (( rc == 124 || rc == 137 )) && status="timed out after $limit s"
    (( rc != 0 && rc != 124 && rc != 137 )) && status="FAILED (rc $rc)"
    local taken=$(( $(date +%s) - start ))
    { echo "== $name (timeout $limit s, $taken s, $status): $*"
      grep -qs '^{' "$WORK/$name.out" && echo "-- stdout: JSON (outputs.json)" || { echo "-- stdout:"; tail -n 60 "$WORK/$name.out"; }
      echo "-- stderr:"; tail -n 60 "$WORK/$name.err"; } >>"$LOG"
    record "$name" "$status" "$taken" "$limit"
}

skip() { say "== $1: skipped ($2)"; record "$1" "skipped ($2)" 0 0; }

finish() {  # finish EXIT_CODE: the summary into OUT, then exit
    env -u PYTHONPATH "$MACHINE_PYTHON" "$ROOT/benchmarks/gpu_summary.py" "$WORK" "$OUT" "$BUDGET_S" \
        "$WHEELHOUSE/image.txt" | tee -a "$LOG"
    rm -rf "$WORK"
    exit "$1"
}

packages_json() {  # packages_json PYTHON FILE: every distribution that Python sees, in sys.path order
    env -u PYTHONPATH "$1" - "$2" <<'PY'
import json, platform, re, sys
from importlib import metadata
rows, seen = [], set()
for dist in metadata.distributions():  # sys.path order: the first of a name is the one imported
    name = dist.metadata["Name"] or "?"
    key = re.sub(r"[-_.]+", "-", name).lower()
    rows.append({"name": name, "version": dist.version, "location": str(dist.locate_file("")),
                 "imported": key not in seen})
    seen.add(key)
json.dump({"python": sys.executable, "python_version": platform.python_version(), "prefix": sys.prefix,
           "packages": rows}, open(sys.argv[1], "w"), indent=1)
PY
}
# What the machine brings, recorded before anything is installed (an install that fails still leaves it).
packages_json "$MACHINE_PYTHON" "$OUT/image-packages.json" || say "could not list $MACHINE_PYTHON's packages"

# 1. Install the wheelhouse beside the machine's own packages (no index, no build).
install_kit() {
    if [ ! -f "$WHEELHOUSE/requirements.txt" ]; then
        echo "no wheelhouse at $WHEELHOUSE: build it with 'bash benchmarks/gpu_wheels.sh' where an index is reachable" >&2
        return 3
    fi
    "$MACHINE_PYTHON" -m venv --system-site-packages --without-pip "$VENV" || return 4
    # pip for the new venv, cheapest first: one it already sees, the machine's own (--python), else ensurepip's
    local pip=("$VENV/bin/python" -m pip)
    if ! "${pip[@]}" --version >/dev/null 2>&1; then
        if "$MACHINE_PYTHON" -m pip --python "$VENV/bin/python" --version >/dev/null 2>&1; then
            pip=("$MACHINE_PYTHON" -m pip --python "$VENV/bin/python")
        else
            "$VENV/bin/python" -m ensurepip --default-pip >/dev/null || return 5
        fi
    fi
    # A venv made from a venv sees only the base interpreter's packages: name the machine's own site dirs.
    local site
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    env -u PYTHONPATH "$MACHINE_PYTHON" -c 'import os, sys
print("\n".join(p for p in sys.path if p and os.path.isdir(p) and os.path.basename(p) in ("site-packages", "dist-packages")))' \
        >"$site/_machine_site_packages.pth"
    echo "machine site dirs: $(tr '\n' ' ' <"$site/_machine_site_packages.pth")"
    # A pin the image has at another version (its pytest) goes into the venv, ahead of the image's on sys.path.
    PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
        "${pip[@]}" install --no-index --find-links "$WHEELHOUSE" -r "$WHEELHOUSE/requirements.txt" || return
    # For the record only: what the image's own packages think of the kit's versions.
    echo "pip check:"; PIP_DISABLE_PIP_VERSION_CHECK=1 "${pip[@]}" check || true
}
export WHEELHOUSE VENV MACHINE_PYTHON WORK
export -f install_kit
step install 45 bash -c install_kit
PY="$VENV/bin/python"
[ -x "$PY" ] && packages_json "$PY" "$OUT/kit-packages.json"
export PYTHONPATH=$ROOT TENSOR_TUTOR_DATA_DIR=$WORK/data   # this tree, and a data folder of the run's own
TT="$PY -m tutor"
if [ "${STATUS[install]}" != ok ]; then
    say "the kit did not install (see $LOG): nothing else can run"
    finish 1
fi
# Every pin of the wheelhouse must be the version the kit's Python imports (not one the image has beside it).
step imports 15 "$PY" -c 'import json, platform, sys, torch, textual, textual_serve, platformdirs, pytest, syrupy, pytest_textual_snapshot, tutor
from importlib.metadata import version
pins = [line.strip().split("==") for line in open(sys.argv[1]) if "==" in line]
wrong = [f"{n} {version(n)} (the kit pins {v})" for n, v in pins if version(n) != v]
print(json.dumps({"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
      "tutor": tutor.__version__, "torch_file": torch.__file__, "textual_file": textual.__file__,
      "pytest_file": pytest.__file__,
      **{n: version(n) for n in ("textual", "textual-serve", "platformdirs", "pytest", "pytest-xdist",
                                 "pytest-timeout", "syrupy", "pytest-textual-snapshot", "transformers", "rich")},
      "not_the_kit_s": wrong}))
sys.exit("the kit imports other versions than it pins: " + "; ".join(wrong) if wrong else 0)' "$WHEELHOUSE/requirements.txt"
if [ "${STATUS[imports]}" != ok ]; then
    say "the installed kit does not import (see $LOG)"
    finish 1
fi

# The whole suite (the last step, so the GPU figures come first): stopped with SIGINT 25 s before the step's
# limit so that pytest still writes its JUnit XML; a hung test is failed after KIT_TEST_TIMEOUT.
run_suite() {
    local stop=$(( ${STEP_LIMIT:-240} - 25 ))
    (( stop < 10 )) && stop=10
    # shellcheck disable=SC2086  # KIT_SUITE: test paths, split on spaces
    timeout -s INT -k 15 "$stop" "$PY" -m pytest ${KIT_SUITE:-} -n "${KIT_SUITE_WORKERS:-auto}" -p no:randomly \
        -p no:cacheprovider --timeout "${KIT_TEST_TIMEOUT:-100}" --junitxml "$OUT/pytest-junit.xml" -rfE -q
}
export PY OUT
export -f run_suite
suite() {
    rm -f "$OUT/pytest-junit.xml"
    step pytest_full 240 bash -c run_suite
    cp "$WORK/pytest_full.out" "$OUT/pytest-output.txt" 2>/dev/null
}

GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)
if [ "$GPUS" = "0" ]; then
    if (( DRY_RUN )); then  # what pytest_gpu would collect, so a test importing what the kit lacks shows here
        step collect 60 "$PY" -m pytest --collect-only -q -m gpu -p no:cacheprovider
        [ "${STATUS[collect]}" = ok ] || { say "the test suite does not collect with the kit (see $LOG)"; finish 1; }
    fi
    say "no CUDA GPU: torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null) sees none; the kit installed offline and imports, no GPU step to run here"
    if (( DRY_RUN )); then skip pytest_full "dry run: the whole suite runs only for real"; else suite; fi
    finish $(( DRY_RUN ? 0 : 2 ))
fi
say "torch sees $GPUS CUDA GPU(s); steps under $BUDGET_S s in all"

# 2. The GPU steps (single-GPU timeouts 60+15+50+20+30+15+30+15+10+40+55+15+35+45+20 = 455 s, with install and
#    imports 515 s, then the whole suite's 240 s: BUDGET_S (540 s) clamps every step to what is left, so the
#    suite gets what the GPU steps leave: about 240 s when they take what they took last time (154 s) plus the
#    time steps' ~80 s); ours beside plain.
step pytest_gpu 60 "$PY" -m pytest -m gpu -q -rs -p no:cacheprovider
step env 15 $TT env --json --torch
step bench_quick 50 $TT bench --quick --dtype fp32,tf32,bf16,fp16,fp8 --budget 30 --json
step bench_transfer 20 $TT bench transfer --budget 10 --json
step ref_matmul 30 "$PY" benchmarks/gpu_reference.py matmul
step ref_memory 15 "$PY" benchmarks/gpu_reference.py memory
step first_number 30 "$PY" benchmarks/first_number.py --launches 2 --bench-budget 10
step fit_device_0 15 $TT fit llama-3.1-8b --device 0 --json
step ref_free 10 "$PY" benchmarks/gpu_reference.py free
step fit_trace 40 $TT fit llama-3.1-8b --mode train --recipe bf16 --device 0 --trace --json
step ref_step 55 "$PY" benchmarks/gpu_reference.py step llama-3.1-8b
# `time --device 0` from bench_quick's run, for the requests ref_step ran for real (the summary sets them side by
# side), then against transformers' own prefill and decode loop for several families, a MoE among them.
step time_8b 15 $TT time llama-3.1-8b --device 0 --seq 2048 --json
step time_verify 35 $TT time llama-3.1-8b --mode train --recipe bf16 --seq 4096 --device 0 --verify --json
step time_vs_real 45 "$PY" benchmarks/time_inference_vs_transformers.py --device cuda:0 --no-bench --budget 20 --json
step sampler 20 "$PY" benchmarks/gpu_reference.py sampler --seconds 10

# 3. With 2+ GPUs: NCCL, one GPU per rank, in whatever is left of the budget.
MULTI="collective_nccl lab_ddp lab_zero lab_pipeline lab_tensor lab_moe"
if [ "$GPUS" -ge 2 ]; then
    step collective_nccl 60 "$PY" -m torch.distributed.run --standalone --nproc-per-node="$GPUS" \
        -m tutor.bench.collective --json --budget 20 --sizes 1M,64M
    step lab_ddp 40 $TT lab ddp --json
    step lab_zero 40 $TT lab zero stage=3 --json
    step lab_pipeline 40 $TT lab pipeline --json
    step lab_tensor 40 $TT lab tensor --json
    step lab_moe 40 $TT lab moe ranks=2 --json
else
    for name in $MULTI; do skip "$name" "one GPU"; done
fi

# 4. The whole suite, last.
suite

grep -q "FAILED\|timed out" "$WORK/steps.tsv" && finish 1 || finish 0
