"""Render benchmarks/results.json into BENCHMARKS.md (so the quoted figures are the
measured ones). Usage: .venv/bin/python benchmarks/render.py [--results R] [--out O]
[--gpu G]: G is the JSON benchmarks/gpu_check.sh wrote (default benchmarks/gpu_check.json
when present). A section that did not run, or was skipped, is left out with its reason."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _slurm(su: dict | None, st: dict | None, before: dict | None = None) -> list[str]:
    if not su:
        return []
    study = [] if not _ok(st) else [
        f"The default study through `snakemake --profile profiles/slurm` (shipped profile, one GPU per panel job, "
        f"exclusive timed pass): {st['wall_s']:.0f} s wall; slot busy share {st['busy_share']:.1%} of "
        f"{st['allocated_slot_s']:.0f} allocated slot-seconds (from `study/utilisation.json`). Per job:", "",
        "| job | tasks | window s | busy share per slot |", "|---|---|---|---|",
        *[f"| {k} | {j['tasks']} | {j['window_s']:.1f} | "
          f"{', '.join(f'{s}: {v:.0%}' for s, v in j['slots'].items())} |" for k, j in sorted(st["jobs"].items())],
        "", "Each job's window includes the worker-pool start-up measured above; the tiny "
        "model's tasks of about 1 s do not amortise it. The share is computed, not assumed: longer tasks "
        "raise it, and the report shows it per job.", ""]
    if _ok(st) and _ok(before):
        study += [f"Before (per-stage jobs: a generation and a scoring job per panel, Parsl strategy period 5 s), "
                  f"the same study through the same profile on the same cluster: {before['wall_s']:.0f} s wall; "  # type: ignore[index]
                  f"slot busy share {before['busy_share']:.1%} of {before['allocated_slot_s']:.0f} allocated "  # type: ignore[index]
                  f"slot-seconds over {len(before['jobs'])} panel jobs.", ""]  # type: ignore[index, arg-type]
    return ["## Inside a Slurm allocation", "",
            f"`pairflow probe-slots --tasks {su['tasks']}` in `sbatch --gres=gpu:2` on the CI's single-node "
            f"cluster ({su['launcher']}): slots {', '.join(su['slots'])}; {su['tasks_per_s']:.0f} no-op tasks/s "
            f"after {su['startup_s']:.1f} s of pool start-up, {su['tasks_per_s_incl_startup']:.0f}/s including it.",
            "", *study]


def _metrics(me: dict) -> list[str]:
    """The metrics table: fps, cold scorer load, and load against scoring one video."""
    if "metrics" not in me:  # figures from before per-metric load times were measured
        return []
    rows = me["metrics"]
    f = next(iter(rows.values()))["frames"]
    return [f"## Metrics on this CPU (256x256, {f} frames, {me['threads']} torch thread)", "",
            ("Section alone: `.venv/bin/python benchmarks/run.py metrics`. Weighted metrics ran on a "
             f"{me['mirror_origin']} mirror (same architectures as the real weights, so the same cost). "
             "Load = building the scorer once per worker, weight verification included."), "",
            "| metric | kind | weights | fps | load s | one video s | load / one video |",
            "|---|---|---|---|---|---|---|",
            *[f"| {k} | {x['kind']} | {', '.join(x['weights']) or '-'} | {x['fps_256x256']:.1f} | {x['load_s']:.2f} | "
              f"{x['score_one_video_s']:.3f} | {x['load_over_one_video']:.2f} |" for k, x in rows.items()],
            ""]


def _stats(st: dict | None) -> list[str]:
    """Coverage and false-positive rate of the union test and the plain t-test by shape and prompt count."""
    if not st:
        return []
    rows = st["rows"]
    if "coverage_union" not in rows[0]:  # results of the t-only section before issue 23
        return []
    return ["## Intervals and tests at 3 to 30 prompts (issue 23)", "",
            "Section alone: `.venv/bin/python benchmarks/run.py stats`"
            + (f" (run {st['machine']['date']}, commit {st['machine']['code']['commit'][:12]})" if "machine" in st else "")
            + f". {rows[0]['reps']} synthetic studies per cell and column. 'union' is what PairFlow reports "
            "(`inference.union_p`: the largest p of Student t and Hall's skew-corrected t, joined by the exact "
            "sign-flip test for quantised values or at most 5 prompts; its interval is every mean it accepts); 't' the plain t-test it replaced. Shapes of the per-prompt "
            "values: normal; t3 (heavy tails); skew±k: standardised lognormal of skewness ±k (skew-: a few prompts "
            "lose a lot, a cache regression); binary: a 0/1 metric on 2 seeds per prompt (differences in steps of "
            "0.5, many ties); clustered: 2 seeds per prompt correlated 0.92; latency: log speedup from lognormal "
            f"latencies. Nominal {st['level']:.0%}: coverage should be >= 0.93 and false positives <= 0.06 "
            "(issue 23's bar, for |skewness| <= 2 at 7-30 prompts); skew+4 is beyond it and flagged in tables. At "
            "3-5 prompts the sign-flip test decides and cannot reach p < 0.05 (min p 2/2^n), so the union never "
            "rejects there and its interval is unbounded: coverage 1, false positives 0, by refusal. Power: normal data shifted "
            "by 0.8 sd.", "",
            "| shape | prompts | coverage union | coverage t | false pos. union | false pos. t | power union | power t "
            "| min sign-flip p |",
            "|---|---|---|---|---|---|---|---|---|",
            *[f"| {r['shape']} | {r['prompts']} | {r['coverage_union']:.3f} | {r['coverage_t']:.3f} | "
              f"{r['false_positive_union']:.3f} | {r['false_positive_t']:.3f} | "
              f"{r['power_union']:.3f} | {r['power_t']:.3f} | {r['signflip_min_p']:.3g} |"
              if "power_t" in r else
              f"| {r['shape']} | {r['prompts']} | {r['coverage_union']:.3f} | {r['coverage_t']:.3f} | "
              f"{r['false_positive_union']:.3f} | {r['false_positive_t']:.3f} | | | {r['signflip_min_p']:.3g} |"
              for r in rows], ""]


def _ok(x: dict | None) -> bool:
    return bool(x) and "skipped" not in x  # type: ignore[operator]


def _skipped(r: dict) -> list[str]:
    gone = {k: v["skipped"] for k, v in r.items() if isinstance(v, dict) and "skipped" in v}
    return (["## Sections not measured on this machine", "", *[f"- `{k}`: {v}" for k, v in sorted(gone.items())], ""]
            if gone else [])


def _plan(p: dict | None, rec: dict | None) -> list[str]:
    if not _ok(p):
        return []
    points = p.get("points") or {"31k": p}  # figures from before the 100k point
    out = ["## Planning large studies", "",
           "Panels of 31 prompts x 1 seed x 2 arms; one Snakemake job per panel (generation and scoring together, fleet.panel_jobs: combined), never per "
           "candidate. Peak RSS is the largest of the runs. Planning imports neither torch nor diffusers "
           "(the arms' check is its own job, rule `check_arms`), so the first dry run costs what later ones do. "
           "Every time includes Snakemake's start-up, in which its Slurm executor plugin runs `scontrol show "
           "config` (column \"Slurm probe\": where a Slurm client is installed but no controller answers it "
           "waits about 10 s; on a cluster or without Slurm it takes milliseconds).", "",
           "| candidates | jobs | dry run s | dry run peak RSS MiB | (after the first) | no-op rerun s | "
           "no-op peak RSS MiB | Slurm probe s | ms per candidate |", "|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for x in sorted(points.values(), key=lambda x: x["candidates"]):
        after = x.get("dry_run_after_first_peak_rss_mib")
        noop = ("not measured" if "noop_rerun_median_s" not in x else f"{x['noop_rerun_median_s']:.1f}"
                + (f" ({x['noop_rerun_planned_jobs']} jobs replanned)" if x.get("noop_rerun_planned_jobs") else ""))
        noop_rss = f"{x['noop_rerun_peak_rss_mib']:.0f}" if "noop_rerun_peak_rss_mib" in x else "-"
        probe = x.get("slurm_probe_s")
        out.append(f"| {x['candidates']} | {x['snakemake_jobs']} | {x['dry_run_median_s']:.1f} | "
                   f"{x['dry_run_peak_rss_mib']:.0f} | {'-' if after is None else f'{after:.0f}'} | {noop} | "
                   f"{noop_rss} | {'-' if probe is None else f'{probe:.1f}'} | {x['planning_ms_per_candidate']:.3f} |")
        if isinstance(x.get("noop"), str):
            notes.append(f"At {x['candidates']} candidates the no-op rerun was {x['noop']}.")
        if "noop_first_s" in x:
            notes.append(f"At {x['candidates']} candidates the no-op rerun runs over a finished tree written "
                         f"directly ({x['evidence_files']} evidence files: valid records, manifests and "
                         "statistics' provenance; every other output a placeholder; all outputs with one mtime "
                         f"later than every source): {x['noop_rerun_planned_jobs'] or 'no'} jobs planned. The "
                         f"first plan over it checks every record ({x['noop_first_s']:.1f} s, "
                         f"{x['noop_first_peak_rss_mib']:.0f} MiB) and remembers the panels it found clean "
                         "(`scratch/checks/evidence.json`); the no-op figure is the plans after it.")
        elif x.get("noop_rerun_planned_jobs"):
            notes.append(f"At {x['candidates']} candidates the no-op rerun runs over placeholder outputs (every "
                         "file a finished study has, marked done with `--touch`); they are not valid evidence, so "
                         f"the plan-time evidence check replanned {x['noop_rerun_planned_jobs']} jobs.")
    out += ["", *notes] if notes else []
    if rec:
        check = (f"; the schema check alone {rec['schema_check_ms']:.2f} ms (in both)"
                 if "schema_check_ms" in rec else "")
        out += ["", f"Per record: write (seal, schema check, fsync, rename) {rec['write_record_ms']:.2f} ms, read "
                    f"and verify (digest, schema) {rec['read_verify_record_ms']:.2f} ms, manifest "
                    f"{rec['manifest_ms_per_record']:.3f} ms{check}."]
        if "before_read_verify_record_ms" in rec:
            out += ["", f"Schema validation side by side ({rec['side_by_side']}): write {rec['before_write_record_ms']:.2f} "
                        f"-> {rec['after_write_record_ms']:.2f} ms, read and verify "
                        f"{rec['before_read_verify_record_ms']:.2f} -> {rec['after_read_verify_record_ms']:.2f} ms "
                        "per record."]
    return [*out, ""]


def _payload(pl: dict | None) -> list[str]:
    if not _ok(pl):
        return []
    return ["## Task payload (what Parsl serialises per task)", "",
            "One generation task's payload serialised with dill, as Parsl ships it. Before: the task carried the "
            "whole study spec and the provenance. Now: the candidate and a reference to the job's context file "
            "(written once per job under `scratch/contexts/`, named by its digest, read once per worker). "
            "Driver seconds per stage = serialise time x candidates.", "",
            "| candidates | before bytes | before ms | before driver s/stage | now bytes | now ms | now driver s/stage "
            "| context file bytes |", "|---|---|---|---|---|---|---|---|",
            *[f"| {x['candidates']} | {x['old_bytes']} | {x['old_serialize_ms']:.2f} | {x['old_driver_s_per_stage']:.0f} "
              f"| {x['new_bytes']} | {x['new_serialize_ms']:.3f} | {x['new_driver_s_per_stage']:.1f} "
              f"| {x['context_file_bytes']} |" for x in sorted(pl["points"].values(), key=lambda x: x["candidates"])],
            ""]


E2E_RUNS = {"e2e_before": "before (per-stage jobs, Parsl strategy period 5 s)",
            "e2e_per_stage": "fleet.panel_jobs: per-stage", "e2e": "fleet.panel_jobs: combined (default)"}
"""Runs of the default study the e2e section may hold, in the order they are compared."""


def _e2e_side_by_side(r: dict) -> list[str]:
    """The default study's runs side by side (same machine, one after another)."""
    runs = [(label, r[k]) for k, label in E2E_RUNS.items() if _ok(r.get(k)) and "generate_s_sum" in r[k]]
    if len(runs) < 2:
        return []

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.1%}"

    rows = [("panel job rules", lambda e: ", ".join(f"{k} {v:.1f} s" for k, v in sorted(e["job_wall_s_by_rule"].items())
                                                  if k.endswith("_panel"))),
            ("panel jobs' wall s", lambda e: f"{e.get('panel_jobs_wall_s', float('nan')):.1f}"),
            ("all jobs' wall s", lambda e: f"{e['job_wall_s']:.1f}"),
            ("generate + encode + score s (records)", lambda e: f"{e['work_s']:.1f}"),
            ("**work share of all jobs' wall time**", lambda e: pct(e.get("work_share"))),
            ("work share of the panel jobs' wall time", lambda e: pct(e.get("work_share_of_panel_jobs"))),
            ("work share of the panel jobs' slot time (wall x slots)",
             lambda e: pct(e.get("work_share_of_panel_slot_time"))),
            ("panel jobs' slot-seconds not spent on per-video work",
             lambda e: "-" if e.get("panel_overhead_slot_s") is None else f"{e['panel_overhead_slot_s']:.1f}"),
            ("slot busy share (utilisation.json)", lambda e: pct(e.get("slot_busy_share"))),
            ("load average at the end of the run", lambda e: e.get("load_average", "-")),
            ("worker processes; warm-up tasks", lambda e: f"{e['workers']}; {e['warm_up_tasks']}"),
            ("imports s; model loads s (sums over workers)",
             lambda e: f"{e['import_s_sum']:.1f}; {e['model_load_s_sum']:.1f}")]
    out = ["Side by side (the default study, `snakemake --profile profiles/local`, one run each on the same "
           "machine, at different times: other users' load varies, so per-video times vary too; the load average "
           "row says how busy the machine was):", "",
           "| | " + " | ".join(label for label, _ in runs) + " |", "|---|" + "---|" * len(runs),
           *[f"| {name} | " + " | ".join(f(e) for _, e in runs) + " |" for name, f in rows], ""]
    first, last = runs[0][1], runs[-1][1]
    if first.get("panel_overhead_slot_s") and last.get("panel_overhead_slot_s") is not None:
        slower = last["work_s"] / first["work_s"] - 1
        out += [f"Per-video seconds of the same videos, last column against first: {slower:+.0%} (other users' "
                "load). Slower videos alone raise every work share, so the shares overstate the gain when that "
                "figure is positive and understate it when negative. The panel jobs' slot-seconds not spent on "
                "per-video work "
                "(start-up, imports, loads, verification, manifests, idle tails) move least with it: "
                f"{first['panel_overhead_slot_s']:.0f} -> {last['panel_overhead_slot_s']:.0f} "
                f"({last['panel_overhead_slot_s'] / first['panel_overhead_slot_s'] - 1:+.0%}).", ""]
    return out


