#!/usr/bin/env bash
# CI's dry run of the offline GPU kit, on a CPU machine, so it cannot rot (issue 23):
#   1. build the wheelhouse (benchmarks/gpu_wheels.sh, with the index);
#   2. stand in for the GPU image: a Python whose packages are this venv's torch, rich, click, numpy, psutil,
#      pytest, hypothesis, transformers, nvidia-ml-py and what they need (symlinked), and nothing of the kit's;
#   3. run benchmarks/gpu_first_run.sh --dry-run against it with the network switched off (a network
#      namespace: unshare -rn, else unshare -n; where neither is allowed, --no-index and PIP_NO_INDEX alone,
#      said in the output): it installs from the wheelhouse, imports, and stops at "no CUDA GPU" with exit 0;
#   4. check that textual came from the kit's venv, not from elsewhere.
# Run from the project's venv (pip install -e '.[test]'):  bash benchmarks/gpu_kit_dry_run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python}
TMP=$(mktemp -d -t tt-kit-dry-XXXX)
trap 'rm -rf "$TMP"' EXIT
started=$(date +%s)

WHEELHOUSE="$TMP/wheelhouse" PYTHON="$PYTHON" bash benchmarks/gpu_wheels.sh

# The stand-in image: a venv with no packages of its own and a .pth naming a folder of symlinks.
"$PYTHON" -m venv --without-pip "$TMP/image"
IMAGE_SITE="$TMP/image-packages/site-packages"
mkdir -p "$IMAGE_SITE"
"$PYTHON" - "$IMAGE_SITE" <<'PY'
import os, re, sys
from importlib import metadata
from packaging.requirements import Requirement

target = sys.argv[1]
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
roots = "torch nvidia-ml-py psutil rich click numpy pytest hypothesis transformers".split()
seen, todo = set(), list(roots)
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
print(f"dry run: the stand-in image holds {len(seen)} distributions (torch {metadata.version('torch')})")
PY
site=$("$TMP/image/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$IMAGE_SITE" >"$site/_image.pth"
if "$TMP/image/bin/python" -c 'import textual' 2>/dev/null; then
    echo "dry run: the stand-in image can import textual: it would not test the kit" >&2
    exit 1
fi

# No network for the install: a network namespace where the CI user may make one.
if unshare -rn true 2>/dev/null; then OFFLINE=(unshare -rn); how="unshare -rn (a network namespace with no interfaces up)"
elif unshare -n true 2>/dev/null; then OFFLINE=(unshare -n); how="unshare -n (a network namespace with no interfaces up)"
else OFFLINE=(env); how="--no-index and PIP_NO_INDEX only (this user may not create a network namespace)"; fi
echo "dry run: offline by $how"
env -u PYTHONPATH PIP_NO_INDEX=1 PYTHON="$TMP/image/bin/python" WHEELHOUSE="$TMP/wheelhouse" KIT_VENV="$TMP/kit" \
    OUT="$TMP/out" "${OFFLINE[@]}" bash benchmarks/gpu_first_run.sh --dry-run
grep -q "no CUDA GPU" "$TMP/out/steps.log"
textual_file=$("$TMP/kit/bin/python" -c 'import textual; print(textual.__file__)')
case "$textual_file" in
    "$TMP/kit/"*) ;;
    *) echo "dry run: textual came from $textual_file, not from the kit's venv" >&2; exit 1 ;;
esac
echo "dry run: passed in $(( $(date +%s) - started )) s; files in OUT: $(ls "$TMP/out" | tr '\n' ' ')"
