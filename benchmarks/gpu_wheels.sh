#!/usr/bin/env bash
# The wheelhouse for an offline GPU machine (benchmarks/gpu_first_run.sh installs from it with no index).
#
# Built on a machine WITH a package index, from the project's virtual environment (pip install -e '.[test]'):
#   bash benchmarks/gpu_wheels.sh            (WHEELHOUSE=... for another folder; PYTHON=... for another venv)
#
# What goes in: exactly what the target image lacks for `python -m tutor` and `pytest -m gpu`. The target
# image has its own CUDA torch and IMAGE_HAS below; everything those need, as installed in this venv, is
# left out (never torch, triton or nvidia-* wheels). The rest of pyproject's dependencies and test extra
# (textual, textual-serve, platformdirs, pytest-textual-snapshot) and all they pull in are resolved here,
# then downloaded as pure-Python wheels (py3-none-any: valid for Python 3.11-3.13 on any platform). A
# package with no pure wheel is taken as its CPython 3.12 manylinux x86_64 wheel and named in the output.
# Also written: requirements.txt (the pins, what the first run installs) and the total must be < 20 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
WHEELHOUSE=${WHEELHOUSE:-benchmarks/wheelhouse}
TARGET_PYTHON=${TARGET_PYTHON:-3.12}   # the binary fallback's interpreter (the image's)
LIMIT_MIB=20
IMAGE_HAS=${IMAGE_HAS:-"torch nvidia-ml-py psutil rich click numpy pytest hypothesis transformers"}
TMP=$(mktemp -d -t tt-wheels-XXXX)
trap 'rm -rf "$TMP"' EXIT

# 1. The requirements the image lacks, and what the image's packages already bring (from this venv's metadata).
IMAGE_HAS="$IMAGE_HAS" "$PYTHON" - "$TMP" <<'PY'
import os, re, sys, tomllib
from importlib import metadata
from packaging.requirements import Requirement

tmp = sys.argv[1]
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
roots = [norm(n) for n in os.environ["IMAGE_HAS"].split()]
def closure(names):
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            if name in roots:
                sys.exit(f"gpu_wheels: {name} is not installed in {sys.prefix}: run this from the project's "
                         "venv (pip install -e '.[test]') so the kit knows what the image's packages bring")
            continue
        seen.add(name)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(norm(req.name))
    return seen
image = closure(roots) | {"torch", "triton"}
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
# CI's own checkers (types, the layers contract, the wheel's contents) run on the CPU machine, never in `pytest -m gpu`.
DEV_ONLY = {"mypy", "types-psutil", "import-linter", "hatchling"}
wanted = [r for r in project["dependencies"] + project["optional-dependencies"]["test"]
          if norm(Requirement(r).name) not in image | DEV_ONLY]
open(f"{tmp}/wanted.txt", "w").write("\n".join(wanted) + "\n")
open(f"{tmp}/image.txt", "w").write("\n".join(sorted(image)) + "\n")
print(f"gpu_wheels: the image brings {len(image)} distributions; the kit resolves {', '.join(wanted)}", file=sys.stderr)
PY

# 2. Resolve them (and what they need) as pip would, metadata only: nothing is installed.
"$PYTHON" -m pip install --dry-run --ignore-installed --quiet --disable-pip-version-check \
    --report "$TMP/report.json" -r "$TMP/wanted.txt"
"$PYTHON" - "$TMP" <<'PY'
import json, re, sys
tmp = sys.argv[1]
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
image = set(open(f"{tmp}/image.txt").read().split())
pins = []
for item in json.load(open(f"{tmp}/report.json"))["install"]:
    name, version = norm(item["metadata"]["name"]), item["metadata"]["version"]
    if name in image:
        continue
    if name.startswith(("torch", "nvidia-", "triton")):
        sys.exit(f"gpu_wheels: refusing to put {name} in the kit (the image's own build is used)")
    pins.append(f"{name}=={version}")
open(f"{tmp}/pins.txt", "w").write("\n".join(sorted(pins)) + "\n")
PY

# 3. Download: pure-Python wheels in one go; one by one (binary fallback) only if that fails.
rm -rf "$WHEELHOUSE"
mkdir -p "$WHEELHOUSE"
PURE=(--only-binary=:all: --no-deps --implementation py --abi none --platform any --python-version "$TARGET_PYTHON")
if ! "$PYTHON" -m pip download --quiet --disable-pip-version-check "${PURE[@]}" -d "$WHEELHOUSE" -r "$TMP/pins.txt"; then
    while read -r pin; do
        [ -n "$pin" ] || continue
        if ! "$PYTHON" -m pip download --quiet --disable-pip-version-check "${PURE[@]}" -d "$WHEELHOUSE" "$pin" 2>/dev/null; then
            echo "gpu_wheels: $pin has no pure-Python wheel: taking its CPython $TARGET_PYTHON manylinux x86_64 wheel" >&2
            "$PYTHON" -m pip download --quiet --disable-pip-version-check --only-binary=:all: --no-deps \
                --implementation cp --abi "cp${TARGET_PYTHON/./}" --abi abi3 --abi none \
                --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
                --python-version "$TARGET_PYTHON" -d "$WHEELHOUSE" "$pin"
        fi
    done <"$TMP/pins.txt"
fi
cp "$TMP/pins.txt" "$WHEELHOUSE/requirements.txt"

# 4. The size limit: the kit travels with the tree (64 MiB in all).
bytes=$(du -cb "$WHEELHOUSE"/* | tail -1 | cut -f1)
count=$(ls "$WHEELHOUSE"/*.whl | wc -l)
echo "gpu_wheels: $count wheels, $(( bytes / 1024 )) KiB in $WHEELHOUSE (limit $LIMIT_MIB MiB)"
if [ "$bytes" -ge $(( LIMIT_MIB * 1024 * 1024 )) ]; then
    echo "gpu_wheels: the wheelhouse is over $LIMIT_MIB MiB" >&2
    exit 1
fi