def _e2e(e: dict | None, r: dict | None = None) -> list[str]:
    if not _ok(e) or "generate_s_sum" not in e:  # type: ignore[operator]
        return []
    total = sum(e["job_wall_s_by_rule"].values())  # type: ignore[index]
    work = e["generate_s_sum"] + e["encode_s_sum"] + e["score_s_sum"]  # type: ignore[index]
    share = e.get("work_share", work / total if total else None)  # type: ignore[union-attr]
    out = ["## Default study by stage", "",
           f"From the last `snakemake --profile profiles/local` run ({e['candidates']} candidates): sums over "  # type: ignore[index]
           f"records of generation {e['generate_s_sum']:.1f} s, encode {e['encode_s_sum']:.1f} s, scoring "  # type: ignore[index]
           f"{e['score_s_sum']:.1f} s"  # type: ignore[index]
           + (f": **{share:.1%} of the jobs' wall time** (work share)." if share is not None else ".")]
    if "import_s_sum" in e:  # type: ignore[operator]
        out[-1] += (f" One-time costs over {e['workers']} worker processes: imports {e['import_s_sum']:.1f} s, "  # type: ignore[index]
                    f"model loads {e['model_load_s_sum']:.1f} s; {e['warm_up_tasks']} warm-up tasks took "  # type: ignore[index]
                    f"{e['warm_up_s_sum']:.1f} s while their drivers prepared.")  # type: ignore[index]
    out[-1] += " Job wall time by rule (Snakemake `benchmark:` files):"
    out += ["", "| rule | wall s |", "|---|---|",
            *[f"| {k} | {s:.1f} |" for k, s in sorted(e["job_wall_s_by_rule"].items())],  # type: ignore[index]
            f"| total | {total:.1f} |", "",
            f"Hashing (upper bound: every video hashed 4 times, raw frames once, records 4 times, at the "
            f"measured `digest_file` rate): {e['hash_s_estimate'] * 1e3:.1f} ms, {e['hash_share']:.4%} of the "  # type: ignore[index]
            "study's job time.", ""]
    return out + _e2e_side_by_side(r or {})


