"""The sequential timed pass (Stein's two-stage design) on a GPU: what it costs and what it gives.

Builds the embedded tiny model in a temp folder, loads arms ``control`` and ``fbcache``
(FirstBlockCacheConfig, threshold 1.2, as config/config.yaml) through the package's own
``generation.armrun`` on the device, warms each arm once, then times every pair of P
prompts (seed 0) once, in the seeded order the timed pass uses (``analysis.sequential.order``
for the prompts, ``stages.timing.run_order`` within blocks of ``BLOCK_PAIRS``), each run with
``stages.timing._timed_run`` (CUDA events on CUDA). Then 3 repeats per candidate for the
first 10 prompts (the old default, ``timing.repeats: 3``).

From the single runs: each prompt's log(control / fbcache) latency, its sd, Stein's plan
(``sequential.plan``: pilot 5, precision 0.02, level 0.95, ceiling 64), the interval from
the planned N prompts (the wider of Stein's and the t-interval) against the t-interval over
all P prompts, the GPU seconds spent timing under the plan against all P pairs x 3 repeats,
the repeats' coefficient of variation, peak device memory, and the GPU's name and clocks.

    PYTHONPATH=workflow python benchmarks/gpu_sequential.py --device cuda --out $OUT/gpu_sequential.json
    .venv/bin/python benchmarks/gpu_sequential.py --device cpu --prompts 6     # a local dry run

Imports only what the timed pass itself needs (no parsl, pyiqa or ffmpeg): diffusers, torch,
transformers, jsonschema (config validation), scipy, numpy, xxhash, yaml.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
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

SMI_FIELDS = ("name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,temperature.gpu,"
              "power.draw,pstate,memory.used,memory.total")


def nvidia_smi() -> dict[str, str] | None:
    """The GPU's name, clocks, temperature and power as nvidia-smi reads them now (None without it)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError) as e:
        return {"error": str(e)}
    if not out:
        return None
    return dict(zip(SMI_FIELDS.split(","), (v.strip() for v in out[0].split(",")), strict=False))


def config(tmp: Path, model: Path, prompts: int) -> dict[str, Any]:
    """A study config like tests/conftest.py's small_config, with config/config.yaml's
    generation settings (frames 9, 64x64, steps 6) and arms control and fbcache."""
    sheet = tmp / "config" / "panels" / "p.tsv"
    sheet.parent.mkdir(parents=True, exist_ok=True)
    sheet.write_text("prompt_id\tprompt\n" + "".join(f"p{i:03d}\tprompt number {i}\n" for i in range(prompts)))
    return {
        "study": "gpu-sequential",
        "storage": {"scratch": str(tmp / "results" / "scratch"), "work": str(tmp / "results" / "work")},
        "model": {"kind": "embedded-tiny", "path": str(model)},
        "arms": {"control": {"cache": None},
                 "fbcache": {"cache": {"class": "FirstBlockCacheConfig", "params": {"threshold": 1.2}}}},
        "panels": {"p": {"sheet": str(sheet), "seeds": [0]}},
        "generation": {"frames": 9, "height": 64, "width": 64, "steps": 6, "guidance": 5.0, "fps": 8,
                       "dtype": "float32", "threads": 1},
        "fleet": {"cpu_workers": 1, "retries": 1, "calibrate": False},
        "stats": {"resamples": 200, "level": 0.95},
        "timing": {"pilot_prompts": 5, "precision": 0.02, "max_prompts": 64, "seed": 0},
    }


