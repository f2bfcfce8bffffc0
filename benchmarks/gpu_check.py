"""The prepared GPU check (run by ``benchmarks/gpu_check.sh``): the default study on CUDA
in bfloat16 with the tiny model, its timed pass, and NVML telemetry, written to one JSON.

Runs in a fresh copy of the project under a temporary directory, so the checkout's
results are untouched. Figures: wall time, work share (per-video work over the jobs'
wall time, from records and Snakemake's benchmark files), slot busy share, and per arm
the timed pass's median latency, denoise/decode split, repeat CV, peak device memory
and the throttle reasons NVML reported around the timed runs. Exits 2 without CUDA.
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True, help="the JSON to write")
    ap.add_argument("--timeout", type=int, default=420, help="seconds the study may take")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: torch sees no CUDA device (a CPU build of torch, or no GPU); nothing measured",
              file=sys.stderr)
        return 2
    import yaml
    from run import bench_e2e  # the e2e benchmark section: work share from records and benchmark files

    info = gpu_info()
    project = Path(tempfile.mkdtemp(prefix="pairflow-gpu-")) / "project"
    project.mkdir()
    for name in ("Snakefile", "workflow", "envs", "profiles", "config"):
        src = ROOT / name
        (shutil.copytree(src, project / name, ignore=shutil.ignore_patterns("__pycache__")) if src.is_dir()
         else shutil.copy(src, project / name))
    cfg = yaml.safe_load((project / "config" / "config.yaml").read_text())
    dtype = "bfloat16" if info["bf16_supported"] else "float16"
    cfg["generation"]["dtype"] = dtype
    (project / "config" / "config.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0")}
    tick = time.perf_counter()
    proc = subprocess.run([str(Path(sys.executable).with_name("snakemake")), "--profile", "profiles/local"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=args.timeout, check=False)
    wall = time.perf_counter() - tick
    scratch = project / "results" / "scratch"
    result: dict[str, Any] = {"kind": "gpu_check", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "gpu": info, "dtype": dtype, "study_wall_s": wall, "snakemake_rc": proc.returncode}
    if proc.returncode:
        result["snakemake_tail"] = (proc.stdout + proc.stderr)[-6000:]
    else:
        u = json.loads((scratch / "study" / "utilisation.json").read_text())
        result.update({
            "e2e": bench_e2e(1, False, scratch), "timing": timing_summary(scratch),
            "busy_share": u["busy_share"],
            "jobs": {j["job"]: {"window_s": j["window_s"], "tasks": j["tasks"], "nvml": j["nvml"],
                                "slots": {k: v["share"] for k, v in j["slots"].items()}} for j in u["jobs"]},
            "nvml_summary": {p.stem: json.loads(p.read_text())["nvml"]["summary"]
                             for p in scratch.glob("panels/*/telemetry/*.json")},
            "timed_pass": json.loads((scratch / "study" / "telemetry" / "timed_pass.json").read_text()),
            "table": (scratch / "study" / "table.md").read_text()})
    from pairflow.telemetry import gpu_state

    result["gpu"]["state_after"] = gpu_state(info["uuid"], os.getpid())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True, default=str) + "\n")
    shutil.rmtree(project.parent, ignore_errors=True)
    print(f"gpu_check: {info['name']}: study {wall:.1f} s (rc {proc.returncode}); wrote {args.out}")
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