COST_RUNS = 3
"""Rows the cost section's table of runs keeps ready: the series of runs on a quiet machine."""


def _cost(c: dict | None) -> list[str]:
    """Issue 37: CPU per candidate, the whole study against the floor; a table of runs
    (``history``), then the latest run's figures and where its marginal cost goes."""
    if not _ok(c) or "marginal_cpu_s" not in c:  # type: ignore[operator]
        return []
    assert c is not None
    k = c["multiples"][1]
    fl = c["floor"]
    hist = c.get("history") or []
    rows = [f"| {i} | {h['date'][:16].replace('T', ' ')} | {h['commit']}{' (dirty)' if h.get('dirty') else ''} | "
            f"{' / '.join(f'{x:.1f}' for x in h['load'])} | {h['floor_cpu_s']:.3f} | {h['marginal_cpu_s']:.3f} | "
            f"**{h['marginal_over_floor']:.2f}** | {h['fixed_cpu_s']:.1f} | {' / '.join(map(str, h['candidates']))} | "
            f"{h.get('note') or ''} |" for i, h in enumerate(hist, 1)]
    rows += [f"| {i} | | | | | | | | | to be measured on a quiet machine |"
             for i in range(len(hist) + 1, max(COST_RUNS, len(hist)) + 1)]
    out = ["## Cost per candidate (issue 37)", "",
           f"Section alone: `.venv/bin/python benchmarks/run.py cost` (1x and {k}x; `--quick`: the first prompt "
           "of each panel as the base study, 1x and 2x, to check it runs). CPU seconds (user + system), the figure "
           "other users' load disturbs least, though a busy machine still slows caches and raises the study's "
           "polling and sampling. What is compared:", "",
           "- **floor**: per candidate, one warm process doing exactly what a candidate must (imports, pipeline and "
           "scorer loads paid before, in a warm-up): its arm's plain generation (`armrun.run_arm` on "
           "`arm_pipeline`; a search arm's candidates and verifier scorings included), the fixed-recipe encode "
           "(`media.video.encode`, real ffmpeg) and decode (`read_video`) and the study's scorers "
           "(`metrics.score`, FR metrics against the pair's control). `getrusage` deltas of the process and its "
           "children (ffmpeg); averaged over the study's arms as the study runs them (one of each per pair).",
           "- **study**: `snakemake --profile profiles/local` on the default study (config/config.yaml: same arms, "
           f"seeds, generation, encoder, scorers, fleet) at 1x and {k}x its prompts, each with new prompts written "
           "deterministically and fresh storage in a temporary project (the checkout's workflow copied once, "
           "imported from the copy; the embedded model copied as the main job finds it). Every process counts: the "
           "benchmark becomes a child subreaper (`PR_SET_CHILD_SUBREAPER`) before starting Snakemake, so the "
           "worker pools Parsl's provider detaches, their watchdogs, fork servers and workers, the interchange "
           "and ffmpeg are reparented to it; after Snakemake exits every remaining descendant is reaped (waited "
           "for up to 60 s, then killed and listed), and the study's CPU is the `RUSAGE_CHILDREN` delta. A /proc "
           "sampler (once a second; last seen CPU of every descendant, so a lower bound) cross-checks it and "
           "splits it by kind of process.",
           "- **marginal** = (CPU_k - CPU_1) / (candidates_k - candidates_1); **fixed** = CPU_1 - candidates_1 x "
           "marginal; **R** = marginal / floor: how many floors one more candidate costs the study.", "",
           "Runs (load: the 1-minute load average before / after the 1x study, then before / after the "
           f"{k}x one, on {c.get('cpus', '?')} CPUs):", "",
           "| run | date (UTC) | commit | load | floor CPU-s | marginal CPU-s | R | fixed CPU-s | candidates | note |",
           "|---|---|---|---|---|---|---|---|---|---|", *rows, "",
           f"Latest run ({c['date'][:16].replace('T', ' ')}), the two studies:", "",
           "| study | candidates | CPU s (user + sys) | wall s | load before -> after | sampled CPU s (processes) "
           "| Snakemake jobs' cpu_time s | killed lingering |", "|---|---|---|---|---|---|---|---|",
           *[f"| {n} | {r['candidates']} | {r['cpu_s']:.1f} ({r['user_s']:.1f} + {r['sys_s']:.1f}) | "
             f"{r['wall_s']:.1f} | {' '.join(f'{x:.1f}' for x in r['load_before'])} -> "
             f"{' '.join(f'{x:.1f}' for x in r['load_after'])} | {r['sampled']['cpu_s']:.1f} "
             f"({r['sampled']['processes']}) | {r['jobs_cpu_s']:.1f} | {len(r['killed_lingering'])} |"
             for n, r in c["runs"].items()], "",
           f"Floor over {fl['candidates']} candidates: {fl['per_candidate_cpu_s']:.3f} CPU-s each (per arm: "
           + ", ".join(f"{a} {v:.3f}" for a, v in fl["per_arm_cpu_s"].items()) + "; per phase: "
           + ", ".join(f"{p} {v:.3f}" for p, v in fl["per_phase_cpu_s"].items()) + ").", ""]
    sampled = c.get("marginal_sampled_by_rule_cpu_s")
    if sampled is not None:
        bench = c.get("marginal_by_rule_cpu_s") or {}
        m = c["marginal_cpu_s"]
        kinds = sorted(c["marginal_sampled_by_kind_cpu_s"].items(), key=lambda kv: -kv[1])
        out += [f"Where the marginal {m:.3f} CPU-s go, per added candidate ({k}x minus 1x): per rule, from the "
                "sampler (each process counted for the job that started it; the worker pools Parsl's provider "
                "detaches are matched to their panel job by their run folder) and from Snakemake's `benchmark:` "
                "files (psutil samples of the job's own process tree, each second for 30 s, then every 30 s: they miss "
                "the detached worker pools and a job's last stretch):", "",
                "| rule | sampled CPU-s | share of marginal | Snakemake cpu_time s |", "|---|---|---|---|",
                *[f"| {rule} | {v:.3f} | {v / m:.0%} | {bench[rule]:.3f} |" if rule in bench else
                  f"| {rule} | {v:.3f} | {v / m:.0%} | - |"
                  for rule, v in sorted(sampled.items(), key=lambda kv: -kv[1]) if abs(v) >= 0.0005],
                f"| not sampled (processes shorter than a sample, last second of each) | "
                f"{c['marginal_unsampled_cpu_s']:.3f} | {c['marginal_unsampled_cpu_s'] / m:.0%} | |", "",
                "By kind of process (sampled): " + ", ".join(f"{kd} {v:.3f}" for kd, v in kinds if abs(v) >= 0.0005)
                + ".", ""]
    out += [*([c["note"], ""] if c.get("note") else [])]
    return out


