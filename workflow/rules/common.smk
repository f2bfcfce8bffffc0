# Validate the config against the schema (filling defaults; pairflow.plan.config, not
# snakemake.utils.validate: see below), type it once, and name every output path. Paths come from the config's storage roots.
import os
import sys
from pathlib import Path

from snakemake.logging import logger

# This workflow's own checkout, from this file's place in it (workflow/rules/): when the
# workflow is used as a module (snakedeploy, `module ...: snakefile:`), workflow.basedir is
# the deploying project's workflow folder, not this checkout.
HOME = Path(str(workflow.current_basedir)).parents[1]
sys.path.insert(0, str(HOME / "workflow"))
# envs/pairflow.yaml installs this checkout (`-e ${PAIRFLOW_HOME}`) when Snakemake
# creates it (`--software-deployment-method conda`); pip expands the variable.
os.environ.setdefault("PAIRFLOW_HOME", str(HOME))
from pairflow.plan.config import check_config_files, study_from_raw  # noqa: E402
from pairflow.errors import PairFlowError  # noqa: E402
from pairflow.evidence.healing import heal_stamp, heal_stamps, mark_stale, stamp_input  # noqa: E402
from pairflow.layout import Layout, as_named  # noqa: E402
from pairflow.arms import arms_check_inputs, arms_check_key, check_models  # noqa: E402
from pairflow.budget.calibrate import load_table, publish_iso_compute  # noqa: E402
from pairflow.errors import BudgetError  # noqa: E402
from pairflow.budget.calibrate import key as calibration_key  # noqa: E402
from pairflow.budget.estimate import check_budget, drivers, estimate, summary_lines  # noqa: E402
from pairflow.fleet import orphans  # noqa: E402
from pairflow.stages.steps import check_panel_rules  # noqa: E402
from pairflow.report.tracker import require as require_tracker  # noqa: E402
from pairflow.analysis.inference import too_few_prompts  # noqa: E402
from pairflow.plan.config import look_counts, look_stops  # noqa: E402


# After every run, failed or not, its jobs go into the ledger (study/ledger.json and
# ledger.md): every job's own account (scratch/accounts/), the scheduler's figures for
# each Slurm submission, and the jobs' telemetry before a rerun overwrites it. Rule
# utilisation adds what ran before it; these add a failed run's jobs (never the archive
# rule's: the ledger is sealed by it, pairflow.budget.ledger). A dry run executes nothing
# and writes nothing.
def ledger_after_run():
    if workflow.remote_exec or workflow.subprocess_exec or plans_only():
        return
    from pairflow.stages.steps import add_to_ledger

    try:
        add_to_ledger(STUDY)
    except (OSError, ValueError, KeyError, PairFlowError) as e:
        logger.warning(f"PairFlow: could not add this run's jobs to the ledger: {type(e).__name__}: {e}")


onsuccess:
    ledger_after_run()


onerror:
    ledger_after_run()
    budget_refused()  # where rule estimate refused the study, its one message and exit 3 (below)
    if orphans.interrupted():  # Ctrl-C or SIGTERM: its one line was said (stop_jobs_on_signal); 130 or 143
        sys.exit(orphans.interrupted())


# On SIGTERM Snakemake waits for its running jobs to finish (a panel job runs for hours),
# and on Ctrl-C it waits for them without telling them: stop them at once instead.
onstart:
    orphans.stop_jobs_on_signal(logger)


# pairflow.plan.config validates against workflow/schemas/config.schema.yaml, with the arm
# kinds' keys filled in from pairflow.arms (filling its defaults, as snakemake.utils.validate would) and turns each error into one line naming
# the key, the value and a close match; validate() would print jsonschema's dump instead.
# The whole config is checked here, before any job starts: the same checks as
# `pairflow check-config`. Snakemake read the config file(s) with a plain YAML loader,
# which keeps the last of two equal keys, so the files are read again to refuse that.
# Relative paths in the config resolve against the working directory (the project).
# A refusal is one message and exit code 3, as from check-config, not a traceback.
# Named relative to the project (Snakemake gives absolute paths): the archive rule's params.
CONFIGFILES = [str(as_named(f)) for f in workflow.overwrite_configfiles or ["config/config.yaml"]]
try:
    check_config_files(CONFIGFILES)
    STUDY = study_from_raw(config, Path.cwd(), source=", ".join(CONFIGFILES))
    require_tracker(STUDY, ", ".join(CONFIGFILES))  # report/tracker's package, where rule track runs
