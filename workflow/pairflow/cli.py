"""The ``pairflow`` command line: check a config, follow a running study, verify its
evidence, export its results as tidy tables, rerun one panel, and the helpers that build
models and weight mirrors.

Exit codes (distinct from argparse's usage error, 2):

    0  success
    1  the check ran and found problems (verify: evidence incomplete or altered;
       status --check: failures present; card: the declared part deviates from its seal)
    2  usage error: unknown subcommand or option, missing argument (argparse)
    3  PairFlow refused the input (config, sheet, tree, lock): the message says the fix
    130  interrupted (Ctrl-C)

A subcommand that runs Snakemake (rerun-panel) exits with Snakemake's own code.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from .analysis.inference import too_few_prompts
from .arms import check_arms, check_models
from .atomic import FULL, no_space, write_text
from .budget.calibrate import calibrate, read_table, table_path
from .budget.estimate import check_budget, estimate, summary_lines
from .errors import ConfigError, PairFlowError
from .evidence.archive import ARCHIVE_MANIFEST, retire, show, verify_archive, verify_tree
from .evidence.cards import check_archive_card, check_snapshot_card
from .evidence.healing import drop_memo
from .evidence.verification import Report, check_results, recorded_study, temp_files, write_verify_json
from .fleet.pool import TaskHooks, noop, run_tasks
from .fleet.sites import grant_from_env
from .generation.tinymodel import build_tiny_model
from .layout import CANDIDATE_KINDS, Layout, as_named
from .locks import hold
from .metrics.weights import build_test_mirror, fetch
from .plan.candidates import panel_dir
from .plan.config import FleetSpec, StudySpec, load_study
from .report.card import AS_DECLARED, write_card
from .report.export import export
from .report.status import as_dict, render, study_status
from .report.tracker import require as require_tracker

# Lazy on purpose: rich is imported inside the live display: optional, never a dependency.

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_REFUSED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
DEFAULT_CONFIG = Path("config/config.yaml")
SNAKEFILES = ("Snakefile", "snakefile", "workflow/Snakefile", "workflow/snakefile")
"""Where snakemake looks for the workflow in the folder it runs in: a folder holding one
is a project."""
DIRECTORY_HELP = ("the project: the directory snakemake runs in, which relative paths in the config (sheets, "
                  "storage, model) resolve against, as snakemake's own --directory (default: the current "
                  "directory; where it holds no Snakefile and the config lies in a project's config/ folder, "
                  "that project)")

EXAMPLES = """\
examples:
  pairflow check-config config/config.yaml
  pairflow status --watch 30              # while snakemake runs, here or on a login node
  pairflow status --directory ~/pairflow  # from another folder: the project snakemake runs in
  pairflow verify results/scratch         # prove the results complete and consistent
  pairflow verify results/work/tiny-default --json
  pairflow export results/scratch --format csv   # candidates.csv and summary.csv for pandas
  pairflow card                           # the claim card: sealed before generation, results after
  pairflow rerun-panel smoke -- --profile profiles/local
  pairflow calibrate                      # the frozen table: seconds and peak memory per phase and arm
  pairflow estimate --nodes 4 --slots-per-node 8   # slot-seconds per stage and arm, GPU-hours, wall time
  pairflow archive retire SNAPSHOT_ID --why "bit rot on /work"
  pairflow archive show SNAPSHOT_ID xxh3_128:...   # one archived record, by record digest or candidate id

