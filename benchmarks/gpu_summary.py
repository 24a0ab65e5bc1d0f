"""The summary of benchmarks/gpu_first_run.sh: each step's status and time, and each of tensor-tutor's
figures beside its plain reference (benchmarks/gpu_reference.py) as a ratio, ours / plain.

    python benchmarks/gpu_summary.py WORK_DIR OUT_DIR BUDGET_S [IMAGE_MANIFEST]

Reads WORK_DIR/steps.tsv (name, seconds, timeout, status) and WORK_DIR/<step>.out, and from OUT_DIR the
whole suite's pytest-junit.xml and the package lists (image-packages.json, kit-packages.json); writes
OUT_DIR/summary.json, OUT_DIR/summary.txt, OUT_DIR/outputs.json (every step's JSON output) and, where the
suite ran, OUT_DIR/pytest-failures.txt, and prints the text. IMAGE_MANIFEST (benchmarks/gpu_image.txt, as the
wheelhouse was built against it): the versions the kit expected, set beside the ones the image has.
Standard library and tutor.formatting only (stdlib itself): it runs under the machine's own Python.
"""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _json_output(path: Path):
    """A step's stdout as JSON: one object, or a list when it printed one object a line; None otherwise."""
    try:
        text = path.read_text()
    except OSError:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        rows = []
        for line in text.splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return rows or None


def ratio(ours, plain):
    return round(ours / plain, 3) if isinstance(ours, (int, float)) and isinstance(plain, (int, float)) and plain else None


def _best(results, **match):
    rows = [r for r in results if all(r.get(k) == v for k, v in match.items())]
    values = [r.get("tflops_best") or r.get("gbps_best") for r in rows]
    values = [v for v in values if isinstance(v, (int, float))]
    return max(values) if values else None


def comparisons(out: dict) -> list[dict]:
    """Every (figure, ours, plain, ratio) the run can set side by side."""
    rows: list[dict] = []

    def add(what, ours, plain, unit, note=""):
        if ours is not None or plain is not None or note:
            rows.append({"what": what, "ours": ours, "plain": plain, "unit": unit, "ratio": ratio(ours, plain),
                         "note": note})

    bench = out.get("bench_quick") if isinstance(out.get("bench_quick"), dict) else {}
    results = list(bench.get("results", []))
    transfer = out.get("bench_transfer") if isinstance(out.get("bench_transfer"), dict) else {}
    results += list(transfer.get("results", []))
    ref = (out.get("ref_matmul") or {}).get("matmul", {}) if isinstance(out.get("ref_matmul"), dict) else {}
    for dtype in ("fp32", "tf32", "bf16", "fp16", "fp8"):
        add(f"matmul {dtype}", _best(results, kind="matmul", dtype=dtype, device=_cuda(results)),
            (ref.get(dtype) or {}).get("tflops"), "TFLOP/s", (ref.get(dtype) or {}).get("error", ""))
    memory = out.get("ref_memory") if isinstance(out.get("ref_memory"), dict) else {}
    add("HBM device copy", _best(results, kind="bandwidth", op="copy"), memory.get("copy_gbps"), "GB/s")
    add("H2D pinned", _best(results, kind="transfer", op="h2d", memory="pinned"), memory.get("h2d_gbps"), "GB/s")
    add("D2H pinned", _best(results, kind="transfer", op="d2h", memory="pinned"), memory.get("d2h_gbps"), "GB/s")
    fit = out.get("fit_device_0") if isinstance(out.get("fit_device_0"), dict) else {}
    free = out.get("ref_free") if isinstance(out.get("ref_free"), dict) else {}
    capacity = (fit.get("device") or {}).get("capacity_bytes")
    add("fit --device 0 capacity vs driver free (torch.cuda.mem_get_info)", capacity, free.get("torch_free_bytes"), "B",
        (fit.get("device") or {}).get("source", ""))
    add("fit --device 0 capacity vs driver free (NVML)", capacity, free.get("nvml_free_bytes"), "B")
    trace = (out.get("fit_trace") or {}).get("trace") if isinstance(out.get("fit_trace"), dict) else None
    step = out.get("ref_step") if isinstance(out.get("ref_step"), dict) else {}
    real = step.get("max_memory_allocated_bytes")
    if trace:
        peak = (trace.get("vs_formula") or {}).get("peak", {})
        add("fit --trace peak vs real bf16 step (max_memory_allocated)", peak.get("traced_bytes"), real, "B")
        add("fit formula peak vs real bf16 step (max_memory_allocated)", peak.get("formula_bytes"), real, "B")
    elif real is not None:
        add("real bf16 step (max_memory_allocated)", None, real, "B")
    timed = out.get("time_8b") if isinstance(out.get("time_8b"), dict) else {}
    if timed and step:
        real_decode = step.get("decode") or {}
        for row in timed.get("decode") or []:
            real = (real_decode.get(str(row.get("batch"))) or {}).get("median_step_s")
            if real is not None:
                add(f"time --device 0 decode @{row.get('batch')}, {row.get('engine')} ({row.get('bound')}) vs real "
                    "eager step", row.get("seconds_per_step"), real, "s",
                    "the real loop is eager: graphs should sit below it" if row.get("engine") == "graphs" else "")
        add("time --device 0 prefill vs real", (timed.get("prefill") or {}).get("seconds"),
            (step.get("prefill") or {}).get("median_s"), "s")
    verified = (out.get("time_verify") or {}).get("verify") if isinstance(out.get("time_verify"), dict) else None
    if isinstance(verified, dict):
        where = f"{verified.get('model')} on {verified.get('device', 'the CPU')}, {verified.get('scaled', '')}"
        if "predicted_s" in verified:
            add(f"time --verify training step ({where}): predicted vs measured", verified.get("predicted_s"),
                verified.get("measured_s"), "s")
        for phase, row in (verified.get("phases") or {}).items():
            add(f"time --verify {phase}: predicted vs measured", row.get("predicted_s"), row.get("measured_s"), "s")
        if isinstance(verified.get("prefill"), dict):
            add("time --verify prefill: predicted vs measured", verified["prefill"].get("predicted_s"),
                verified["prefill"].get("measured_s"), "s")
        for row in verified.get("decode_engines") or []:
            add(f"time --verify decode @{row.get('batch')}, {row.get('engine')}: predicted vs measured",
                row.get("predicted_s"), row.get("measured_s"), "s")
        if verified.get("graphs_note"):
            add("time --verify CUDA graphs", None, None, "s", verified["graphs_note"])
    versus = out.get("time_vs_real") if isinstance(out.get("time_vs_real"), dict) else {}
    for model in versus.get("models") or []:
        for key, real in (model.get("measured") or {}).items():
            add(f"time --device 0 {key} vs transformers ({model.get('model')}, {versus.get('size')} size)",
                (model.get("predicted") or {}).get(key), real, "s")
    sampler = out.get("sampler") if isinstance(out.get("sampler"), dict) else {}
    ours, plain = sampler.get("ours") or {}, sampler.get("plain") or {}
    for key, unit in ((("utilization_pct", "%"), ("sm_clock_mhz", "MHz"), ("power_w", "W")) if sampler else ()):
        add(f"live sampler under load: mean {key}", ours.get(key), plain.get(key), unit,
            f"{ours.get('samples')} samples vs {plain.get('samples')} plain NVML polls in {sampler.get('seconds')} s")
    return rows