except PairFlowError as e:
    logger.error(f"error: {e}")
    sys.exit(3)
PANELS = [p.name for p in STUDY.panels]
# Where each job writes its own account, and the pairflow-slurm executor (in this process)
# each submission's scheduler record: the ledger's sources (pairflow.budget.ledger).
os.environ.update(PAIRFLOW_ACCOUNTS=str(Layout(STUDY.scratch).accounts.resolve()))
# Every output path comes from pairflow.layout (the one owner of the tree's shape);
# "{panel}" and "{rep}" stay Snakemake wildcards.
LAYOUT = Layout(as_named(STUDY.scratch))
MODEL_INDEX = str(as_named(STUDY.model.path) / "model_index.json")
ARMS_CHECK = str(LAYOUT.arms_check)
# What the arms' check depends on besides the model files (a params rerun trigger). The
# check itself imports diffusers, so it runs in rule check_arms, never while planning.
ARMS_KEY = arms_check_key(STUDY.declared_arms, STUDY.model)
GEN_MANIFEST = str(LAYOUT.generation_manifest("{panel}"))
SCORE_MANIFEST = str(LAYOUT.score_manifest("{panel}"))
TIMING_MANIFEST = str(LAYOUT.timing_manifest)
PANEL_STATS = str(LAYOUT.panel_stats("{panel}"))
PANEL_TABLE = str(LAYOUT.panel_table("{panel}"))
PANEL_TABLE_HTML = str(LAYOUT.panel_table("{panel}", ".html"))
STUDY_STATS = str(LAYOUT.study_stats)
STUDY_TABLE = str(LAYOUT.study_table())
STUDY_TABLE_HTML = str(LAYOUT.study_table(".html"))
STUDY_MANIFEST = str(LAYOUT.study_manifest)
PLOTS = str(LAYOUT.plots)
GALLERY = str(LAYOUT.gallery)
TRACKED = str(LAYOUT.tracked)
# Rule track logs to the tracker only when report/tracker names one (default none).
TRACKERS = [TRACKED] if STUDY.report.tracker != "none" else []
ARCHIVE_DONE = str(LAYOUT.archived)
# The claim card's results part and page (sealed card.json: by the first generation job).
CARD_RESULTS = [str(LAYOUT.card.with_name(n)) for n in ("card-results.json", "card.md")]
UTILISATION = str(LAYOUT.utilisation())
UTILISATION_MD = str(LAYOUT.utilisation(".md"))
LOGS = str(LAYOUT.logs)
# The frozen calibration table (named by its key's digest: a changed model, arm, shape,
# scorer or software names a missing table, which rule calibrate makes) and the estimate.
# Not keyed by this (planning) machine's device: the table records the device kind rule
# calibrate measured it on, the panel jobs' own under profiles/slurm.
CALIBRATION_KEY = calibration_key(STUDY)
CALIBRATION = str(LAYOUT.calibration(CALIBRATION_KEY))
ESTIMATE = str(LAYOUT.estimate)
# The fan-out waits for the estimate (the budget guard), unless fleet.calibrate is false.
ESTIMATE_INPUT = [ESTIMATE] if STUDY.fleet.calibrate else []
# What the estimate depends on besides the table (a params rerun trigger of rule estimate).
ESTIMATE_DRIVERS = {**drivers(STUDY), "panel_jobs": STUDY.fleet.panel_jobs, "cpu_workers": STUDY.fleet.cpu_workers}
LEDGER = str(LAYOUT.ledger())
LEDGER_MD = str(LAYOUT.ledger(".md"))
REPLICATE_TIMING = str(LAYOUT.replicate_timing("{rep}", "{panel}"))
REPEATABILITY = str(LAYOUT.repeatability())
REPEATABILITY_MD = str(LAYOUT.repeatability(".md"))
MANIFESTS = [*expand(GEN_MANIFEST, panel=PANELS), *expand(SCORE_MANIFEST, panel=PANELS), TIMING_MANIFEST,
             STUDY_MANIFEST] if STUDY.fleet.allocation != "study" else [*expand(GEN_MANIFEST, panel=PANELS),
                                                                        TIMING_MANIFEST, STUDY_MANIFEST]
