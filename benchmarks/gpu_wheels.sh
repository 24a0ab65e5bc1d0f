#!/usr/bin/env bash
# The wheelhouse for an offline GPU machine (benchmarks/gpu_first_run.sh installs from it with no index).
#
# Built on a machine WITH a package index, from the project's virtual environment (pip install -e '.[test]'):
#   bash benchmarks/gpu_wheels.sh            (WHEELHOUSE=... for another folder; PYTHON=... for another venv)
#
# What goes in: exactly what the target image lacks for `python -m tutor` and the whole test suite. The image
# is benchmarks/gpu_image.txt (IMAGE_MANIFEST=... for another): its packages, and what they need as installed
# in this venv, are left out (never torch, triton or nvidia-* wheels). The rest of pyproject's dependencies
# and test extra (textual, textual-serve, platformdirs, uniplot, ...) and all they pull in are resolved for
# the image's Python with every version the manifest pins as a constraint: a kit package that cannot live
# beside the image's own packages stops the build HERE, not the install on the GPU. The test runner the
# project pins (KIT_RUNNER: pytest and its plugins, and what only they need) always goes in, whatever the
# image's versions: the kit's venv shadows the image's pytest (an image with pytest 9 and our pytest<9
# snapshot plugin syrupy could not be installed together). Everything is downloaded as pure-Python wheels
# (py3-none-any: valid for Python 3.11-3.13 on any platform); a package with no pure wheel is taken as its
# CPython 3.12 manylinux x86_64 wheel and named in the output.
# Also written: requirements.txt (the pins, what the first run installs), image.txt (the manifest it was
# resolved against) and the total must be < 20 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
WHEELHOUSE=${WHEELHOUSE:-benchmarks/wheelhouse}
IMAGE_MANIFEST=${IMAGE_MANIFEST:-benchmarks/gpu_image.txt}
TARGET_PYTHON=${TARGET_PYTHON:-3.12}   # the image's Python: markers and wheels are resolved for it
LIMIT_MIB=20
KIT_RUNNER=${KIT_RUNNER:-"pytest pytest-xdist pytest-randomly pytest-timeout pytest-textual-snapshot syrupy"}
TMP=$(mktemp -d -t tt-wheels-XXXX)
trap 'rm -rf "$TMP"' EXIT

# 1. The requirements the image lacks, what the image's packages already bring (their dependencies from this
#    venv's metadata) and the image's pinned versions as constraints.
KIT_RUNNER="$KIT_RUNNER" "$PYTHON" - "$TMP" "$IMAGE_MANIFEST" <<'PY'
import os, re, sys, tomllib
from importlib import metadata
from packaging.requirements import Requirement

tmp, manifest = sys.argv[1], sys.argv[2]
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
runner = {norm(n) for n in os.environ["KIT_RUNNER"].split()}
listed = {}  # name -> the image's version, or None where the manifest names no version
for line in open(manifest):
    line = line.split("#", 1)[0].strip()
    if line:
        req = Requirement(line)
        pins = [s.version for s in req.specifier if s.operator == "=="]
        listed[norm(req.name)] = pins[0] if pins else None
if not listed:
    sys.exit(f"gpu_wheels: {manifest} names no packages")
unknown = []
def closure(names):
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen or name in runner:  # the kit brings the runner and what it needs itself
            continue
        seen.add(name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            if name in listed:
                unknown.append(name)
            continue
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(norm(req.name))
    return seen
image = (closure(listed) | {"torch", "triton"}) - runner
if unknown:
    print(f"gpu_wheels: not installed here, so what they pull in is not known: {', '.join(unknown)} "
          "(taken as in the image, alone)", file=sys.stderr)
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
# CI's own checkers (types, the layers contract, the wheel's contents) run on the CPU machine, never on the GPU.
DEV_ONLY = {"mypy", "types-psutil", "import-linter", "hatchling"}
wanted = [r for r in project["dependencies"] + project["optional-dependencies"]["test"]
          if norm(Requirement(r).name) not in image | DEV_ONLY]
# What the kit takes from the image must still meet the project's own ranges (left out of the resolution
# above, they would bind nothing: pip would quietly pick plugins that suit the image's version instead).
outside = [f"{name} {listed[name]} (the project wants {r})" for r in project["dependencies"] + project["optional-dependencies"]["test"]
           for name in [norm(Requirement(r).name)]
           if name in image and listed.get(name) and name not in DEV_ONLY
           and not Requirement(r).specifier.contains(listed[name], prereleases=True)]
if outside:
    sys.exit(f"gpu_wheels: the image's versions ({manifest}) are outside the project's requirements: "
             f"{'; '.join(outside)}; ship them in the kit (KIT_RUNNER) or change the requirement")
missing = runner - {norm(Requirement(r).name) for r in wanted} - {"syrupy"}  # syrupy comes with the snapshot plugin
if missing:
    sys.exit(f"gpu_wheels: KIT_RUNNER names {', '.join(sorted(missing))}, not in pyproject's test extra")
# The image's versions bind the resolution; torch's CUDA build is never resolved (it is not on an index).
constraints = [f"{n}=={v}" for n, v in sorted(listed.items())
               if v and n not in runner and n != "torch" and not n.startswith(("nvidia-", "triton"))]
open(f"{tmp}/wanted.txt", "w").write("\n".join(wanted) + "\n")
open(f"{tmp}/constraints.txt", "w").write("\n".join(constraints) + "\n")
open(f"{tmp}/image.txt", "w").write("\n".join(sorted(image)) + "\n")
print(f"gpu_wheels: the image ({manifest}) brings {len(image)} distributions, {len(constraints)} of them at pinned "
      f"versions; the kit resolves {', '.join(wanted)}", file=sys.stderr)
PY

# 2. Resolve them (and what they need) as pip would for the image's Python, metadata only: nothing is installed.
if ! "$PYTHON" -m pip install --dry-run --ignore-installed --quiet --disable-pip-version-check \
        --only-binary=:all: --python-version "$TARGET_PYTHON" \
        --report "$TMP/report.json" -r "$TMP/wanted.txt" -c "$TMP/constraints.txt"; then
    echo "gpu_wheels: the kit cannot be resolved beside the image's own versions ($IMAGE_MANIFEST, above):" \
         "a kit package needs another version of one the image has; add it to KIT_RUNNER to ship (and shadow)" \
         "it, or change the project's requirement" >&2
    exit 1
fi
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
cp "$IMAGE_MANIFEST" "$WHEELHOUSE/image.txt"

# 4. The size limit: the kit travels with the tree (64 MiB in all).
bytes=$(du -cb "$WHEELHOUSE"/* | tail -1 | cut -f1)
count=$(ls "$WHEELHOUSE"/*.whl | wc -l)
echo "gpu_wheels: $count wheels, $(( bytes / 1024 )) KiB in $WHEELHOUSE (limit $LIMIT_MIB MiB)"
if [ "$bytes" -ge $(( LIMIT_MIB * 1024 * 1024 )) ]; then
    echo "gpu_wheels: the wheelhouse is over $LIMIT_MIB MiB" >&2
    exit 1
fi
