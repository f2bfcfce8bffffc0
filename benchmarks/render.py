"""Render benchmarks/results.json into BENCHMARKS.md (so the quoted figures are the
measured ones). Usage: .venv/bin/python benchmarks/render.py"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _slurm(su: dict | None, st: dict | None) -> list[str]:
    if not su:
        return []
    study = [] if not st else [
        f"The default study through `snakemake --profile profiles/slurm` (shipped profile, one GPU per panel job, "
        f"exclusive timed pass): {st['wall_s']:.0f} s wall; slot busy share {st['busy_share']:.1%} of "
        f"{st['allocated_slot_s']:.0f} allocated slot-seconds (from `study/utilisation.json`). Per job:", "",
        "| job | tasks | window s | busy share per slot |", "|---|---|---|---|",
        *[f"| {k} | {j['tasks']} | {j['window_s']:.1f} | "
          f"{', '.join(f'{s}: {v:.0%}' for s, v in j['slots'].items())} |" for k, j in sorted(st["jobs"].items())],
        "", "Each job's window includes the worker-pool start-up measured above (about 10 s); the tiny "
        "model's tasks of about 1 s do not amortise it. The share is computed, not assumed: longer tasks "
        "raise it, and the report shows it per job.", ""]
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
    """Coverage and false-positive rate of the interval/test procedures by prompt count."""
    if not st:
        return []
    rows = st["rows"]
    return ["## Intervals and tests at 3 to 30 prompts", "",
            "Section alone: `.venv/bin/python benchmarks/run.py stats`"
            + (f" (run {st['machine']['date']}, commit {st['machine']['code']['commit'][:12]})" if "machine" in st else "")
            + f". {rows[0]['reps']} synthetic studies per "
            f"cell: prompts x {st['seeds']} seeds, measurement noise sd {st['noise_sd']} per arm and pair, each "
            f"prompt's true effect {st['effect']} (or 0 for the false-positive columns) plus a prompt-level spread of "
            f"sd {st['prompt_sd']} (normal) or a centred exponential of sd {st.get('skewed_sd', st['prompt_sd'])} "
            f"(skewed: a few prompts gain a lot, the hard case for a t-interval). Nominal level {st['level']:.0%}: "
            f"coverage should be {st['level']:.2f}, false positives {1 - st['level']:.2f}. 't' is what PairFlow "
            "reports (Student t-interval over prompts and the t-test inverted from it); 'bootstrap' is the "
            f"percentile bootstrap over prompts it used before ({st['bootstrap_resamples']} resamples); 'sign-flip' "
            "the exact permutation test (its smallest attainable p is 2/2^n). 'contradictions' counts studies "
            "where the t-interval and the t-test disagree.", "",
            "| shape | prompts | coverage t | coverage bootstrap | false pos. t | false pos. bootstrap | "
            "false pos. sign-flip | power t | power sign-flip | min sign-flip p | contradictions |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
            *[f"| {r['shape']} | {r['prompts']} | {r['coverage_t']:.3f} | {r['coverage_bootstrap']:.3f} | "
              f"{r['false_positive_t']:.3f} | {r['false_positive_bootstrap']:.3f} | {r['false_positive_signflip']:.3f} | "
              f"{r['power_t']:.3f} | {r['power_signflip']:.3f} | {r['signflip_min_p']:.3g} | {r['contradictions_t']} |"
              for r in rows], ""]


def main() -> None:
    r = json.loads((ROOT / "benchmarks" / "results.json").read_text())
    m, v, h, p, rec, lo, sl, me = (r["machine"], r["video"], r["hash"], r["plan"], r["records"], r["loads"],
                                   r["slots"], r["metrics"])
    e = r.get("e2e", {})
    code = m["code"]
    lines = [
        "# Benchmarks", "",
        "Measured with `.venv/bin/python benchmarks/run.py` (all sections, medians of "
        f"{r['runs']} runs; the planning section 3 runs), rendered by `.venv/bin/python benchmarks/render.py`. "
        "Raw figures: `benchmarks/results.json`. Ratios are measured side by side in one run.", "",
        f"Machine: {m['platform']}, {m['cpus']} CPUs, Python {m['python']}; torch {m['packages']['torch']}, "
        f"diffusers {m['packages']['diffusers']}, parsl {m['packages']['parsl']}, snakemake "
        f"{m['packages']['snakemake']}; commit {code['commit']} (dirty: {code['dirty']}); {m['date']}.", "",
        "## Video writer vs bare ffmpeg (issue: fixed-encoder video I/O)", "",
        f"{v['frames']} frames of {v['size']}, libx264 CRF 18 medium, the project's recipe.", "",
        "| | median s | fps |", "|---|---|---|",
        f"| writer (guards, encode, probe, digest, fsync, rename) | {v['writer_median_s']:.3f} | {v['writer_fps']:.0f} |",
        f"| bare `ffmpeg` on the same raw frames and arguments | {v['bare_ffmpeg_median_s']:.3f} | {v['bare_fps']:.0f} |",
        f"| **writer / bare** | **{v['writer_over_bare']:.3f}** | |",
        f"| `read_video` (probe + checked decode) | | {v['decode_read_video_fps']:.0f} |",
        f"| bare `ffmpeg` decode to rgb24 | | {v['decode_bare_fps']:.0f} |", "",
        "## Hashing (integrity cost)", "",
        f"On {h['bytes'] >> 20} MiB in memory: xxh3_128 {h['xxh3_128_MBps']:.0f} MB/s, sha256 "
        f"{h['sha256_MBps']:.0f} MB/s (sha256 is {h['sha256_over_xxh3']:.1f}x slower); `digest_file` from disk "
        f"{h['digest_file_MBps']:.0f} MB/s.", "",
        "## Planning 31,000 candidates", "",
        f"500 panels x 31 prompts x 1 seed x 2 arms = {p['candidates']} candidates, {p['snakemake_jobs']} Snakemake "
        "jobs (one per panel per heavy stage, never per candidate).", "",
        "| | median s | peak RSS MiB |", "|---|---|---|",
        f"| `snakemake -n` (dry run) | {p['dry_run_median_s']:.1f} | {p['dry_run_peak_rss_mib']:.0f} |",
        f"| no-op rerun (`snakemake -n` on a finished study) | {p['noop_rerun_median_s']:.1f} | "
        f"{p['noop_rerun_peak_rss_mib']:.0f} |", "",
        f"Planning costs {p['planning_ms_per_candidate']:.2f} ms per candidate. Per record: write (seal, fsync, "
        f"rename) {rec['write_record_ms']:.2f} ms, read and verify {rec['read_verify_record_ms']:.2f} ms, manifest "
        f"{rec['manifest_ms_per_record']:.3f} ms.", "",
        "## Models loaded once per worker", "",
        f"Tiny model: load {lo['load_median_s']:.3f} s, one generation {lo['generate_median_s']:.3f} s. For "
        f"{lo['candidates']} candidates: once per worker {lo['once_per_worker_s']:.2f} s (1 load) vs per candidate "
        f"{lo['per_candidate_s']:.2f} s ({lo['loads_per_candidate']} loads): {lo['saved_share']:.0%} saved. "
        "A real checkpoint loads in tens of seconds, so the saving grows with it.", "",
        "## Parsl slots", "",
        f"{sl['tasks']} sleep tasks of 0.05-1.0 s ({sl['task_seconds']:.0f} task-seconds) on {sl['slots']} slots "
        f"({sl['slots_requested']} requested; Parsl caps CPU workers at the cores it sees) "
        f"through the project's own `fleet.make_config`: busy share {sl['busy_share_of_makespan']:.1%} of slot time "
        f"between the first start and the last end; the rest is the tail ({sl['tail_idle_slot_s']:.1f} idle "
        f"slot-seconds while the last tasks finish) and dispatch gaps. Start-up before the first task: "
        f"{sl['startup_s']:.1f} s. No-op tasks: {sl['noop_tasks_per_s_incl_startup']:.0f}/s including start-up "
        f"({sl['noop_tasks']} tasks), {sl.get('noop_tasks_per_s_after_startup', float('nan')):.0f}/s after it.", "",
        *_slurm(r.get("slurm"), r.get("slurm_study")),
        *_metrics(me),
        *_stats(r.get("stats")),
    ]
    if "generate_s_sum" in e:
        total = sum(e["job_wall_s_by_rule"].values())
        lines += ["## Default study by stage", "",
                  f"From the last `snakemake --profile profiles/local` run ({e['candidates']} candidates): sums over "
                  f"records of model load {e['model_load_s_sum']:.1f} s, generation {e['generate_s_sum']:.1f} s, "
                  f"encode {e['encode_s_sum']:.1f} s, scoring {e['score_s_sum']:.1f} s. Job wall time by rule "
                  "(Snakemake `benchmark:` files):", "", "| rule | wall s |", "|---|---|",
                  *[f"| {k} | {s:.1f} |" for k, s in sorted(e["job_wall_s_by_rule"].items())],
                  f"| total | {total:.1f} |", "",
                  f"Hashing (upper bound: every video hashed 4 times, raw frames once, records 4 times, at the "
                  f"measured `digest_file` rate): {e['hash_s_estimate'] * 1e3:.1f} ms, {e['hash_share']:.4%} of the "
                  "study's job time.", ""]
    if r.get("compute"):
        co = r["compute"]
        lines += ["## Compute accounting and arms (issue 16)", "",
                  f"Tiny Wan at {co['size']}, one prompt, median of {co['runs']} runs per arm in one process "
                  f"(measured {co['date']}). "
                  "Counted: block forwards (hooks) and FLOPs (`FlopCounterMode`), as the bulk pass does; plain: as "
                  "the timed pass does. Compute ratio is exact; speedup is this CPU's.", "",
                  "| arm | plain s | counted s | counting overhead | compute ratio | speedup | blocks skipped/total |",
                  "|---|---|---|---|---|---|---|",
                  *[f"| {n} | {a['plain_s']:.3f} | {a['counted_s']:.3f} | {a['counting_overhead']:.2f}x | "
                    f"{a['compute_ratio']:.3f} | {a['speedup']:.2f}x | {a['blocks_skipped']}/"
                    f"{a['blocks_skipped'] + a['blocks_computed']} |" for n, a in co["arms"].items()], "",
                  "Counting runs only in the bulk pass, whose times are never reported; on the tiny model its "
                  "per-op dispatch costs several times the arithmetic, on a real checkpoint's large matmuls far "
                  "less. The timed pass runs without it.", "", *([co["note"], ""] if co.get("note") else [])]
    (ROOT / "BENCHMARKS.md").write_text("\n".join(lines))
    print("wrote BENCHMARKS.md")


if __name__ == "__main__":
    main()