def summary(x: list[float]) -> dict[str, float]:
    return {"n": len(x), "median": statistics.median(x), "mean": statistics.fmean(x), "min": min(x), "max": max(x),
            "sd": statistics.stdev(x) if len(x) > 1 else 0.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--repeat-prompts", type=int, default=10, help="prompts timed with 3 repeats (old default)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch: generation's device is "cuda when torch can"
    out_path = args.out or Path(os.environ.get("OUT", ".")) / "gpu_sequential.json"
    t_start = time.perf_counter()

    import numpy as np
    import torch

    from pairflow.analysis import sequential
    from pairflow.analysis.stats import t_procedure
    from pairflow.generation import generate as g
    from pairflow.generation.armrun import arm_pipeline, run_arm
    from pairflow.generation.tinymodel import build_tiny_model
    from pairflow.plan.candidates import candidates
    from pairflow.plan.config import study_from_raw
    from pairflow.stages.timing import BLOCK_PAIRS, _timed_run, cv, run_order

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("--device cuda but torch sees no GPU", file=sys.stderr)
        return 2
    smi_before = nvidia_smi()
    result: dict[str, Any] = {"device": args.device, "python": platform.python_version(), "torch": torch.__version__,
                              "nvidia_smi_before": smi_before}
    import diffusers

    result["diffusers"] = diffusers.__version__

    with tempfile.TemporaryDirectory(prefix="gpu-seq-") as tmpd:
        tmp = Path(tmpd)
        t0 = time.perf_counter()
        model = build_tiny_model(tmp / "tiny-wan")
        result["build_model_s"] = time.perf_counter() - t0
        study = study_from_raw(config(tmp, model, args.prompts), tmp)
        panel = study.panel("p")
        cands = candidates(study, panel)
        arms = {a.name: a for a in study.arms}
        gen = study.generation
        settings = g.pin_cuda()
        result["cuda_settings"] = settings
        uuid = str(torch.cuda.get_device_properties(0).uuid) if cuda else None
        if cuda:
            result["gpu_name"] = torch.cuda.get_device_name(0)
            torch.cuda.reset_peak_memory_stats()

        pipes, tokens, load_s, warm_s = {}, {}, {}, {}
        for name in ("control", "fbcache"):
            t0 = time.perf_counter()
            pipes[name] = arm_pipeline(arms[name], study.model, gen)
            tokens[name] = g.text_tokens(pipes[name], gen)
            load_s[name] = time.perf_counter() - t0
        if cuda:
            result["load_device_mb"] = torch.cuda.memory_allocated() / 2**20
        first = {c.arm.name: c for c in reversed(cands)}

        def call(c: Any) -> Any:
            return run_arm(pipes[c.arm.name], c.prompt.text, c.key.stream_seed, c.arm, gen, tokens[c.arm.name])

        for name in ("control", "fbcache"):  # timing.warmup: 1 untimed run per arm
            t0 = time.perf_counter()
            call(first[name])
            if cuda:
                torch.cuda.synchronize()
            warm_s[name] = time.perf_counter() - t0
        result["load_s"], result["warmup_s"] = load_s, warm_s
        print(f"built model {result['build_model_s']:.1f}s, load {load_s}, warm-up {warm_s}", flush=True)

        # The prompts in the sequential design's seeded order; each a pair (control, fbcache) of seed 0.
        units = sequential.order({(c.key.panel, c.key.prompt_id) for c in cands}, study.timing.seed)
        by_unit: dict[tuple[str, str], list[Any]] = {}
        for c in sorted(cands, key=lambda c: c.arm.name):
            by_unit.setdefault((c.key.panel, c.key.prompt_id), []).append(c)
        pairs = [by_unit[u] for u in units]
        peak_mb = 0.0

        def time_pairs(pairs: list[list[Any]], reps: int) -> dict[str, list[dict[str, Any]]]:
            nonlocal peak_mb
            runs: dict[str, list[dict[str, Any]]] = {}
            for b0 in range(0, len(pairs), BLOCK_PAIRS):  # as _Timer.time: blocks, each repeat round seeded
                block = pairs[b0:b0 + BLOCK_PAIRS]
                for r in range(reps):
                    for c in run_order(block, study.timing.seed, b0 * reps + r):
                        _res, m = _timed_run(pipes[c.arm.name], lambda c=c: call(c), cuda, uuid)
                        runs.setdefault(c.key.prompt_id + "/" + c.arm.name, []).append(
                            {"round": r, "seconds": m["seconds"], "phases": m["phases"],
                             "peak_device_mb": m.get("peak_device_mb"),
                             "throttle_reasons": (m.get("throttled") or {}).get("reasons"),
                             "max_temperature_c": (m.get("throttled") or {}).get("max_temperature_c")})
                        peak_mb = max(peak_mb, m.get("peak_device_mb") or 0.0)
            return runs

        t0 = time.perf_counter()
        single = time_pairs(pairs, 1)
        wall_single = time.perf_counter() - t0
        print(f"timed {len(pairs)} pairs once in {wall_single:.1f}s", flush=True)
        t0 = time.perf_counter()
        rep_pairs = pairs[:args.repeat_prompts]
        repeated = time_pairs(rep_pairs, args.repeats)
        wall_rep = time.perf_counter() - t0
        print(f"timed {len(rep_pairs)} pairs x {args.repeats} repeats in {wall_rep:.1f}s", flush=True)
        smi_after = nvidia_smi()
        if cuda:
            result["max_memory_allocated_mb"] = torch.cuda.max_memory_allocated() / 2**20

    pids = [u[1] for u in units]
    lat = {a: [single[f"{p}/{a}"][0]["seconds"] for p in pids] for a in ("control", "fbcache")}
    logr = np.log(np.array(lat["control"]) / np.array(lat["fbcache"]))
    level, precision, n0 = study.stats.level, study.timing.precision, study.timing.pilot_prompts
    plan = sequential.plan(logr[:n0], level, precision, n0, len(pids), study.timing.max_prompts)
    n = plan.prompts
    mean_n = float(logr[:n].mean())
    stein_hw = sequential.stein_half_width(logr[:n0], n, level)
    lo_n, hi_n, _ = t_procedure(logr[:n], level)
    t_hw_n = float(max(mean_n - lo_n, hi_n - mean_n))
    hw_n = max(stein_hw or 0.0, t_hw_n)
    lo_all, hi_all, _ = t_procedure(logr, level)
    mean_all = float(logr.mean())

    def ratio_interval(m: float, lo: float, hi: float) -> dict[str, float]:
        return {"speedup": math.exp(m), "low": math.exp(lo), "high": math.exp(hi), "mean_log": m,
                "half_width_log": (hi - lo) / 2, "relative_half_width": math.expm1((hi - lo) / 2)}

    plan_pairs_s = sum(lat["control"][:n]) + sum(lat["fbcache"][:n])  # repeats 1 (the new default)
    all_pairs_once_s = sum(lat["control"]) + sum(lat["fbcache"])
    old_default_s = args.repeats * all_pairs_once_s  # timing.pairs: all, repeats: 3
    rep_cvs = {k: cv([x["seconds"] for x in v]) for k, v in repeated.items()}
    cv_vals = [v for v in rep_cvs.values() if v is not None]
    rep_total_s = sum(x["seconds"] for v in repeated.values() for x in v)
    # the old default's cost measured where it was run (first prompts): seconds per pair with 3 repeats
    old_measured_per_pair = rep_total_s / max(1, len(rep_pairs))
    phases = {a: {k: statistics.median(single[f"{p}/{a}"][0]["phases"][k] for p in pids)
                  for k in ("denoise", "decode", "other", "total")} for a in ("control", "fbcache")}
    throttled = sorted({r for v in [*single.values(), *repeated.values()] for x in v
                        for r in (x["throttle_reasons"] or [])})
    result.update({
        "gpu_name": result.get("gpu_name") or (smi_before or {}).get("name"),
        "nvidia_smi_after": smi_after,
        "generation": {"frames": gen.frames, "height": gen.height, "width": gen.width, "steps": gen.steps,
                       "guidance": gen.guidance, "dtype": gen.dtype, "threads": gen.threads},
        "arms": {"control": "cache: null", "fbcache": "FirstBlockCacheConfig threshold 1.2"},
        "clock": "cuda_events" if cuda else "perf_counter",
        "prompts": len(pids), "order": pids,
        "latency_s": {a: summary(v) for a, v in lat.items()},
        "phases_median_s": phases,
        "per_prompt": [{"prompt_id": p, "control_s": lat["control"][i], "fbcache_s": lat["fbcache"][i],
                        "log_ratio": float(logr[i])} for i, p in enumerate(pids)],
        "log_ratio": {"mean": mean_all, "sd": float(logr.std(ddof=1)), "sd_pilot": plan.pilot_sd,
                      "speedup_all": math.exp(mean_all)},
        "plan": {"design": sequential.DESIGN, "pilot_prompts": n0, "precision": precision, "level": level,
                 "available": len(pids), "max_prompts": study.timing.max_prompts, "prompts": n,
                 "stopped": plan.stopped, "pilot_sd_log": plan.pilot_sd,
                 "planned_half_width_log": plan.planned_half_width,
                 "target_half_width_log": math.log1p(precision)},
        "interval_plan": {**ratio_interval(mean_n, mean_n - hw_n, mean_n + hw_n), "prompts": n,
                          "stein_half_width_log": stein_hw, "t_half_width_log": t_hw_n,
                          "used": "stein" if (stein_hw or 0.0) >= t_hw_n else "t"},
        "interval_all": {**ratio_interval(mean_all, float(lo_all), float(hi_all)), "prompts": len(pids)},
        "plan_interval_covers_all_mean": bool(mean_n - hw_n <= mean_all <= mean_n + hw_n),
        "gpu_seconds": {
            "plan": plan_pairs_s, "plan_runs": 2 * n, "plan_note": "the planned N prompts x 2 arms x 1 repeat",
            "all_once": all_pairs_once_s,
            "old_default": old_default_s, "old_default_runs": 2 * len(pids) * args.repeats,
            "old_default_note": f"all {len(pids)} pairs x 2 arms x {args.repeats} repeats (from the single runs x "
                                f"{args.repeats}; warm-up excluded in both)",
            "old_default_measured_per_pair_s": old_measured_per_pair,
            "saving_ratio": old_default_s / plan_pairs_s if plan_pairs_s else None,
            "wall_single_pass_s": wall_single, "wall_repeat_pass_s": wall_rep},
        "repeats": {"prompts": len(rep_pairs), "repeats": args.repeats,
                    "cv": {"median": statistics.median(cv_vals), "mean": statistics.fmean(cv_vals),
                           "max": max(cv_vals), "over_0.05": sum(v > 0.05 for v in cv_vals),
                           "by_arm_median": {a: statistics.median(v for k, v in rep_cvs.items()
                                                                  if k.endswith("/" + a) and v is not None)
                                             for a in ("control", "fbcache")}},
                    "per_candidate": {k: [x["seconds"] for x in v] for k, v in repeated.items()}},
        "peak_device_mb": peak_mb if cuda else None,
        "throttle_reasons_seen": throttled,
        "script_wall_s": time.perf_counter() - t_start,
    })
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1, sort_keys=True, default=str) + "\n")
    ia, ip = result["interval_all"], result["interval_plan"]
    gs = result["gpu_seconds"]
    print(f"GPU: {result['gpu_name']} ({args.device}); control median {result['latency_s']['control']['median']*1e3:.2f}"
          f" ms, fbcache median {result['latency_s']['fbcache']['median']*1e3:.2f} ms")
    print(f"log ratio sd {result['log_ratio']['sd']:.4f} (pilot {plan.pilot_sd:.4f}); plan N={n} ({plan.stopped})")
    print(f"speedup plan {ip['speedup']:.4f} [{ip['low']:.4f}, {ip['high']:.4f}] (+-{ip['relative_half_width']:.2%},"
          f" {ip['used']}) vs all {len(pids)}: {ia['speedup']:.4f} [{ia['low']:.4f}, {ia['high']:.4f}]"
          f" (+-{ia['relative_half_width']:.2%})")
    print(f"timing GPU-s: plan {gs['plan']:.2f} vs old default {gs['old_default']:.2f} (x{gs['saving_ratio']:.1f});"
          f" repeat CV median {result['repeats']['cv']['median']:.4f} max {result['repeats']['cv']['max']:.4f};"
          f" peak device MB {result['peak_device_mb']}")
    print(f"wrote {out_path} in {result['script_wall_s']:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
