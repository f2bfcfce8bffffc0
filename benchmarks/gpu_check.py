"""The prepared GPU check (run by ``benchmarks/gpu_check.sh``): the default study on CUDA
in bfloat16 with the tiny model, its timed pass, and NVML telemetry, written to one JSON.

Runs in a fresh copy of the project under a temporary directory, so the checkout's
results are untouched. Figures: wall time, work share (per-video work over the jobs'
wall time, from records and Snakemake's benchmark files), slot busy share, and per arm
the timed pass's median latency, denoise/decode split, repeat CV, peak device memory
the throttle reasons NVML reported while the timed runs ran (polled during each run;
``gpu_idle`` excluded), peak device memory and estimated MFU per arm. Checks the driver
and that torch sees CUDA first (exit 2, with the driver the wheel needs, before anything
is measured); the JSON is written at every step, so a study that fails or overruns its
timeout still leaves what was measured and the tail of its log.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def gpu_info() -> dict[str, Any]:
    """The GPU this check runs on (device 0), as torch and NVML report it."""
    import torch

    from pairflow.envinfo import environment
    from pairflow.telemetry import gpu_state

    props = torch.cuda.get_device_properties(0)
    env = environment()
    return {"name": props.name, "memory_gib": props.total_memory / 2**30, "capability": f"{props.major}.{props.minor}",
            "uuid": str(props.uuid), "torch": torch.__version__, "cuda": torch.version.cuda,
            "driver": env["driver"], "bf16_supported": torch.cuda.is_bf16_supported(),
            "state_before": gpu_state(str(props.uuid), os.getpid())}


def timing_summary(scratch: Path) -> dict[str, Any]:
    """Per arm, over the timed pass's records: medians of latency, phases and repeat CV,
    the largest peak device memory, and every throttle reason seen before or after a run."""
    by: dict[str, list[dict[str, Any]]] = {}
    for p in scratch.glob("panels/*/timing/*/*.json"):
        r = json.loads(p.read_text())
        if r.get("sampled", True):
            by.setdefault(r["arm"]["name"], []).append(r)
    out = {}
    for arm, rs in by.items():
        ts = [r["timing"] for r in rs]
        cvs = [t["cv"] for t in ts if t.get("cv") is not None]
        # reasons NVML reported while a timed run ran (polled during it), gpu_idle excluded
        reasons = sorted({x for r in rs for run in (r.get("gpu") or [])
                          for x in (run.get("throttled") or {}).get("reasons", [])})
        others = max((len(run.get(side, {}).get("other_processes", [])) for r in rs for run in (r.get("gpu") or [])
                      for side in ("gpu_before", "gpu_after")), default=0)
        temps = [run[side]["temperature_c"] for r in rs for run in (r.get("gpu") or [])
                 for side in ("gpu_before", "gpu_after") if "temperature_c" in run.get(side, {})]
        out[arm] = {"candidates": len(rs), "latency_s": statistics.median(t["latency_s"] for t in ts),
                    "denoise_s": statistics.median(t["phases_s"]["denoise"] for t in ts),
                    "decode_s": statistics.median(t["phases_s"]["decode"] for t in ts),
                    "cv": statistics.median(cvs) if cvs else None,
                    "over_max_cv": sum(bool(t.get("over_max_cv")) for t in ts),
                    "clock": sorted({t["clock"] for t in ts}), "cuda_settings": ts[0].get("cuda_settings"),
                    "peak_device_mb": max((t.get("peak_device_mb") or 0.0) for t in ts),
                    "throttle_reasons": reasons, "max_other_processes": others,
                    "temperature_c": [min(temps), max(temps)] if temps else None,
                    "matches_bulk_frames": sum(bool(r["matches_bulk_frames"]) for r in rs)}
    return out


DRIVER_FOR_CUDA = {13: 580, 12: 525, 11: 450}
"""Oldest NVIDIA driver branch each CUDA major version's wheels run on (minor-version
compatibility within a major): a CUDA 13 torch wheel needs R580 or newer."""


def driver_check() -> dict[str, Any]:
    """The driver NVML reports, the driver the installed torch wheel needs, and whether
    torch sees CUDA; ``ok`` False with ``why`` saying what to fix (printed before anything
    is measured, so a wrong driver costs seconds, not the 8-minute budget)."""
    import torch

    from pairflow.envinfo import environment

    cuda = torch.version.cuda
    need = DRIVER_FOR_CUDA.get(int(cuda.split(".")[0])) if cuda else None
    driver = environment().get("driver")
    out: dict[str, Any] = {"torch": torch.__version__, "torch_cuda": cuda, "driver": driver,
                           "driver_needed": f"R{need}+" if need else None, "cuda_available": False}
    if cuda is None:
        return {**out, "ok": False, "why": f"torch {torch.__version__} is a CPU-only build; install the CUDA wheel"}
    major = None
    try:
        major = int(str(driver).split(".")[0])
    except ValueError:
        pass
    if need and major is not None and major < need:
        return {**out, "ok": False, "why": f"driver {driver} is older than R{need}, which torch {torch.__version__} "
                                            f"(CUDA {cuda}) needs; upgrade the driver or install a wheel built for "
                                            "an older CUDA"}
    out["cuda_available"] = torch.cuda.is_available()
    if not out["cuda_available"] and driver is None:
        return {**out, "ok": False, "why": f"no NVIDIA driver is loaded here (NVML and nvidia-smi find none); torch "
                                            f"{torch.__version__} (CUDA {cuda}) needs driver R{need}+"}
    if not out["cuda_available"]:
        return {**out, "ok": False, "why": f"torch sees no CUDA device (driver {driver}, CUDA_VISIBLE_DEVICES="
                                            f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}); torch needs driver "
                                            f"R{need}+ for CUDA {cuda}"}
    return {**out, "ok": True}


def mfu_by_arm(scratch: Path, timing: dict[str, Any], device_name: str) -> dict[str, Any]:
    """Per arm: estimated MFU (``compute.estimated_mfu``: counted forward FLOPs of the
    bulk record over the timed median latency over the device's dense BF16 peak) and the
    peak device memory, beside the timed speedup against control."""
    from pairflow.compute import estimated_mfu

    flops: dict[str, list[float]] = {}
    for p in scratch.glob("panels/*/records/*/*.json"):
        r = json.loads(p.read_text())
        c = r.get("compute") or {}
        if "total_flops" in c:
            flops.setdefault(r["arm"]["name"], []).append(float(c["total_flops"]) + float(c.get("verifier_flops", 0)))
    ctrl = (timing.get("control") or {}).get("latency_s")
    out = {}
    for arm, t in timing.items():
        f = statistics.median(flops[arm]) if flops.get(arm) else None
        out[arm] = {"flops": f, "latency_s": t["latency_s"], "peak_device_mb": t["peak_device_mb"],
                    "speedup": ctrl / t["latency_s"] if ctrl and t["latency_s"] else None,
                    "mfu": estimated_mfu(f, t["latency_s"], device_name) if f else None}
    return out


def write(path: Path, result: dict[str, Any]) -> None:
    from pairflow.atomic import write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(result, indent=1, sort_keys=True, default=str) + "\n")


def run_study(project: Path, env: dict[str, str], timeout: int, log: Path) -> tuple[int | None, float]:
    """Run the study's Snakemake in its own session, output to ``log``; on overrun the
    whole session is killed and the return code is None."""
    import signal

    tick = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("snakemake")), "--profile", "profiles/local"],
                                cwd=project, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            rc = None
    return rc, time.perf_counter() - tick


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True, help="the JSON to write")
    ap.add_argument("--timeout", type=int, default=420, help="seconds the study may take")
    ap.add_argument("--nvml-interval", type=float, default=1.0,
                    help="seconds between NVML samples in the study's jobs (>= 10 samples per panel job)")
    args = ap.parse_args(argv)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    check = driver_check()
    result: dict[str, Any] = {"kind": "gpu_check", "date": started, "driver_check": check, "complete": False}
    write(args.out, result)  # whatever happens next, the driver check is on disk
    print(f"gpu_check: driver {check['driver']}, torch {check['torch']} (CUDA {check['torch_cuda']}, needs "
          f"{check['driver_needed']}), CUDA available: {check['cuda_available']}", flush=True)
    if not check["ok"]:
        print(f"gpu_check: {check['why']}; nothing measured", file=sys.stderr)
        return 2
    import yaml
    from run import bench_e2e  # the e2e benchmark section: work share from records and benchmark files

    info = gpu_info()
    result["gpu"] = info
    write(args.out, result)
    project = Path(tempfile.mkdtemp(prefix="pairflow-gpu-")) / "project"
    project.mkdir()
    for name in ("Snakefile", "workflow", "envs", "profiles", "config"):
        src = ROOT / name
        (shutil.copytree(src, project / name, ignore=shutil.ignore_patterns("__pycache__")) if src.is_dir()
         else shutil.copy(src, project / name))
    cfg = yaml.safe_load((project / "config" / "config.yaml").read_text())
    dtype = "bfloat16" if info["bf16_supported"] else "float16"
    cfg["generation"]["dtype"] = dtype
    cfg.setdefault("fleet", {})["nvml_interval_s"] = args.nvml_interval
    (project / "config" / "config.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0")}
    log = project.parent / "snakemake.log"
    rc, wall = run_study(project, env, args.timeout, log)
    scratch = project / "results" / "scratch"
    result.update({"dtype": dtype, "study_wall_s": wall, "snakemake_rc": rc, "timed_out": rc is None,
                   "nvml_interval_s": args.nvml_interval})
    if rc != 0:
        result["snakemake_tail"] = log.read_text(errors="replace")[-6000:]
    # Whatever was measured, even when the study failed or overran: each part on its own.
    parts: dict[str, Any] = {
        "timing": lambda: timing_summary(scratch),
        "e2e": lambda: bench_e2e(1, False, scratch),
        "utilisation": lambda: json.loads((scratch / "study" / "utilisation.json").read_text()),
        "nvml_summary": lambda: {p.stem: json.loads(p.read_text())["nvml"]
                                 for p in scratch.glob("panels/*/telemetry/*.json")},
        "timed_pass": lambda: json.loads((scratch / "study" / "telemetry" / "timed_pass.json").read_text()),
        "table": lambda: (scratch / "study" / "table.md").read_text(),
    }
    missing = {}
    for name, get in parts.items():
        try:
            result[name] = get()
        except (OSError, ValueError, KeyError, TypeError) as e:
            missing[name] = f"{type(e).__name__}: {e}"
    if missing:
        result["not_measured"] = missing
    if result.get("timing"):
        result["per_arm"] = mfu_by_arm(scratch, result["timing"], info["name"])
    u = result.get("utilisation") or {}
    if u:
        result["busy_share"] = u.get("busy_share")
        result["jobs"] = {j["job"]: {"window_s": j["window_s"], "tasks": j["tasks"], "nvml": j["nvml"],
                                     "slots": {k: v["share"] for k, v in j["slots"].items()}} for j in u["jobs"]}
    from pairflow.telemetry import gpu_state

    result["gpu"]["state_after"] = gpu_state(info["uuid"], os.getpid())
    result["complete"] = rc == 0
    write(args.out, result)
    shutil.rmtree(project.parent, ignore_errors=True)
    print(f"gpu_check: {info['name']}: study {wall:.1f} s (rc {rc}{', timed out' if rc is None else ''}); "
          f"wrote {args.out}")
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