"""Targets of rule all, so a manifest a killed job left missing is always rebuilt
(Snakemake reruns a job for a missing output only where some job asks for that output).
Under ``fleet.allocation: study`` the score manifests are left to study_stats, which asks
for every one: each file asked for is matched against every output of the one fleet job
in turn (Snakemake's ``Rule.is_producer``), so asking twice cost about 2 s of a 10 s dry
run at 100k candidates."""


wildcard_constraints:
    panel="[A-Za-z0-9][A-Za-z0-9_-]{0,63}",
    rep="r[0-9]+",
    look="[1-9][0-9]?",


# sequential/enabled: the looks (looks.smk). LOOK_COUNTS: per look, each panel's released prompts.
SEQUENTIAL = STUDY.sequential
LOOK_COUNTS = look_counts(STUDY)
LOOK_GEN = str(LAYOUT.look_manifest("{panel}", "{look}", "generation"))
LOOK_SCORES = str(LAYOUT.look_manifest("{panel}", "{look}", "scores"))
LOOK_DECISION = str(LAYOUT.look("{look}"))


def look_count(wildcards):
    """The prompts of this job's panel released by its look (a params rerun trigger)."""
    return LOOK_COUNTS[int(wildcards.look) - 1][wildcards.panel]


def previous_look(wildcards):
    """A look's jobs follow the previous look's decision (which said continue)."""
    k = int(wildcards.look)
    return [] if k == 1 else [LOOK_DECISION.format(look=k - 1)]


def stop_look(wildcards=None):
    """The decision of the look the study stops at: each look's checkpoint in turn, until
    one says stop (Snakemake re-plans after each). Empty when the study has no looks."""
    if SEQUENTIAL is None:
        return []
    for k in range(1, len(LOOK_COUNTS) + 1):
        decision = checkpoints.look.get(look=k).output[0]
        if look_stops(decision):
            return [decision]
    return [decision]


def panel_sheet(wildcards):
    """A panel's prompt sheet: editing it reruns that panel only."""
    return str(as_named(STUDY.panel(wildcards.panel).sheet))


def panel_digest(wildcards):
    """Digest of everything that defines a panel's candidates (a params rerun trigger)."""
    return STUDY.panel_digest(wildcards.panel)


# The tiny model is built by a rule; a real checkpoint must already exist. A list, not an
# input function: the same for every job (Snakemake evaluates a function per job).
MODEL_INPUT = [MODEL_INDEX] if STUDY.model.kind == "embedded-tiny" else []


def arms_check_input(wildcards):
    """The model files the arms' check reads: the built tiny model, else the index,
    transformer and VAE configs of the study's model and of the arms' own models."""
    return [*([MODEL_INDEX] if STUDY.model.kind == "embedded-tiny" else []),
            *(str(as_named(p)) for p in arms_check_inputs(STUDY.declared_arms, STUDY.model))]


# A plain rerun heals: when the run is planned (not inside a job), the evidence is
# checked as `pairflow verify` does, in the panels where a file's inode, size, mtime or
# ctime changed since it was last found clean (videos re-hashed when theirs changed);
# every existing output that no longer matches its records gets a newer heal stamp, which its rule takes as input. A dry run (or any
# invocation that executes nothing: --summary, --list, --dag, --lint) writes nothing in
# the tree: its stamps go to a temporary folder, removed at exit, and it shows the jobs.
def command_line():
    """Snakemake's parsed command line (argparse's namespace), or None when Snakemake was
    started through its API."""
    frame = sys._getframe()  # the callers' frames only: inspect.stack reads every caller's source file
    while frame is not None:
        args = frame.f_locals.get("args") if frame.f_code.co_name == "args_to_api" else None
        if args is not None:
            return args
        frame = frame.f_back
    return None