def _gpu(g: dict | None) -> list[str]:
    if not g:
        return ["## On a GPU", "", "Not measured yet: no accelerator was lent when these figures were taken. On a "
                "GPU machine, `bash benchmarks/gpu_check.sh` (under 8 minutes on one H100-class GPU, kill grace "
                "included) checks that torch sees CUDA (explaining a failure by the driver the wheel needs: CUDA 13 "
                "wheels, R580+) and that Snakemake is installed beside it, then runs the default study on CUDA in "
                "bfloat16 with NVML sampled every second and measures: whether a worker forked from the preloaded fork "
                "server can use CUDA (`fork_cuda_probe.py`, into `gpu_check.fork.json`: `fleet.worker_start: auto` "
                "spawns on GPU jobs until it has said yes); wall time and work share; NVML samples per "
                "panel job (>= 10 each required; under MIG per MIG device, without utilisation, which NVML does not "
                "report there); per arm the timed pass's median latency, denoise/decode split, repeat CV, peak "
                "device memory, estimated MFU (counted forward FLOPs / timed latency / the GPU's datasheet dense "
                "BF16 peak, PaLM convention; none for a MIG slice) and the throttle reasons NVML reported while "
                "timed runs ran (gpu_idle excluded; 'not watched' where NVML answered no poll); scoring on the "
                "slot's GPU. It is complete only if every generation ran on CUDA and every timed run was clocked "
                "by CUDA events. It writes `benchmarks/gpu_check.json` at every step, Snakemake's log beside it "
                "and the rules' logs under `gpu_check_logs/` (a failed study keeps their tails in the JSON; at "
                "the outer time limit the study is killed and the JSON says `stopped`) and renders its figures "
                "here with the GPU named.", ""]
    gi = g.get("gpu") or {}
    dc = g.get("driver_check") or {}
    if not dc.get("ok", True) or not gi:
        why = (dc.get("why") if not dc.get("ok", True) else g.get("error") or g.get("stopped")
               or "the check stopped before the GPU was read")
        return ["## On a GPU (`benchmarks/gpu_check.sh`)", "",
                f"Not measured: {why} "
                f"(driver {dc.get('driver')}, torch {dc.get('torch')} for CUDA {dc.get('torch_cuda')}, needs "
                f"{dc.get('driver_needed')}); {g.get('date', '')}.", ""]
    share = (g.get("e2e") or {}).get("work_share")
    rc, wall = g.get("snakemake_rc"), g.get("study_wall_s")
    state = (" (**stopped by the outer time limit: partial figures**)" if g.get("stopped")
             else " (**overran its timeout: partial figures**)" if g.get("timed_out")
             else f" (**study failed (rc {rc}): partial figures**)" if rc not in (0, None) else "")
    error = f" ({g['error']})" if g.get("error") else ""
    ran = (f"wall {wall:.1f} s{state}" if wall is not None
           else f"**stopped before the study reported**{error}" if not g.get("complete") else "wall not recorded")
    lines = ["## On a GPU (`benchmarks/gpu_check.sh`)", "",
             f"GPU: {gi.get('name', '?')} (driver {gi.get('driver', '?')}, CUDA "
             f"{gi.get('cuda', '?')}); {g.get('date', '')}; default study on CUDA in "
             f"{g.get('dtype', '?')} with the tiny model; {ran}"
             + (f"; work share {share:.1%}" if share is not None else "") + ".", ""]
    if not g.get("complete") and g.get("incomplete"):
        lines += [f"Not complete: {g['incomplete']}.", ""]
    if g.get("not_measured"):
        lines += ["Not measured: " + "; ".join(f"{k} ({v})" for k, v in sorted(g["not_measured"].items())), ""]
    nv = g.get("nvml_summary") or {}
    if nv:
        ok = g.get("nvml_samples_ok")
        lines += ["NVML per panel job: " + "; ".join(f"{k}: {v.get('min_samples', 0)} samples ({v.get('status', '?')}"
                                                     + (f"; {v['stopped']}" if v.get("stopped") else "") + ")"
                                                     for k, v in sorted(nv.items()))
                  + f". At least 10 samples per panel job: {'yes' if ok else '**no**'}.", ""]
    t = g.get("timing") or {}
    per = g.get("per_arm") or {}
    if t:
        def mfu(a: str) -> str:
            m = (per.get(a) or {}).get("mfu")
            return f"{m['mfu']:.2e} (estimated, {m['gpu']} {m['peak_tflops']:.0f} TFLOP/s)" if m else "n/a"

        def speed(a: str) -> str:
            s = (per.get(a) or {}).get("speedup")
            return f"{s:.2f}x" if s else "n/a"

        def throttle(x: dict) -> str:
            watched, runs = x.get("throttle_runs_watched"), x.get("timed_runs")
            if watched == 0:
                return "not watched"
            reasons = ", ".join(x["throttle_reasons"]) or "none"
            return f"{reasons} ({watched}/{runs} runs watched)" if watched is not None and watched < (runs or 0) \
                else reasons

        lines += ["| arm | candidates | median latency s | speedup | median denoise s | median decode s | "
                  "median repeat CV | peak device MiB | estimated MFU | throttle reasons during timed runs |",
                  "|---|---|---|---|---|---|---|---|---|---|",
                  *[f"| {a} | {x['candidates']} | {x['latency_s']:.4f} | {speed(a)} | {x['denoise_s']:.4f} | "
                    f"{x['decode_s']:.4f} | {x['cv'] if x['cv'] is None else format(x['cv'], '.1%')} | "
                    f"{x['peak_device_mb']:.0f} | {mfu(a)} | {throttle(x)} |"
                    for a, x in sorted(t.items())], ""]
        absent = sorted({v["mfu_absent"] for v in per.values() if v.get("mfu_absent")})
        if absent:
            lines += ["Estimated MFU not given: " + "; ".join(absent) + ".", ""]
    if g.get("snakemake_tail"):
        lines += ["Study log tail:", "", "```", *g["snakemake_tail"].splitlines()[-15:], "```", ""]
    for name, text in sorted((g.get("rule_logs") or {}).items())[:3] if not g.get("complete") else []:
        lines += [f"Rule log `{name}` (tail):", "", "```", *text.splitlines()[-10:], "```", ""]
    return lines


