"""The ``compute`` section of ``benchmarks/run.py``. Compute accounting: plain, derived and
full FLOP counting side by side; each arm's ratio."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import (
    median_time,
)


def bench_compute(runs: int, quick: bool = False) -> dict[str, Any]:
    """Compute accounting on the tiny model at the default study's size (9x64x64, 6
    steps; quick: 5x32x32, 3 steps), side by side in one process: plain generation (the
    timed pass), derived counting (hooks, FLOPs from a measured table: the bulk pass) and
    full counting (hooks + FlopCounterMode: the table's measurement and the cross-check),
    and each default arm's exact compute ratio beside its measured speedup. Plain and
    derived alternate run by run (the overhead goal is 5%, under the shared machine's
    noise otherwise); derived FLOPs are checked equal to full counting's."""
    from pairflow.arms import Verifier
    from pairflow.generation import generate as g
    from pairflow.generation.armrun import run_arm
    from pairflow.generation.tinymodel import build_tiny_model
    from pairflow.plan.config import ArmSpec, EncoderSpec, GenerationSpec, ModelSpec, SearchSpec

    model = ModelSpec("embedded-tiny", build_tiny_model(Path(tempfile.mkdtemp()) / "tiny"))
    gen = GenerationSpec(5, 32, 32, 3, 5.0, 8, "float32", 1) if quick else GenerationSpec(9, 64, 64, 6, 5.0, 8,
                                                                                          "float32", 1)
    pipe = g.load_pipeline(model, "float32", 1)
    enc = EncoderSpec("", "libx264", 18, "medium", "yuv420p", 9, 1, False, False)
    verifier = Verifier("temporal_flickering", True, enc, None, 16, 8)
    arms = [ArmSpec("control"), ArmSpec("fbcache", "FirstBlockCacheConfig", {"threshold": 1.2}),
            ArmSpec("fewstep", steps=2), ArmSpec("best2", search=SearchSpec(2, "temporal_flickering"))]
    pairs = 1 if quick else max(runs, 5) * 3
    out: dict[str, Any] = {"size": "5x32x32, 3 steps" if quick else "9x64x64, 6 steps", "runs": runs,
                           "pairs": pairs, "arms": {}}
    for arm in arms:
        def plain(arm: Any = arm) -> Any:
            return run_arm(pipe, "a fox", 0, arm, gen, 64, verifier=verifier)

        def counted(arm: Any = arm) -> Any:
            return run_arm(pipe, "a fox", 0, arm, gen, 64, count=True, verifier=verifier, table_key="bench")

        plain()
        full = counted()
        table = full.measured

        def derived(arm: Any = arm, table: Any = table) -> Any:
            return run_arm(pipe, "a fox", 0, arm, gen, 64, count=True, verifier=verifier, table=table, full=False)

        work = derived().compute
        if work["method"] != "derived" or work["work_flops"] != full.compute["work_flops"]:
            raise RuntimeError(f"{arm.name}: derived FLOPs {work['work_flops']} ({work['method']}) differ from "
                               f"full counting's {full.compute['work_flops']}")
        # wall and this thread's CPU seconds (torch runs one thread here): on a shared machine
        # the CPU seconds are what other users' load disturbs least
        times: dict[str, list[float]] = {"plain": [], "derived": [], "plain_cpu": [], "derived_cpu": []}
        for _ in range(pairs):
            for name, fn in (("plain", plain), ("derived", derived)):
                t, c = time.perf_counter(), time.thread_time()
                fn()
                times[f"{name}_cpu"].append(time.thread_time() - c)
                times[name].append(time.perf_counter() - t)
        out["arms"][arm.name] = {"plain_s": statistics.median(times["plain"]),
                                 "derived_s": statistics.median(times["derived"]),
                                 "plain_cpu_s": statistics.median(times["plain_cpu"]),
                                 "derived_cpu_s": statistics.median(times["derived_cpu"]),
                                 "plain_total_s": sum(times["plain"]), "derived_total_s": sum(times["derived"]),
                                 "plain_cpu_total_s": sum(times["plain_cpu"]),
                                 "derived_cpu_total_s": sum(times["derived_cpu"]),
                                 "counted_s": median_time(counted, runs),
                                 "work_flops": work["work_flops"], "blocks_skipped": work["blocks_skipped"],
                                 "blocks_computed": work["blocks_computed"]}
    ctrl = out["arms"]["control"]
    for a in out["arms"].values():
        a["compute_ratio"] = a["work_flops"] / ctrl["work_flops"]
        a["speedup"] = ctrl["plain_s"] / a["plain_s"]
        a["counting_overhead"] = a["counted_s"] / a["plain_s"]
        a["derived_overhead"] = a["derived_s"] / a["plain_s"]
        a["derived_cpu_overhead"] = a["derived_cpu_s"] / a["plain_cpu_s"]
    # the default study runs each arm once per pair: its overhead is total derived over total plain
    arms_ = out["arms"].values()
    out["study_derived_overhead"] = sum(a["derived_total_s"] for a in arms_) / sum(a["plain_total_s"] for a in arms_)
    out["study_derived_cpu_overhead"] = (sum(a["derived_cpu_total_s"] for a in arms_)
                                         / sum(a["plain_cpu_total_s"] for a in arms_))
    out["study_bulk"] = bulk_pass_mix(out["arms"])
    out["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return out


def bulk_pass_mix(arms: dict[str, Any]) -> dict[str, Any]:
    """The default study's whole bulk pass as it runs, from this run's per-arm medians:
    per arm, every candidate derived except the full counts: one table measurement per
    arm (tables are kept under scratch by key, so the panels of one shape share it) and
    one seeded cross-check per arm per panel (``stages.generation.flop_checks``). The
    overhead over plain generation of all of them; the derived figure above is the
    per-candidate cost once the table exists."""
    from pairflow.plan.config import load_study

    from .common import ROOT

    study = load_study(ROOT / "config" / "config.yaml", ROOT)
    per_arm = sum(len(p.prompts) * len(p.seeds) for p in study.panels)
    full = 1 + len(study.panels)
    plain = derived = 0.0
    for a in arms.values():
        plain += per_arm * a["plain_s"]
        derived += (per_arm - full) * a["derived_s"] + full * a["counted_s"]
    return {"candidates_per_arm": per_arm, "full_counts_per_arm": full, "overhead": derived / plain}