def plans_only(dry_run_only=False):
    """Whether this Snakemake invocation executes nothing (read from its command line);
    with ``dry_run_only``, whether it is a dry run (``-n``)."""
    keys = ("dryrun",) if dry_run_only else (
        "dryrun", "summary", "detailed_summary", "list_rules", "list_target_rules", "dag", "rulegraph",
        "filegraph", "lint", "list_changes", "print_compilation", "unlock", "cleanup_metadata")
    args = command_line()
    if args is not None:
        return any(getattr(args, k, False) for k in keys)
    # Not started by the command line (the API): read the flags Snakemake would.
    flags = ("--dry-run", "--dryrun") if dry_run_only else (
        "--dry-run", "--dryrun", "--summary", "--detailed-summary", "--lint", "--dag")
    return any(a in flags or (a.startswith("-") and not a.startswith("--") and "n" in a[1:] and a[1:].isalpha())
               for a in sys.argv[1:])


# The panel jobs' rules depend on fleet.panel_jobs (Snakefile): a rule of the other
# setting named on the command line is refused here, naming the setting and the rule to
# use, instead of Snakemake's "No rule to produce score_panel" (or silently ignoring it).
if not (workflow.remote_exec or workflow.subprocess_exec) and (ARGS := command_line()) is not None:
    try:
        check_panel_rules(STUDY, [name for key in ("forcerun", "until", "omit_from", "allowed_rules", "targets")
                                  for name in getattr(ARGS, key, None) or ()], ", ".join(CONFIGFILES))
    except PairFlowError as e:
        logger.error(f"error: {e}")
        sys.exit(3)


# iso_compute/enabled: the plain arms join the study from study/iso_compute.json, which rule
# calibrate writes beside its table. Where the table is current but the file was removed,
# no rule would run to write it again (the table is there) and the plain arms would drop
# out of the plan, their evidence then read as extra: write it again from the table here.
if (not (workflow.remote_exec or workflow.subprocess_exec) and STUDY.iso_compute and os.path.exists(CALIBRATION)
        and not LAYOUT.iso_compute.exists()):
    if plans_only():
        logger.warning(f"PairFlow (dry run, nothing written): {LAYOUT.iso_compute} is missing; a run writes it again "
                       f"from the calibration table {CALIBRATION}")
    else:
        try:
            publish_iso_compute(STUDY, load_table(Path(CALIBRATION)))
            STUDY = study_from_raw(config, Path.cwd(), source=", ".join(CONFIGFILES))
        except PairFlowError as e:
            logger.error(f"error: {e}")
            sys.exit(3)
        logger.warning(f"PairFlow: {LAYOUT.iso_compute} was missing; written again from the calibration table "
                       f"{CALIBRATION}")


STALE, UNHEALED = {}, []
if not (workflow.remote_exec or workflow.subprocess_exec):
    if plans_only():
        import atexit
        import shutil
        import tempfile

        DRY_STAMPS = Path(tempfile.mkdtemp(prefix="pairflow-dry-run-heal-"))
        atexit.register(shutil.rmtree, DRY_STAMPS, True)
        STALE = mark_stale(STUDY, DRY_STAMPS, UNHEALED)
        for output in STALE:
            logger.warning(f"PairFlow (dry run, nothing written): evidence out of date, a run recomputes {output}")
    else:
        STALE = mark_stale(STUDY, unhealed=UNHEALED)
        for stamp in STALE.values():
            logger.warning(f"PairFlow: evidence out of date, will be recomputed: {stamp}")
        # Named as stamp_input names a stamp that exists (Snakemake records the input names).
        STALE = {output: heal_stamp(LAYOUT.scratch, as_named(output)) for output in STALE}
    STALE = {str(as_named(output)): stamp for output, stamp in STALE.items()}
    for problem in UNHEALED[:20]:  # extra files, symlinks: a person decides; the line names the command
        logger.warning(f"PairFlow: no rerun heals this, pairflow verify fails until it is removed: {problem.line()}")
    if len(UNHEALED) > 20:
        logger.warning(f"PairFlow: {len(UNHEALED) - 20} more such problem(s): pairflow verify {LAYOUT.scratch} "
                       "lists them all")
STAMPS = heal_stamps(LAYOUT.scratch)


