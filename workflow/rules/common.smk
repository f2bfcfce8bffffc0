# Validate the config against the schema (filling defaults), type it once, and name
# every output path. Paths come from the config's storage roots.
import os
import sys
from pathlib import Path

from snakemake.logging import logger

sys.path.insert(0, str(Path(workflow.basedir) / "workflow"))
# envs/pairflow.yaml installs this checkout (`-e ${PAIRFLOW_HOME}`) when Snakemake
# creates it (`--software-deployment-method conda`); pip expands the variable.
os.environ.setdefault("PAIRFLOW_HOME", str(workflow.basedir))
from pairflow.config import check_config_files, study_from_raw  # noqa: E402
from pairflow.errors import PairFlowError  # noqa: E402
from pairflow.evidence import heal_stamps, mark_stale, stamp_input  # noqa: E402
from pairflow.layout import Layout, as_named  # noqa: E402
from pairflow.arms import arms_check_inputs, arms_check_key  # noqa: E402
from pairflow.orphans import stop_jobs_on_signal  # noqa: E402


# On SIGTERM Snakemake waits for its running jobs to finish (a panel job runs for hours),
# and on Ctrl-C it waits for them without telling them: stop them at once instead.
onstart:
    stop_jobs_on_signal()


# pairflow.config validates against workflow/schemas/config.schema.yaml (filling its
# defaults, as snakemake.utils.validate would) and turns each error into one line naming
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
except PairFlowError as e:
    logger.error(f"error: {e}")
    sys.exit(3)
PANELS = [p.name for p in STUDY.panels]
# Every output path comes from pairflow.layout (the one owner of the tree's shape);
# "{panel}" and "{rep}" stay Snakemake wildcards.
LAYOUT = Layout(as_named(STUDY.scratch))
MODEL_INDEX = str(as_named(STUDY.model.path) / "model_index.json")
ARMS_CHECK = str(LAYOUT.arms_check)
# What the arms' check depends on besides the model files (a params rerun trigger). The
# check itself imports diffusers, so it runs in rule check_arms, never while planning.
ARMS_KEY = arms_check_key(STUDY.arms, STUDY.model)
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
ARCHIVE_DONE = str(LAYOUT.archived)
UTILISATION = str(LAYOUT.utilisation())
UTILISATION_MD = str(LAYOUT.utilisation(".md"))
LOGS = str(LAYOUT.logs)
REPLICATE_TIMING = str(LAYOUT.replicate_timing("{rep}", "{panel}"))
REPEATABILITY = str(LAYOUT.repeatability())
REPEATABILITY_MD = str(LAYOUT.repeatability(".md"))
MANIFESTS = [*expand(GEN_MANIFEST, panel=PANELS), *expand(SCORE_MANIFEST, panel=PANELS), TIMING_MANIFEST,
             STUDY_MANIFEST]
"""Targets of rule all, so a manifest a killed job left missing is always rebuilt."""


wildcard_constraints:
    panel="[A-Za-z0-9][A-Za-z0-9_-]{0,63}",
    rep="r[0-9]+",


def panel_sheet(wildcards):
    """A panel's prompt sheet: editing it reruns that panel only."""
    return str(as_named(STUDY.panel(wildcards.panel).sheet))


def panel_digest(wildcards):
    """Digest of everything that defines a panel's candidates (a params rerun trigger)."""
    return STUDY.panel_digest(wildcards.panel)


def model_input(wildcards):
    """The tiny model is built by a rule; a real checkpoint must already exist."""
    return MODEL_INDEX if STUDY.model.kind == "embedded-tiny" else []


def arms_check_input(wildcards):
    """The model files the arms' check reads: the built tiny model, else the index,
    transformer and VAE configs of the study's model and of the arms' own models."""
    return [*([MODEL_INDEX] if STUDY.model.kind == "embedded-tiny" else []),
            *(str(as_named(p)) for p in arms_check_inputs(STUDY.arms, STUDY.model))]


# A plain rerun heals: when the run is planned (not inside a job), the evidence is
# checked as `pairflow verify` does (videos by size, not re-hashed); every existing output
# that no longer matches its records gets a newer heal stamp, which its rule takes as input.
if not (workflow.remote_exec or workflow.subprocess_exec):
    for stamp in mark_stale(STUDY):
        logger.warning(f"PairFlow: evidence out of date, will be recomputed: {stamp}")
STAMPS = heal_stamps(LAYOUT.scratch)


def replicate_outputs(wildcards):
    """Input function (repeatability): every replicate of every repeatability panel
    (listed only when that rule is asked for, not while planning every run)."""
    return [str(LAYOUT.replicate_timing(f"r{n}", p))
            for n in range(1, STUDY.repeatability.replicates + 1) for p in STUDY.repeatability.panels]


def healing(pattern):
    """Input function: this job's heal stamp, when one exists (see above)."""
    return lambda wildcards: stamp_input(LAYOUT.scratch, pattern.format(**wildcards), STAMPS)