def junit_counts(path: Path) -> dict | None:
    """passed/failed/errors/skipped of a JUnit XML (pytest's), and each failure or error with its traceback's
    last lines; None where there is no readable file (a run killed before pytest wrote it)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    problems = []
    for case in root.iter("testcase"):
        if not case.get("name"):  # what pytest writes for the test running when it was interrupted
            continue
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        kinds = {child.tag for child in case}
        for tag, key in (("failure", "failed"), ("error", "errors")):
            for child in case.findall(tag):
                counts[key] += 1
                lines = (child.text or "").rstrip().splitlines()
                problems.append({"test": test, "kind": key, "message": child.get("message", ""), "tail": lines[-30:]})
        if "skipped" in kinds and not kinds & {"failure", "error"}:
            counts["skipped"] += 1
        elif not kinds & {"failure", "error", "skipped"}:
            counts["passed"] += 1
    return {**counts, "problems": problems}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _imported(path: Path) -> dict[str, tuple[str, str]]:
    """name -> (version, location) of each distribution a package list (gpu_first_run's packages_json) imports."""
    try:
        rows = json.loads(path.read_text()).get("packages", [])
    except (OSError, ValueError, AttributeError):
        return {}
    return {_norm(r["name"]): (r["version"], r["location"]) for r in rows if r.get("imported", True)}


def packages(out_dir: Path, manifest: Path | None) -> dict:
    """The image as found against the manifest the kit was built for, and what the kit's venv shadows."""
    image, kit = _imported(out_dir / "image-packages.json"), _imported(out_dir / "kit-packages.json")
    expected = {}
    if manifest is not None and manifest.exists():
        for line in manifest.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                name, _, version = line.partition("==")
                expected[_norm(name)] = version.strip() or None
    differs = [f"{n} {image[n][0] if n in image else 'missing'} (expected {v or 'present'})"
               for n, v in sorted(expected.items()) if n not in image or (v and image[n][0] != v)]
    shadowed = [f"{n} {image[n][0]} -> {kit[n][0]}" for n in sorted(kit) if n in image and kit[n][0] != image[n][0]]
    return {"image_count": len(image), "kit_count": len(kit), "image_vs_manifest": differs, "kit_shadows": shadowed}


def _cuda(results) -> str | None:
    devices = [r.get("device") for r in results if str(r.get("device", "")).startswith("cuda")]
    return devices[0] if devices else None


def _figure(value, unit: str) -> str:
    from tutor.formatting import format_bytes, format_quantity

    if value is None:
        return "n/a"
    return format_bytes(value) if unit == "B" else format_quantity(value, unit)


def main() -> int:
    from tutor.formatting import format_number

    work, out_dir, budget = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
    manifest = Path(sys.argv[4]) if len(sys.argv) > 4 else None
    steps = []
    tsv = work / "steps.tsv"
    for line in (tsv.read_text().splitlines() if tsv.exists() else []):
        name, seconds, limit, status = line.split("\t", 3)
        steps.append({"name": name, "seconds": int(seconds), "timeout_s": int(limit), "status": status})
    outputs = {s["name"]: _json_output(work / f"{s['name']}.out") for s in steps}
    outputs = {k: v for k, v in outputs.items() if v is not None}
    # The steps that print text (pytest's counts, first_number's ratios): their last lines.
    tails = {}
    for s in steps:
        path = work / f"{s['name']}.out"
        if s["name"] not in outputs and path.exists():
            lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
            if lines:
                tails[s["name"]] = lines[-4:]
    rows = comparisons(outputs)
    suite = junit_counts(out_dir / "pytest-junit.xml") if any(s["name"] == "pytest_full" for s in steps) else None
    listing = packages(out_dir, manifest)
    summary = {"steps": steps, "budget_s": budget, "seconds_total": sum(s["seconds"] for s in steps),
               "timeouts_total_s": sum(s["timeout_s"] for s in steps), "comparisons": rows,
               "text_tails": tails, "versions": outputs.get("imports"), "passed": not any(s["status"].startswith(("FAILED", "timed out"))
                                                                     for s in steps),
               "suite": {k: v for k, v in suite.items() if k != "problems"} if suite else None,
               "packages": listing}
    lines = [f"GPU first run: {out_dir}", "steps (seconds taken / timeout):"]
    lines += [f"  {s['name']:16} {s['seconds']:>4} s / {s['timeout_s']:>3} s  {s['status']}" for s in steps]
    lines.append(f"  total {summary['seconds_total']} s (timeouts {summary['timeouts_total_s']} s, budget {budget:g} s)")
    if summary["versions"]:
        lines.append("versions: " + ", ".join(f"{k} {v}" for k, v in summary["versions"].items() if not k.endswith("_file")))
    if rows:
        lines.append("ours vs plain (ratio ours / plain):")
        for r in rows:
            ratio_text = format_number(r["ratio"], digits=3) if r["ratio"] is not None else "n/a"
            note = f"  [{r['note']}]" if r["note"] else ""
            lines.append(f"  {r['what']:62} {_figure(r['ours'], r['unit']):>14} vs {_figure(r['plain'], r['unit']):>14}"
                         f"  ratio {ratio_text}{note}")
    if listing["image_count"]:
        lines.append(f"packages: the image has {listing['image_count']} (image-packages.json), the kit's venv sees "
                     f"{listing['kit_count']} (kit-packages.json)")
        if listing["image_vs_manifest"]:
            lines.append("  the image differs from the kit's manifest: " + ", ".join(listing["image_vs_manifest"]))
        if listing["kit_shadows"]:
            lines.append("  the kit's venv shadows: " + ", ".join(listing["kit_shadows"]))
    if suite is not None:
        lines.append(f"whole suite: {suite['passed']} passed, {suite['failed']} failed, {suite['errors']} errors, "
                     f"{suite['skipped']} skipped (pytest-junit.xml; failures in pytest-failures.txt)")
        text = [f"{p['kind'].upper()} {p['test']}\n  " + p["message"].replace("\n", "\n  ") + "\n" + "\n".join(f"    {line}" for line in p["tail"])
                for p in suite["problems"]]
        (out_dir / "pytest-failures.txt").write_text("\n\n".join(text) + "\n" if text else "no failures, no errors\n")
    elif any(s["name"] == "pytest_full" and not s["status"].startswith("skipped") for s in steps):
        lines.append("whole suite: no JUnit XML (pytest was stopped before it wrote one; see pytest-output.txt)")
    for name, tail in tails.items():
        lines.append(f"{name} (last lines):")
        lines += [f"  {line}" for line in tail]
    env = outputs.get("env") if isinstance(outputs.get("env"), dict) else {}
    if env.get("torch"):
        lines.append(f"torch vs NVML: {(env.get('torch') or {}).get('disagreement') or 'agree'}")
    for gpu in env.get("gpus", []) or []:
        lines.append(f"NVML GPU {gpu.get('index')}: {gpu.get('name')} mig={gpu.get('mig_enabled')} "
                     f"clock events={gpu.get('clock_event_reasons')}")
    text = "\n".join(lines) + "\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out_dir / "summary.txt").write_text(text)
    (out_dir / "outputs.json").write_text(json.dumps(outputs, indent=1) + "\n")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