# A model no job could load (its folder missing, a file, no or an unreadable
# model_index.json, a component's folder missing) is refused here, in a dry run as in a
# run, naming the key and a fix; the embedded tiny model may be missing: rule
# build_tiny_model builds it (MODEL_INPUT). --lint, --unlock, --summary, --dag still work.
if not (workflow.remote_exec or workflow.subprocess_exec):
    try:
        check_models(STUDY.model, STUDY.arms, ", ".join(CONFIGFILES),
                     built=frozenset([STUDY.model.path] if STUDY.model.kind == "embedded-tiny" else []),
                     project=Path.cwd())
    except PairFlowError as e:
        logger.error(f"error: {e}")
        if not plans_only() or plans_only(dry_run_only=True):
            sys.exit(3)


# A panel too small for any verdict (the exact sign-flip test's smallest p is not below the
# level) is named before the study runs, in a dry run as in a run (issue 39).
if not (workflow.remote_exec or workflow.subprocess_exec):
    for line in too_few_prompts(STUDY):
        logger.warning(f"PairFlow: {line}")


# The estimate at the top of a dry run, and the budget guard before anything runs, when
# the calibration table exists (else rule calibrate makes it and rule estimate guards).
if not (workflow.remote_exec or workflow.subprocess_exec):
    if STUDY.fleet.calibrate and os.path.exists(CALIBRATION):
        try:
            PLANNED_ESTIMATE = estimate(STUDY, load_table(Path(CALIBRATION)))
            if plans_only():
                for line in summary_lines(PLANNED_ESTIMATE, STUDY.fleet.budget_gpu_hours):
                    logger.info(line)
            check_budget(STUDY, PLANNED_ESTIMATE, ", ".join(CONFIGFILES))
        except PairFlowError as e:
            logger.error(f"error: {e}")
            # a run or a dry run is refused; --lint, --unlock, --summary, --dag still work
            if not plans_only() or plans_only(dry_run_only=True):
                sys.exit(3)
    elif STUDY.fleet.calibrate and plans_only():
        logger.info(f"PairFlow estimate: no calibration table yet ({CALIBRATION}); rule calibrate makes it "
                    "before the fan-out and rule estimate then checks fleet.budget_gpu_hours "
                    "(or run 'pairflow calibrate' and 'pairflow estimate' now)")


def budget_refused():
    """After a failed run (onerror): where rule estimate refused the study (no table when
    the run was planned; now there is one and the study is over fleet.budget_gpu_hours),
    the refusal as planning gives it, once, and exit 3. The job itself wrote it to its
    log only and exited 3, without a traceback and without a retry (calibrate.smk)."""
    if workflow.remote_exec or workflow.subprocess_exec or not STUDY.fleet.calibrate or not os.path.exists(CALIBRATION):
        return
    try:
        check_budget(STUDY, estimate(STUDY, load_table(Path(CALIBRATION))), ", ".join(CONFIGFILES))
    except BudgetError as e:
        logger.error(f"error: {e}")
        sys.exit(3)
    except PairFlowError:
        return  # the table cannot be read: the failed job's own message says why


def replicate_outputs(wildcards):
    """Input function (repeatability): every replicate of every repeatability panel
    (listed only when that rule is asked for, not while planning every run)."""
    return [str(LAYOUT.replicate_timing(f"r{n}", p))
            for n in range(1, STUDY.repeatability.replicates + 1) for p in STUDY.repeatability.panels]


def healing(pattern):
    """Input function: this job's heal stamp, when one exists (see above). No function
    at all when no stamp exists anywhere (the usual case): Snakemake then evaluates
    none per job."""
    if not STAMPS and not STALE:
        return []
    return lambda wildcards: stamp_input(LAYOUT.scratch, pattern.format(**wildcards), STAMPS, STALE)


def arms_checked(*patterns):
    """Input function: the arms' check, as ancient input (a rerun of the check alone
    regenerates nothing), except for a job that runs anyway (an output missing or out
    of date with its evidence). Snakemake does not evaluate a job's own reasons when a
    job upstream of it runs (here check_arms, after an arm or the diffusers version
    changed) and reaches it only through non-ancient inputs: with the ancient edge such
    a job would wait for the next run."""
    def arms(wildcards):
        outputs = [p.format(**wildcards) for p in patterns]
        if any(o in STALE or not os.path.exists(o) for o in outputs):
            return ARMS_CHECK
        return ancient(ARMS_CHECK)
    return arms