def _goals(r: dict) -> list[str]:
    """Issue 17's speed goals beside what was measured (only where the figure exists)."""
    rows = []
    pl = (r.get("payload") or {}).get("points", {})
    if pl:
        worst = max(x["new_bytes"] for x in pl.values())
        rows.append(("task payload, flat with study size", "<= 16 KB", f"{worst} B at up to "
                     f"{max(x['candidates'] for x in pl.values())} candidates", worst <= 16 * 1024))
    big = (r.get("plan") or {}).get("points", {}).get("100k")
    if big:
        probe = big.get("slurm_probe_s") or 0.0
        less = f" ({big['dry_run_median_s'] - probe:.1f} s less the {probe:.1f} s Slurm probe)" if probe > 1 else ""
        rows.append(("dry run at 100k candidates", "< 10 s", f"{big['dry_run_median_s']:.1f} s{less}",
                     big["dry_run_median_s"] < 10))
        after = big.get("dry_run_after_first_peak_rss_mib")
        rows.append(("planning peak RSS at 100k", "< 400 MiB", f"{big['dry_run_peak_rss_mib']:.0f} MiB (first run), "
                     + (f"{after:.0f} MiB after" if after else "-"), big["dry_run_peak_rss_mib"] < 400))
        if "noop_rerun_median_s" in big:
            less = f" ({big['noop_rerun_median_s'] - probe:.1f} s less the Slurm probe)" if probe > 1 else ""
            replanned = (f", {big['noop_rerun_planned_jobs']} jobs replanned over placeholders"
                         if big.get("noop_rerun_planned_jobs") else "")
            rows.append(("no-op rerun at 100k", "< 15 s", f"{big['noop_rerun_median_s']:.1f} s{less}{replanned}",
                         big["noop_rerun_median_s"] < 15))
    e = r.get("e2e") or {}
    if e.get("work_share") is not None:
        b = r.get("e2e_before") or {}
        rows.append(("default study: generation + encoding + scoring share of wall time", ">= 50%",
                     f"{e['work_share']:.1%}" + (f" (before: {b['work_share']:.1%}; the runs' loads differ, see "
                                                  "\"Default study by stage\")" if b.get("work_share") else ""),
                     e["work_share"] >= 0.5))
    st = r.get("slurm_study") or {}
    if st.get("busy_share") is not None:
        sb = r.get("slurm_study_before") or {}
        # issue 17's figure counted warm-up as work over Parsl's window only; issue 25 replaced that
        # definition (task work over whole allocations), so this row says which one it is.
        rows.append(("slot busy share through profiles/slurm, *issue 17's definition* (warm-up counted as work, "
                     "over Parsl's window only)", ">= 85%", f"{st['busy_share']:.1%}"
                     + (f" (before: {sb['busy_share']:.1%})" if sb.get("busy_share") else "")
                     + "; by issue 25's definition (task work, warm-up excluded, over whole allocations) the "
                       "default study's is about a third: see \"Slurm on two nodes\"",
                     st["busy_share"] >= 0.85))
    if not rows:
        return []
    return ["## Speed goals (issue 17)", "", "| goal | target | measured | met |", "|---|---|---|---|",
            *[f"| {g} | {t} | {m} | {'yes' if ok else '**no**'} |" for g, t, m, ok in rows], ""]


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results.json")
    ap.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    ap.add_argument("--gpu", type=Path, default=ROOT / "benchmarks" / "gpu_check.json")
    args = ap.parse_args(argv)
    r = json.loads(args.results.read_text())
    gpu = json.loads(args.gpu.read_text()) if args.gpu.is_file() else None
    m = r["machine"]
    code = m["code"]
    lines = [
        "# Benchmarks", "",
        "Measured with `.venv/bin/python benchmarks/run.py` (all sections, medians of "
        f"{r['runs']} runs; the planning section 3 runs), rendered by `.venv/bin/python benchmarks/render.py`. "
        "Raw figures: `benchmarks/results.json`. Ratios are measured side by side in one run. Every section also "
        "has `--quick` (tiny sizes, one run), which the test suite runs so no section rots.", "",
        f"Machine: {m['platform']}, {m['cpus']} CPUs, Python {m['python']}; torch {m['packages']['torch']}, "
        f"diffusers {m['packages']['diffusers']}, parsl {m['packages']['parsl']}, snakemake "
        f"{m['packages']['snakemake']}; commit {code['commit']} (dirty: {code['dirty']}); {m['date']}"
        + (" **(quick mode: tiny sizes, not figures to quote)**" if r.get("quick") else "") + ".", "",
        *_goals(r)]
    v, h = r.get("video"), r.get("hash")
    if _ok(v):
        lines += [
            "## Video writer vs bare ffmpeg (issue: fixed-encoder video I/O)", "",
            f"{v['frames']} frames of {v['size']}, libx264 CRF 18 medium, the project's recipe.", "",
            "| | median s | fps |", "|---|---|---|",
            f"| writer (guards, encode, probe, digest, fsync, rename) | {v['writer_median_s']:.3f} | {v['writer_fps']:.0f} |",
            f"| bare `ffmpeg` on the same raw frames and arguments | {v['bare_ffmpeg_median_s']:.3f} | {v['bare_fps']:.0f} |",
            f"| **writer / bare** | **{v['writer_over_bare']:.3f}** | |",
            f"| `read_video` (probe + checked decode) | | {v['decode_read_video_fps']:.0f} |",
            f"| bare `ffmpeg` decode to rgb24 | | {v['decode_bare_fps']:.0f} |", ""]
    if _ok(h):
        lines += ["## Hashing (integrity cost)", "",
                  f"On {h['bytes'] >> 20} MiB in memory: xxh3_128 {h['xxh3_128_MBps']:.0f} MB/s, sha256 "
                  f"{h['sha256_MBps']:.0f} MB/s (sha256 is {h['sha256_over_xxh3']:.1f}x slower); `digest_file` from "
                  f"disk {h['digest_file_MBps']:.0f} MB/s.", ""]
    from archive_bench import render as _archive  # benchmarks/archive_bench.py

    lines += [*_plan(r.get("plan"), r.get("records")), *_archive(r.get("archive")), *_payload(r.get("payload"))]
    lo, sl = r.get("loads"), r.get("slots")
    if _ok(lo):
        lines += [
            "## Models loaded once per worker", "",
            f"Tiny model: load {lo['load_median_s']:.3f} s, one generation {lo['generate_median_s']:.3f} s. For "
            f"{lo['candidates']} candidates: once per worker {lo['once_per_worker_s']:.2f} s (1 load) vs per candidate "
            f"{lo['per_candidate_s']:.2f} s ({lo['loads_per_candidate']} loads): {lo['saved_share']:.0%} saved. "
            "A real checkpoint loads in tens of seconds, so the saving grows with it.", ""]
    if _ok(sl):
        lines += [
            "## Parsl slots", "",
            f"{sl['tasks']} sleep tasks of 0.05-1.0 s ({sl['task_seconds']:.0f} task-seconds) on {sl['slots']} slots "
            f"({sl['slots_requested']} requested; Parsl caps CPU workers at the cores it sees) "
            f"through the project's own `fleet.make_config`: busy share {sl['busy_share_of_makespan']:.1%} of slot "
            f"time between the first start and the last end; the rest is the tail ({sl['tail_idle_slot_s']:.1f} idle "
            f"slot-seconds while the last tasks finish) and dispatch gaps. Start-up before the first task: "
            f"{sl['startup_s']:.1f} s. No-op tasks: {sl['noop_tasks_per_s_incl_startup']:.0f}/s including start-up "
            f"({sl['noop_tasks']} tasks), {sl.get('noop_tasks_per_s_after_startup', float('nan')):.0f}/s after it.", ""]
    lines += [*(_slurm(r.get("slurm"), r.get("slurm_study"), r.get("slurm_study_before")) if _ok(r.get("slurm")) else []),
              *(_metrics(r["metrics"]) if _ok(r.get("metrics")) else []),
              *(_stats(r.get("stats")) if _ok(r.get("stats")) else []),
              *_e2e(r.get("e2e"), r), *_cost(r.get("cost")), *_gpu(gpu), *_skipped(r)]
    if r.get("write_speed"):
        ws = r["write_speed"]
        lines += ["## Writer vs bare ffmpeg at the default size and 480p (issue 25)", "",
                  f"`benchmarks/write_speed.py` ({ws['date']}): the writer (guards, encode, decode-back check, "
                  "probe, digest, fsync, rename) and the bare `ffmpeg` CLI on the same frames and recipe, "
                  "alternated; fastest run (the figure other users' load disturbs least) and median. Goal: "
                  "writer <= 1.15x bare.", "",
                  "| frames | runs | writer ms (fastest / median) | bare ms (fastest / median) | writer / bare "
                  "(fastest / medians) |", "|---|---|---|---|---|",
                  *[f"| {k} | {v['runs']} | {v['writer_min_s'] * 1e3:.1f} / {v['writer_median_s'] * 1e3:.1f} | "
                    f"{v['bare_min_s'] * 1e3:.1f} / {v['bare_median_s'] * 1e3:.1f} | {v['ratio_min']:.3f} / "
                    f"{v['ratio_median']:.3f} |" for k, v in ws["sizes"].items()], "",
                  *([ws["note"], ""] if ws.get("note") else [])]
    if _ok(r.get("compute")):
        co = r["compute"]
        lines += ["## Compute accounting and arms (issues 16, 25)", "",
                  f"Tiny Wan at {co['size']}, one prompt, in one process (measured {co['date']}). Plain: as the "
                  "timed pass runs; derived: hooks count block and attention calls and FLOPs come from a table "
                  "measured once by full counting (the bulk pass); full: hooks + `FlopCounterMode` (the table's "
                  f"measurement and the seeded cross-check). Plain and derived alternate, {co.get('pairs', '?')} "
                  "runs each, medians; CPU = this thread's CPU seconds (torch runs one thread), the figure other "
                  "users' load disturbs least. Derived FLOPs equal full counting's to the FLOP on every arm "
                  "(checked in the run). Compute ratio is exact; speedup is this CPU's.", "",
                  "| arm | plain s | derived s | plain CPU s | derived CPU s | derived overhead (CPU) | "
                  "full counting | compute ratio | speedup | blocks skipped/total |",
                  "|---|---|---|---|---|---|---|---|---|---|",
                  *[f"| {n} | {a['plain_s']:.3f} | {a.get('derived_s', float('nan')):.3f} | "
                    f"{a.get('plain_cpu_s', float('nan')):.3f} | {a.get('derived_cpu_s', float('nan')):.3f} | "
                    f"{a.get('derived_cpu_overhead', float('nan')) - 1:+.1%} | {a['counting_overhead']:.2f}x | "
                    f"{a['compute_ratio']:.3f} | {a['speedup']:.2f}x | {a['blocks_skipped']}/"
                    f"{a['blocks_skipped'] + a['blocks_computed']} |" for n, a in co["arms"].items()], ""]
        if "study_derived_cpu_overhead" in co:
            lines += [f"**Default study (each arm once per pair): counting overhead "
                      f"{co['study_derived_cpu_overhead'] - 1:+.1%} of plain generation in CPU seconds "
                      f"({co['study_derived_overhead'] - 1:+.1%} wall; goal <= 5%)**, against "
                      f"{sum(a['counted_s'] for a in co['arms'].values()) / sum(a['plain_s'] for a in co['arms'].values()):.2f}x "
                      "for full counting. The hooks cost a fixed few microseconds per hooked module call (26 "
                      "per transformer call on the tiny model: its 4 blocks and 8 attention modules, entry and "
                      "exit, and the transformer; a child module is hooked only where a cache wraps its parent or a "
                      "block holds no attention module, and a full count hooks every child to confirm the signals), "
                      "so the arm with the cheapest generation per call shows the largest share; on a real "
                      "checkpoint a block call takes milliseconds and the share vanishes.", ""]
        if "study_bulk" in co:
            sb = co["study_bulk"]
            lines += [f"The whole bulk pass as the default study runs it ({sb['candidates_per_arm']} candidates per "
                      f"arm, {sb['full_counts_per_arm']} of them counted in full: the table's measurement, once "
                      "per arm and shape, and the seeded cross-check, one per arm per panel): "
                      f"**{sb['overhead'] - 1:+.0%} over plain generation**, from the medians above. That is the "
                      "full counts: FlopCounterMode sends every aten op through Python, 4-6x a tiny model's "
                      "sub-millisecond ops, a few percent of a real checkpoint's. The goal (<= 5%) is the "
                      "derived figure, the cost of counting a video once its table exists; the cross-checks "
                      "are the price of never trusting a table unchecked.", ""]
        lines += ["Counting runs only in the bulk pass, whose times are never reported. The timed pass runs "
                  "without it.", "", *([co["note"], ""] if co.get("note") else [])]
    text = "\n".join(lines)
    args.out.write_text(keep_hand_sections(text, args.out.read_text() if args.out.is_file() else ""))
    print(f"wrote {args.out}")


