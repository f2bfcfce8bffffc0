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
    v = sub.add_parser("verify", help="re-hash a results tree or archive; non-zero on any problem")
    v.add_argument("path", type=Path)
    b = sub.add_parser("build-tiny-model", help="build the embedded tiny Wan pipeline (or a tiny one of another family)")
    b.add_argument("out", type=Path)
    b.add_argument("--family", default="wan", help="wan (the embedded model), cogvideox or ltx")
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
            from .archive import verify_tree

            problems = verify_tree(args.path)
            for p in problems:
                print(p)
            print(f"verify {args.path}: {'OK' if not problems else f'{len(problems)} problem(s)'}")
            return 1 if problems else 0
        if args.cmd == "build-tiny-model":
            from .tinymodel import build_tiny_model

            build_tiny_model(args.out, args.family)
            return 0
        if args.cmd == "check-config":
            from .config import load_study
            from .generate import check_arms

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