exit codes: 0 ok, 1 problems found, 2 usage error, 3 input refused (the message says the
fix), 130 interrupted. Docs: README.md and docs/ (every config key: docs/configuration.md)."""


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive count; give at least 1")
    return value


def _version() -> str:
    try:
        return version("pairflow")
    except PackageNotFoundError:  # run from a checkout without `pip install -e .`
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="pairflow", formatter_class=fmt, epilog=EXAMPLES,
        description=textwrap.fill(
            "Paired evaluation of video-generation models: check a study config, follow a running study, verify "
            "its evidence, export its results, rerun one panel. The study itself runs with "
            "`snakemake --profile profiles/local` (or "
            "profiles/slurm).", 88))
    parser.add_argument("--version", action="version", version=f"pairflow {_version()}")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND", title="commands")

    def command(name: str, summary: str, details: str = "") -> argparse.ArgumentParser:
        text = "\n\n".join(textwrap.fill(t, 88) for t in (summary[0].upper() + summary[1:] + ".", details) if t)
        return sub.add_parser(name, help=summary, description=text, formatter_class=fmt)

    def study_args(p: argparse.ArgumentParser, what: str = "the study config") -> None:
        p.add_argument("--configfile", type=Path, default=None, help=f"{what} (default: {DEFAULT_CONFIG} in "
                       "DIR); a relative path starts in the current directory, as snakemake's does")
        p.add_argument("--directory", "-d", type=Path, default=None, metavar="DIR", help=DIRECTORY_HELP)

    c = command("check-config", "validate a study config and its prompt sheets; load no model",
                "Prints the study, panel and candidate counts when the config is valid. Every error names the "
                "key, the file and the fix. Relative paths in the config resolve against the directory snakemake "
                "runs in (--directory), as they do in a run; it prints which folder that was.")
    c.add_argument("config", type=Path, nargs="?", default=None,
                   help=f"the study config (default: {DEFAULT_CONFIG})")
    c.add_argument("--configfile", type=Path, default=None, dest="configfile",
                   help="the study config, as the other commands and snakemake take it (same as CONFIG)")
    c.add_argument("--directory", "-d", type=Path, default=None, metavar="DIR", help=DIRECTORY_HELP)
    st = command("status", "progress of a study per panel and stage: done/total, rate, time left, failures, "
                 "active worker slots, busy share",
                 "Reads the outputs, failure records, heartbeats and telemetry under storage.scratch; takes no "
                 "lock and writes nothing, so it is safe beside running jobs.")
    study_args(st)
    st.add_argument("--watch", type=_positive, metavar="SECONDS", nargs="?", const=10, default=None,
                    help="redraw in place every SECONDS (default 10) until every stage is done or Ctrl-C")
    st.add_argument("--json", action="store_true", help="print the progress as JSON (one object; with --watch, "
                    "one line per refresh)")
    st.add_argument("--check", action="store_true", help="exit 1 when any failure record exists")
    v = command("verify", "prove a results tree or an archive complete and consistent; exit 1 on any problem",
                "One line per problem, grouped by kind and naming each file, then a summary.")
    v.add_argument("path", type=Path, help="a results tree (storage.scratch), an archive (work/<study>) or one "
                   "snapshot")
    v.add_argument("--configfile", type=Path, help="the study config (default: the one the manifests record; a "
                   "relative path starts in the current directory)")
    v.add_argument("--directory", "-d", type=Path, default=None, metavar="DIR", help="with --configfile: "
                   + DIRECTORY_HELP)
    v.add_argument("--json", action="store_true", help="print the report as JSON")
    ex = command("export", "write the results as tidy tables: one row per candidate, one per (arm, metric)",
                 "candidates.<format>: ids, arm, prompt, seed, every metric, latency, compute and the digests of "
                 "the records each row was read from; summary.<format>: every paired estimate of the study "
                 "statistics with the digest of stats.json. Parquet needs pyarrow.")
    ex.add_argument("path", type=Path, help="a results tree (storage.scratch)")
    ex.add_argument("--format", choices=["csv", "parquet"], default="csv", help="table format (default csv)")
    ex.add_argument("--out", type=Path, default=None, metavar="DIR",
                    help="where to write the tables (default: PATH/study/export)")
    cd = command("card", "write the study's claim card: what it declares before generation, what it found after",
                 "card.json: the declared part (questions, margins, alpha, family, planned N, stopping rule, seeds, "
                 "prompt sheets', model and scorer weights' digests, encoder recipe, decode mode, static filter, "
                 "code and environment, VBench coverage), sealed by its digest and never rewritten; "
                 "card-results.json once the study statistics exist (per arm speedup, compute ratio, peak memory, "
                 "verdicts; noise floor; archive root) with every deviation from the seal; card.md: both as one "
                 "page. Exit 1 when the declared part now deviates from the sealed one.")
    study_args(cd)
    cd.add_argument("--out", type=Path, default=None, metavar="DIR",
                    help="where to write the card (default: storage.scratch/study)")
    r = command("rerun-panel", "regenerate, rescore and re-analyse one panel; other panels untouched",
                "Everything after '--' goes to snakemake, e.g. pairflow rerun-panel smoke -- --profile "
                "profiles/local")
    r.add_argument("panel", help="a panel name from the config's panels")
    study_args(r)
    a = command("archive", "manage archive snapshots on work storage")
    asub = a.add_subparsers(dest="archive_cmd", required=True, metavar="ACTION", help="retire, show")
    ar = asub.add_parser("retire", help="set a damaged snapshot aside (kept, excluded from latest.json, reported "
                         "as retired); the next run promotes a new one",
                         description="Set a damaged snapshot aside: it is kept, excluded from latest.json and "
                         "reported as retired; the next run promotes a new one.")
    ar.add_argument("snapshot", help="snapshot id (a directory name under work/<study>/snapshots)")
    ar.add_argument("--why", required=True, help="the reason, kept in the sealed retirement note")
    study_args(ar)
    ash = asub.add_parser("show", help="print one archived record (read from its pack: one block inflated)",
                          description="Print one archived record as it was written: by its record digest, or "
                          "by a candidate id (that candidate's generation record, or with --part its score or "
                          "timing record).")
    ash.add_argument("snapshot", help="snapshot id (under work/<study>/snapshots) or a snapshot directory")
    ash.add_argument("key", help="a record digest or candidate id (xxh3_128:<hex> or the bare hex)")
    ash.add_argument("--part", choices=["generation", "score", "timing"], default="generation",
                     help="with a candidate id: which of its records (default: generation)")
    study_args(ash, "the study config, to find work/<study> from a snapshot id")
    b = command("build-tiny-model", "build a tiny random-weight pipeline (the embedded Wan model, or another "
                "family for tests)", "Real diffusers classes, seeded weights, saved with save_pretrained; "
                "byte-reproducible.")
    b.add_argument("out", type=Path, help="the folder to write the pipeline to")
    b.add_argument("--family", default="wan", choices=["wan", "cogvideox", "ltx", "hunyuanvideo"],
                   help="pipeline family (default: wan, the embedded model)")
    m = command("mirror", "download every scorer weight into DEST and lock its digests",
                "Needs internet; run once per site, then set weights/mirror: DEST in the config.")
    m.add_argument("--dest", type=Path, required=True, help="the mirror folder")
    t = command("build-test-mirror", "random-initialised weights in the mirror layout (tests and benchmarks "
                "only: the scores mean nothing)")
    t.add_argument("dest", type=Path, help="the mirror folder")
    ps = command("probe-slots", "run no-op tasks on this job's Parsl slots; report slots started and tasks per "
                 "second", "Run it inside sbatch/salloc to see what an allocation really starts.")
    ps.add_argument("--tasks", type=_positive, default=1000, help="no-op tasks to run (default 1000)")
    ps.add_argument("--cpu-workers", type=_positive, default=2, help="workers where no GPU was granted "
                    "(default 2)")
    ps.add_argument("--out", type=Path, required=True, help="telemetry JSON to write (spans, slots, rate)")
    cal = command("calibrate", "measure one representative candidate per arm in a fresh worker (seconds and peak "
                  "memory per phase) into the frozen calibration table",
                  "The table is named by the digest of its key (model, arms, generation settings, scorers, "
                  "software) under storage.scratch/calibration/ and records the device kind it was measured on; "
                  "an existing table for the same key measured on this device kind is kept unless --force. Run "
                  "it where the panel jobs run. The workflow's calibrate rule runs this before the fan-out.")
    study_args(cal)
    cal.add_argument("--force", action="store_true", help="measure again even when the table exists")
    es = command("estimate", "slot-seconds per stage and arm, GPU-hours and wall time of the study, from the "
                 "calibration table; exit 3 when over fleet.budget_gpu_hours",
                 "Reads the table 'pairflow calibrate' made (never measures). Wall time is for NODES x SLOTS.")
    study_args(es)
    es.add_argument("--nodes", type=_positive, default=1, help="nodes the fan-out runs on (default 1)")
    es.add_argument("--slots-per-node", type=_positive, default=None, metavar="SLOTS",
                    help="GPUs per node (default: 1 on CUDA, fleet.cpu_workers on CPU)")
    es.add_argument("--json", action="store_true", help="print the estimate as JSON")
    return parser


CHATTER = ("bitsandbytes", "kernels")
"""Libraries whose warnings are chatter on a PairFlow console: bitsandbytes (imported with
diffusers' models by the arms' check) warns at import that an optional 4-bit CPU kernel is
not in the offline cache; PairFlow never runs 4-bit kernels."""


def on_console(record: logging.LogRecord) -> bool:
    """The console's filter: PairFlow's own lines from INFO, other libraries' from WARNING
    (Parsl's INFO lines stay off), those in ``CHATTER`` from ERROR."""
    library = record.name.split(".", 1)[0]
    if library == "pairflow":
        return True
    return record.levelno >= (logging.ERROR if library in CHATTER else logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(on_console)
    try:
        return _run(args, extra)
    except PairFlowError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `pairflow status | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _run(args: argparse.Namespace, extra: list[str]) -> int:
    if args.cmd == "verify":
        return verify(args.path, args.configfile, args.json, args.directory)
    if args.cmd == "status":
        return status(locate(args.configfile, args.directory), args.watch, args.check, args.json)
    if args.cmd == "export":
        _require_tree(args.path)
        study = recorded_study(args.path)
        out = writable(args.out, "--out") if args.out is not None else Layout(args.path).export
        for written in export(study, out, args.format):
            print(written)
        return EXIT_OK
    if args.cmd == "card":
        study = locate(args.configfile, args.directory).study()
        card, res, found, paths = write_card(study, writable(args.out, "--out") if args.out is not None else None)
        for p in paths:
            print(p)
        print(f"claim card {card['seal']} (sealed {card['sealed']}); "
              f"{'results added' if res['finished'] else 'no study statistics yet'}; "
              + (AS_DECLARED if not found else f"{len(found)} deviation(s): " + ", ".join(f['field'] for f in found)))
        return EXIT_PROBLEMS if found else EXIT_OK
    if args.cmd == "archive":
        if args.archive_cmd == "show":
            sdir = Path(args.snapshot)
            if not sdir.is_dir():
                study = locate(args.configfile, args.directory).study()
                sdir = study.work / study.study / "snapshots" / args.snapshot
            sys.stdout.buffer.write(show(sdir, args.key, args.part))
            sys.stdout.flush()
            return EXIT_OK
        study = locate(args.configfile, args.directory).study()
        note = retire(study.work / study.study, args.snapshot, args.why, study.scratch)
        print(f"retired {args.snapshot}: {note}; rerun the workflow to promote a new snapshot")
        return EXIT_OK
    if args.cmd == "build-tiny-model":
        writable(args.out.parent, "OUT", shown=args.out)  # the pipeline replaces OUT in one rename
        build_tiny_model(args.out, args.family)
        return EXIT_OK
    if args.cmd == "check-config":
        if args.config is not None and args.configfile is not None and args.config != args.configfile:
            raise ConfigError(f"check-config was given two configs, {args.config} and --configfile "
                              f"{args.configfile}; give one")
        where = locate(args.config or args.configfile, args.directory, quiet=True)
        config = where.name
        s = where.study()
        # a model a rule builds (the embedded tiny one) may be missing yet; any other is refused
        notes = check_models(s.model, s.arms, config,
                             built=frozenset([s.model.path] if s.model.kind == "embedded-tiny" else []),
                             project=where.directory)
        check_arms(s.arms, s.model)
        require_tracker(s, config)  # report/tracker's package, as planning checks it
        n = sum(len(p.planned) * len(p.seeds) for p in s.panels) * len(s.arms)
        print(f"{config}: OK, study {s.study}, {len(s.panels)} panel(s), {n} candidates; relative paths "
              f"resolved against {where.directory} ({where.why})")
        for line in [*notes, *too_few_prompts(s)]:
            print(f"{'note' if line in notes else 'warning'}: {line}", file=sys.stderr)
        return EXIT_OK
    if args.cmd in ("mirror", "build-test-mirror"):
        writable(args.dest, "--dest" if args.cmd == "mirror" else "DEST")
        lock = fetch(args.dest) if args.cmd == "mirror" else build_test_mirror(args.dest)
        for rel, digest in sorted(lock.files.items()):
            print(f"{digest}  {rel}")
        print(f"{args.dest}: {len(lock.files)} file(s), origin {lock.origin}, lock {lock.digest}")
        return EXIT_OK
    if args.cmd == "probe-slots":
        if args.out.is_dir():
            raise ConfigError(f"--out {args.out} is a folder; give the telemetry JSON file to write, e.g. --out "
                              f"{args.out / 'probe.json'}")
        writable(args.out.parent, "--out", shown=args.out)
        return probe_slots(args.tasks, args.cpu_workers, args.out)
    if args.cmd == "rerun-panel":
        return rerun_panel(args.panel, locate(args.configfile, args.directory), extra)
    if args.cmd == "calibrate":
        where = locate(args.configfile, args.directory)
        study = where.study()
        check_models(study.model, study.arms, where.name, project=where.directory)  # it loads the model
        table = calibrate(study, force=args.force)
        print(f"calibration table {table_path(study)} ({table['device']}, key {table['key']})")
        for stage, v in table["packing"].items():
            if isinstance(v, dict):
                print(f"  {stage}: {v['workers']} worker(s) per {'GPU' if table['device'] == 'cuda' else 'node'} "
                      f"({v['why']})")
        return EXIT_OK
    if args.cmd == "estimate":
        where = locate(args.configfile, args.directory)
        study = where.study()
        est = estimate(study, read_table(study), args.nodes, args.slots_per_node)
        print(json.dumps(est, indent=1, sort_keys=True) if args.json
              else "\n".join(summary_lines(est, study.fleet.budget_gpu_hours)))
        check_budget(study, est, where.name)
        return EXIT_OK
    raise AssertionError(f"unhandled command {args.cmd}")  # argparse only lets known commands through


@dataclasses.dataclass(frozen=True)
class Where:
    """Where a command reads its study: the config file (absolute), the project folder
    its relative paths resolve against (the directory snakemake runs in), why that
    folder, and the config as messages name it (as given, or ``config/config.yaml`` in
    the current directory)."""

    config: Path
    directory: Path
    why: str
    name: str

    def study(self) -> StudySpec:
        """The study, its relative paths resolved against ``directory``."""
        return load_study(self.config, self.directory)


def is_project(folder: Path) -> bool:
    """Whether snakemake finds a workflow in ``folder`` (one of ``SNAKEFILES``)."""
    return any((folder / name).is_file() for name in SNAKEFILES)


def locate(config: Path | None, directory: Path | None, quiet: bool = False) -> Where:
    """The config and the project folder a command works on, as snakemake would find
    them: ``directory`` (``--directory``), else the current directory, unless that holds
    no Snakefile while the config lies in the ``config/`` folder of a project (then that
    project, where snakemake must run). A relative ``config`` starts in the current
    directory (snakemake makes ``--configfile`` absolute before it changes directory);
    without one, ``config/config.yaml`` in the project. Prints the project to stderr when
    it was inferred (not ``quiet``). Raises ConfigError naming the folder and the fix."""
    cwd = Path.cwd()
    path = cwd / config if config is not None else None
    if directory is not None:
        folder, why = directory.resolve(), "--directory"
        if not folder.is_dir():
            raise ConfigError(f"--directory {directory} is not a directory; give the directory snakemake runs in "
                              "(the project, the folder holding the Snakefile)")
    else:
        home = path.resolve().parent.parent if path is not None and path.resolve().parent.name == "config" else None
        if not is_project(cwd) and home is not None and is_project(home):
            folder, why = home, (f"the project holding the config, where snakemake runs; the current directory "
                                 f"{cwd} holds no Snakefile")
            if not quiet:
                print(f"pairflow: relative paths in {config} resolve against {folder} ({why})", file=sys.stderr)
        else:
            folder, why = cwd, "the current directory"
    if config is None:
        path = folder / DEFAULT_CONFIG
        if not path.is_file():
            raise ConfigError(f"no {DEFAULT_CONFIG} in {folder} ({why}): run pairflow in the project folder (the "
                              "one holding the Snakefile, where snakemake runs), or give --directory PROJECT or "
                              "--configfile FILE")
    else:
        path = cwd / config
        if not path.exists() and (folder / config).is_file():
            raise ConfigError(f"config file {path} does not exist: a relative --configfile starts in the current "
                              f"directory {cwd}, as snakemake's does; give {folder / config}")
    name = str(config) if config is not None else str(as_named(path))
    return Where(path, folder, why, name)


def writable(path: Path, flag: str, shown: Path | None = None) -> Path:
    """Refuse an output folder ``path`` this process cannot create or write, before a
    command does any work and without creating anything: a file is created and removed
    in the nearest folder of ``path`` that exists (the folder itself when it does).
    Raises ConfigError in one line (``flag``, the path as given, ``shown`` when that is
    not the folder itself, the system's reason and the fix), or StorageError when that
    disk is full. Returns ``path``."""
    given = shown if shown is not None else path
    where = "" if shown is None else f" (in {path})"
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {given}{where}: {path} is a file, not a folder; give a folder (created when "
                          "missing)")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(f"cannot write {flag} {given}{where}: {existing} is a file, not a folder; give a path on "
                          "a file system this user can write (missing folders are created)")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        if e.errno in FULL:
            raise no_space(path, e) from None
        raise ConfigError(f"cannot write {flag} {given}{where}: creating a file in {existing} failed "
                          f"({e.strerror or e}); give a path on a file system this user can write (missing folders "
                          "are created)") from None
    return path


def status(where: Where, watch: int | None, check: bool, as_json: bool = False) -> int:
    """Print the progress of the study ``where`` names once, or every ``watch`` seconds
    until every stage is done: redrawn in place on a terminal (rich's live display where
    rich is installed, else ANSI cursor moves), appended only when it changed otherwise;
    ``as_json``: one JSON object per refresh. Returns EXIT_PROBLEMS when ``check`` and a
    failure record exists."""
    study = where.study()
    tty = sys.stdout.isatty() and not as_json
    draw = _redrawer() if watch and tty else None
    last = ""
    while True:
        rows = study_status(study)
        if as_json:
            print(json.dumps(as_dict(rows, study), sort_keys=True), flush=True)
        else:
            text = render(rows, study)
            if draw is not None:
                draw(f"{time.strftime('%H:%M:%S')}  {text}")
            elif text != last:  # not a terminal: a log keeps only the refreshes that changed
                print(time.strftime("%H:%M:%S"), text, sep="  ", flush=True)
            last = text
        if not watch or all(r.finished for r in rows):
            break
        time.sleep(watch)
    return EXIT_PROBLEMS if check and any(r.failures for r in rows) else EXIT_OK


def _redrawer() -> Any:
    """A function that draws a block of text over the previous one: rich's live display
    where rich is installed (optional; never a dependency), else ANSI (move the cursor up
    over the last block, clear to the end of the screen), so the terminal keeps one block."""
    try:
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text
    except ImportError:
        lines = [0]

        def ansi(text: str) -> None:
            up = f"\033[{lines[0]}F" if lines[0] else ""
            sys.stdout.write(f"{up}\033[J{text}\n")
            sys.stdout.flush()
            lines[0] = text.count("\n") + 1

        return ansi

    live = Live(console=Console(), auto_refresh=False, transient=False)
    live.start()
    atexit.register(live.stop)  # also on Ctrl-C: the cursor comes back

    def rich_draw(text: str) -> None:
        live.update(Text(text), refresh=True)

    return rich_draw


def _require_tree(path: Path) -> None:
    """Refuse, in one line, a path that is not a results tree (no ``panels`` or ``study``
    folder), instead of one "record is missing" line per expected file."""
    if not Layout(path).panels.is_dir() and not Layout(path).study.is_dir():
        what = "does not exist" if not path.exists() else "is not a results tree (no panels/ or study/ folder in it)"
        raise ConfigError(f"{path} {what}; give the study's storage.scratch folder (e.g. results/scratch), an "
                          "archive (results/work/<study>) or one snapshot")


def verify(path: Path, configfile: Path | None, as_json: bool, directory: Path | None = None) -> int:
    """Verify a results tree, an archive or one snapshot; print one line per problem
    (grouped by kind) and notes, then a summary. ``configfile`` (relative paths against
    ``directory``, as ``locate``) replaces the config the manifests record. Returns 0
    when everything holds, else 1."""
    if (path / "latest.json").exists() or (path / "snapshots").is_dir():
        report = verify_archive(path)
        check_archive_card(path, report)
    elif (path / ARCHIVE_MANIFEST).exists():
        report = Report()
        for line in verify_tree(path):
            file, _, message = line.partition(": ")
            report.add("extra" if "extra file" in message else "missing" if message.startswith("missing")
                       else "altered", file, message)
        for t in temp_files(path):
            report.add("temp", t, "left by an interrupted write; safe to delete")
        check_snapshot_card(path, report)
    else:
        _require_tree(path)
        if configfile is not None:
            study = dataclasses.replace(locate(configfile, directory).study(), scratch=path.resolve())
        else:
            study = recorded_study(path)
        report = check_results(study, deep=True)
        if not report.ok:  # the next plain run checks every panel in full and re-hashes every video
            drop_memo(study.scratch)
    if as_json:
        print(write_verify_json(report, path))
    else:
        for line in report.lines():
            print(line)
        n = len(report.problems)
        notes = f" ({len(report.notes)} note(s))" if report.notes else ""
        print(f"verify {path}: {'OK' if report.ok else f'{n} problem(s)'}{notes}")
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def probe_slots(tasks: int, cpu_workers: int, out: Path) -> int:
    """What this allocation really starts: one no-op task per payload through the same
    executor config the rules use; prints the slots seen and the task rate (per-task
    overhead), and writes the telemetry record to ``out``."""
    grant = grant_from_env(os.environ)
    start = time.time()
    run_tasks(noop, [{}] * tasks, out.parent / f"{out.stem}-run", FleetSpec(cpu_workers, 0), grant,
              "probe-slots", TaskHooks(telemetry_out=out))
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


def rerun_panel(panel: str, where: Where, extra: list[str]) -> int:
    """Clear one panel's records, scores, timings and videos, then run Snakemake in the
    project ``where`` names with that panel's generation forced. Other panels' files are
    not touched; the study statistics, plots and archive (a new snapshot) follow from the
    changed inputs."""
    study = where.study()
    layout = Layout(study.scratch)
    pdir = panel_dir(layout, study.panel(panel).name)
    with hold(pdir, f"rerun-panel {panel}"):
        for sub in CANDIDATE_KINDS:
            shutil.rmtree(pdir / sub, ignore_errors=True)
    config = as_named(where.config, where.directory)
    target = as_named(Layout(study.scratch).generation_manifest(study.panel(panel).name), where.directory)
    argv = [str(Path(sys.executable).with_name("snakemake")), "--configfile", str(config), "--forcerun", str(target),
            *extra]
    print(f"running in {where.directory}:", " ".join(argv), flush=True)
    return subprocess.run(argv, cwd=where.directory, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