def _sections(text: str) -> tuple[str, list[tuple[str, str]]]:
    """``text`` split at its ``## `` headings: (the part before the first, [(heading, section)])."""
    parts = ("\n" + text).split("\n## ")
    return parts[0].lstrip("\n"), [(p.split("\n", 1)[0], "## " + p) for p in parts[1:]]


def _stem(heading: str) -> str:
    """A heading without its parenthesised detail (sizes, a tool's name), which a render may change."""
    return heading.split(" (")[0].strip()


def owned_stems() -> frozenset[str]:
    """The stems of every heading this file can render, read from its own source: a
    section it renders under a changed heading, or no longer renders (a GPU run replacing
    "not measured yet"), is its own and is replaced or dropped, never kept twice."""
    return frozenset(_stem(h) for h in re.findall(r'"## ([^"{]+)', Path(__file__).read_text()))


def keep_hand_sections(rendered: str, existing: str, owned: frozenset[str] | None = None) -> str:
    """``rendered`` with the sections of ``existing`` it does not own kept, in their
    places: some sections are written by hand from their own raw files (planning, the
    archive, Slurm on two nodes, ...), and a render must not delete them. A section this
    file owns (``owned``: heading stems, default ``owned_stems()``) is replaced in its place
    by its new rendering (matched by stem), or dropped when no longer rendered; sections
    rendered for the first time go after."""
    owned = owned_stems() if owned is None else owned
    head, new = _sections(rendered)
    _, old = _sections(existing)
    pending = {_stem(h): section for h, section in new}
    out: list[str] = []
    for heading, section in old:
        if _stem(heading) in pending:  # its new rendering, in its place
            out.append(pending.pop(_stem(heading)))
        elif _stem(heading) not in owned:
            out.append(section)
    out += list(pending.values())  # sections rendered for the first time
    return "\n".join([head.rstrip("\n") + "\n", *(s.rstrip("\n") + "\n" for s in out)])

if __name__ == "__main__":
    main()
