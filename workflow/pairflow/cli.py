"""``pairflow`` command line: verify trees, build the tiny model, mirror scorer weights, run one step by hand."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .errors import PairFlowError


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive count; give at least 1")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pairflow", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("verify", help="prove a results tree or archive complete and consistent; exit 1 on any "
                       "problem")
    v.add_argument("path", type=Path, help="a results tree (storage.scratch), an archive (work/<study>) or one snapshot")
    v.add_argument("--configfile", type=Path, help="the study config (default: the snapshot the manifests record)")
    v.add_argument("--json", action="store_true", help="print the report as JSON")
    a = sub.add_parser("archive", help="manage archive snapshots")
    asub = a.add_subparsers(dest="archive_cmd", required=True)
    ar = asub.add_parser("retire", help="set a damaged snapshot aside (kept, excluded from latest.json, reported as "
                         "retired); the next run promotes a new one")
    ar.add_argument("snapshot", help="snapshot id (a directory name under work/<study>/snapshots)")
    ar.add_argument("--why", required=True, help="the reason, kept in the sealed retirement note")
    ar.add_argument("--configfile", type=Path, default=Path("config/config.yaml"))
    b = sub.add_parser("build-tiny-model", help="build the embedded tiny Wan pipeline (or a tiny one of another family)")
    b.add_argument("out", type=Path)
    b.add_argument("--family", default="wan", help="wan (the embedded model), cogvideox, ltx or hunyuanvideo")
    c = sub.add_parser("check-config", help="validate a study config and its prompt sheets")
    c.add_argument("config", type=Path)
    m = sub.add_parser("mirror", help="download every scorer weight into DIR and lock its digests (needs internet; "
                       "run once per site, then set weights/mirror: DIR)")
    m.add_argument("--dest", type=Path, required=True)
    t = sub.add_parser("build-test-mirror", help="random-initialised weights in the mirror layout (tests and "
                       "benchmarks only: the scores mean nothing)")
    t.add_argument("dest", type=Path)
    r = sub.add_parser("rerun-panel", help="regenerate, rescore and re-analyse one panel; others untouched")
    r.add_argument("panel")
    r.add_argument("--configfile", type=Path, default=Path("config/config.yaml"))
    r.epilog = "Everything after '--' goes to snakemake, e.g. -- --profile profiles/local"
    ps = sub.add_parser("probe-slots", help="run no-op tasks on this job's Parsl slots; report "
                        "slots started and tasks per second (run it inside sbatch/salloc)")
    ps.add_argument("--tasks", type=_positive, default=1000)
    ps.add_argument("--cpu-workers", type=int, default=2, help="workers where no GPU was granted")
    ps.add_argument("--out", type=Path, required=True, help="telemetry JSON (spans, slots, rate)")
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        if args.cmd == "verify":
            return verify(args.path, args.configfile, args.json)
        if args.cmd == "archive":
            from .archive import retire
            from .config import load_study

            study = load_study(args.configfile, Path.cwd())
            note = retire(study.work / study.study, args.snapshot, args.why, study.scratch)
            print(f"retired {args.snapshot}: {note}; rerun the workflow to promote a new snapshot")
            return 0
        if args.cmd == "build-tiny-model":
            from .tinymodel import build_tiny_model

            build_tiny_model(args.out, args.family)
            return 0
        if args.cmd == "check-config":
            from .config import load_study
            from .arms import check_arms

            s = load_study(args.config)
            check_arms(s.arms, s.model)
            n = sum(len(p.prompts) * len(p.seeds) for p in s.panels) * len(s.arms)
            print(f"{args.config}: OK, study {s.study}, {len(s.panels)} panel(s), {n} candidates")
            return 0
        if args.cmd in ("mirror", "build-test-mirror"):
            from .weights import build_test_mirror, fetch

            lock = fetch(args.dest) if args.cmd == "mirror" else build_test_mirror(args.dest)
            for rel, digest in sorted(lock.files.items()):
                print(f"{digest}  {rel}")
            print(f"{args.dest}: {len(lock.files)} file(s), origin {lock.origin}, lock {lock.digest}")
            return 0
        if args.cmd == "probe-slots":
            return probe_slots(args.tasks, args.cpu_workers, args.out)
        if args.cmd == "rerun-panel":
            return rerun_panel(args.panel, args.configfile, extra)
    except PairFlowError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def verify(path: Path, configfile: Path | None, as_json: bool) -> int:
    """Verify a results tree, an archive or one snapshot; print one line per problem
    (grouped by kind) and notes, then a summary. Returns 0 when everything holds, else 1."""
    import dataclasses

    from .archive import ARCHIVE_MANIFEST, verify_archive, verify_tree
    from .config import load_study
    from .evidence import Report, check_results, recorded_study, temp_files, write_verify_json

    if (path / "latest.json").exists() or (path / "snapshots").is_dir():
        report = verify_archive(path)
    elif (path / ARCHIVE_MANIFEST).exists():
        report = Report()
        for line in verify_tree(path):
            file, _, message = line.partition(": ")
            report.add("extra" if "extra file" in message else "missing" if message.startswith("missing")
                       else "altered", file, message)
        for t in temp_files(path):
            report.add("temp", t, "left by an interrupted write; safe to delete")
    else:
        if configfile is not None:
            study = dataclasses.replace(load_study(configfile, Path.cwd()), scratch=path.resolve())
        else:
            study = recorded_study(path)
        report = check_results(study, deep=True)
    if as_json:
        print(write_verify_json(report, path))
    else:
        for line in report.lines():
            print(line)
        n = len(report.problems)
        notes = f" ({len(report.notes)} note(s))" if report.notes else ""
        print(f"verify {path}: {'OK' if report.ok else f'{n} problem(s)'}{notes}")
    return 0 if report.ok else 1


def probe_slots(tasks: int, cpu_workers: int, out: Path) -> int:
    """What this allocation really starts: one no-op task per payload through the same
    executor config the rules use; prints the slots seen and the task rate (per-task
    overhead), and writes the telemetry record to ``out``."""
    import json
    import os
    import time

    from .atomic import write_text
    from .config import FleetSpec
    from .fleet import grant_from_env, noop, run_tasks

    grant = grant_from_env(dict(os.environ))
    start = time.time()
    run_tasks(noop, [{}] * tasks, out.parent / f"{out.stem}-run", FleetSpec(cpu_workers, 0), grant,
              "probe-slots", out)
    total = time.time() - start
    t = json.loads(out.read_text())
    first = min(s["started"] for s in t["spans"])
    rate = tasks / max(t["window"]["end"] - first, 1e-9)
    t["probe"] = {"tasks": tasks, "total_s": total, "startup_s": first - start, "tasks_per_s": rate,
                  "tasks_per_s_incl_startup": tasks / total}
    write_text(out, json.dumps(t, indent=1, sort_keys=True) + "\n")
    print(f"probe-slots: {len(t['slots'])} slot(s) {sorted(t['slots'])}; {tasks} no-op tasks at {rate:.0f}/s "
          f"after {first - start:.1f}s start-up; {tasks / total:.0f}/s including start-up")
    return 0


def rerun_panel(panel: str, configfile: Path, extra: list[str]) -> int:
    """Clear one panel's records, scores, timings and videos, then run Snakemake with that
    panel's generation forced. Other panels' files are not touched; the study statistics,
    plots and archive (a new snapshot) follow from the changed inputs."""
    import shutil
    import subprocess

    from .config import load_study
    from .locks import hold
    from .panel import panel_dir

    study = load_study(configfile, Path.cwd())
    pdir = panel_dir(study, study.panel(panel).name)
    with hold(pdir, f"rerun-panel {panel}"):
        for sub in ("records", "scores", "timing", "videos"):
            shutil.rmtree(pdir / sub, ignore_errors=True)
    argv = [str(Path(sys.executable).with_name("snakemake")), "--configfile", str(configfile),
            "--forcerun", str(pdir / "generation.json"), *extra]
    print("running:", " ".join(argv), flush=True)
    return subprocess.run(argv, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
