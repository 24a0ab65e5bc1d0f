#!/usr/bin/env bash
# CI's dry run of the offline GPU kit, on a CPU machine, so it cannot rot:
#   1. build the wheelhouse (benchmarks/gpu_wheels.sh, with the index, against benchmarks/gpu_image.txt);
#   2. stand in for the GPU image: a venv with the image's own versions from that manifest (pytest 9.1.1,
#      transformers 5.17.0, rich 15.0.0, ...), installed from the index, plus this venv's CPU torch (symlinked:
#      pip never fetches a torch) and nothing of the kit's. It is cached by the manifest's hash
#      (KIT_IMAGE_CACHE, default ~/.cache/tensor-tutor/gpu-image-HASH): the second run takes no index time.
#      A pin this Python cannot install (numpy 2.5.2 needs Python 3.12) is taken at the newest version it can,
#      said in the output;
#   3. run benchmarks/gpu_first_run.sh --dry-run against it with the network switched off (a network
#      namespace: unshare -rn, else unshare -n; where neither is allowed, --no-index and PIP_NO_INDEX alone,
#      said in the output): it installs from the wheelhouse, imports, and stops at "no CUDA GPU" with exit 0;
#   4. check that textual and pytest came from the kit's venv (pytest at the kit's pin, over the stand-in's),
#      and that the results hold both package lists.
# Run from the project's venv (pip install -e '.[test]'):  bash benchmarks/gpu_kit_dry_run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python}
MANIFEST=${IMAGE_MANIFEST:-benchmarks/gpu_image.txt}
TMP=$(mktemp -d -t tt-kit-dry-XXXX)
trap 'rm -rf "$TMP"' EXIT
started=$(date +%s)

WHEELHOUSE="$TMP/wheelhouse" IMAGE_MANIFEST="$MANIFEST" PYTHON="$PYTHON" bash benchmarks/gpu_wheels.sh

# 2. The stand-in image.
torch_version=$("$PYTHON" -c 'import torch; print(torch.__version__)')
key=$( { cat "$MANIFEST"; "$PYTHON" -VV; echo "$torch_version"; } | sha256sum | cut -c1-12)
IMAGE=${KIT_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tensor-tutor/gpu-image-$key}
if [ ! -f "$IMAGE/ready" ]; then
    rm -rf "$IMAGE"
    mkdir -p "$IMAGE/torch/site-packages"
    "$PYTHON" -m venv "$IMAGE/venv"
    # torch and what it needs, as this venv has them: symlinks in a folder named by a .pth
    "$PYTHON" - "$IMAGE/torch/site-packages" <<'PY'
import os, re, sys
from importlib import metadata
from packaging.requirements import Requirement

target = sys.argv[1]
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
seen, todo = set(), ["torch"]
while todo:
    name = norm(todo.pop())
    if name in seen:
        continue
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        continue
    seen.add(name)
    base = dist.locate_file("")
    for file in dist.files or []:
        top = file.parts[0]
        if top == ".." or top.startswith("__editable__"):
            continue
        link = os.path.join(target, top)
        if not os.path.lexists(link) and os.path.exists(os.path.join(base, top)):
            os.symlink(os.path.join(base, top), link)
    todo += [r.name for r in map(Requirement, dist.requires or []) if r.marker is None or r.marker.evaluate({"extra": ""})]
print(f"dry run: the stand-in image's torch {metadata.version('torch')} with {len(seen) - 1} distributions it needs")
PY
    site=$("$IMAGE/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$IMAGE/torch/site-packages" >"$site/_torch.pth"
    # The manifest's pins, torch aside (the one above stands in; the constraint keeps pip off any other).
    grep -v '^\s*#' "$MANIFEST" | sed 's/#.*//; /^\s*$/d' | grep -viE '^(torch|triton|nvidia-[a-z0-9-]*-cu[0-9]+)\b' >"$IMAGE/pins.txt" || true
    echo "torch==$torch_version" >"$IMAGE/constraints.txt"
    pip_image=("$IMAGE/venv/bin/python" -m pip --disable-pip-version-check)
    if ! "${pip_image[@]}" install --quiet -c "$IMAGE/constraints.txt" -r "$IMAGE/pins.txt" 2>"$IMAGE/pip.err"; then
        # Which pins this Python cannot take: each of those at the newest version it can.
        while read -r pin; do
            if ! "${pip_image[@]}" install --quiet --dry-run --no-deps "$pin" 2>/dev/null; then
                echo "dry run: $pin does not install on $("$PYTHON" -V): the stand-in takes the newest ${pin%%==*} it can" >&2
                sed -i "s/^${pin}\$/${pin%%==*}/" "$IMAGE/pins.txt"
            fi
        done < <(grep '==' "$IMAGE/pins.txt")
        "${pip_image[@]}" install --quiet -c "$IMAGE/constraints.txt" -r "$IMAGE/pins.txt"
    fi
    touch "$IMAGE/ready"
fi
"$IMAGE/venv/bin/python" - <<'PY'
from importlib.metadata import version
names = ("pytest", "transformers", "rich", "numpy", "torch")
print("dry run: the stand-in image has " + ", ".join(f"{n} {version(n)}" for n in names))
PY
if "$IMAGE/venv/bin/python" -c 'import textual' 2>/dev/null; then
    echo "dry run: the stand-in image can import textual: it would not test the kit" >&2
    exit 1
fi

# 3. No network for the install: a network namespace where the CI user may make one.
if unshare -rn true 2>/dev/null; then OFFLINE=(unshare -rn); how="unshare -rn (a network namespace with no interfaces up)"
elif unshare -n true 2>/dev/null; then OFFLINE=(unshare -n); how="unshare -n (a network namespace with no interfaces up)"
else OFFLINE=(env); how="--no-index and PIP_NO_INDEX only (this user may not create a network namespace)"; fi
echo "dry run: offline by $how"
env -u PYTHONPATH PIP_NO_INDEX=1 PYTHON="$IMAGE/venv/bin/python" WHEELHOUSE="$TMP/wheelhouse" KIT_VENV="$TMP/kit" \
    OUT="$TMP/out" "${OFFLINE[@]}" bash benchmarks/gpu_first_run.sh --dry-run

# 4. What the kit must have done.
grep -q "no CUDA GPU" "$TMP/out/steps.log"
for file in image-packages.json kit-packages.json; do
    [ -s "$TMP/out/$file" ] || { echo "dry run: the results lack $file" >&2; exit 1; }
done
env -u PYTHONPATH "$TMP/kit/bin/python" - "$TMP/kit" "$TMP/wheelhouse/requirements.txt" <<'PY'
import sys
import pytest, textual
from importlib.metadata import version
kit, pins = sys.argv[1], dict(line.strip().split("==") for line in open(sys.argv[2]) if "==" in line)
for module in (textual, pytest):
    if not module.__file__.startswith(kit + "/"):
        sys.exit(f"dry run: {module.__name__} came from {module.__file__}, not from the kit's venv")
if version("pytest") != pins["pytest"]:
    sys.exit(f"dry run: the kit's Python runs pytest {version('pytest')}, not the kit's {pins['pytest']}")
print(f"dry run: the kit's venv runs its own pytest {version('pytest')} and textual {version('textual')}")
PY
echo "dry run: passed in $(( $(date +%s) - started )) s; files in OUT: $(ls "$TMP/out" | tr '\n' ' ')"
