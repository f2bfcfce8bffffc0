"""Where every output lives: the one owner of the results tree's shape.

Rules (``workflow/rules/common.smk``), rule scripts, the package and ``pairflow status``
ask this module; nobody else spells a path under ``storage.scratch``. A panel's folder
name is its config name and a candidate's file stem is ``<prompt_id>-s<seed>``, so every
path is deterministic (dates go inside files, never into names)::

    <scratch>/
      panels/<panel>/
        videos/<arm>/<stem>.mp4            pixels (stay on scratch, never archived)
        records/<arm>/<stem>.json          one generation record per candidate
        scores/<arm>/<stem>.json           one score record per candidate
        timing/<arm>/<stem>.json           timed-pass latency per candidate
        failures/<stage>/<arm>/<stem>.json tasks that failed after their retries
        telemetry/<job>.json               spans, busy share, NVML of the job's last run; <job> is
                                           generate-score (fleet.panel_jobs: combined) or the stage
        run/<job>/                         Parsl run folder, worker logs, heartbeats/
        run/timed-pass/heartbeats/         the timed pass's progress (pairflow status)
        generation.json, scores.json       panel manifests (root digests)
        stats.json, table.md, table.html   the panel's paired statistics
      study/
        stats.json, table.md, table.html, manifest.json, timing.json, archived.json
        utilisation.json, utilisation.md, plots/<name>.png, telemetry/timed_pass.json
        ledger.json, ledger.md             every run's slot-seconds by arm, stage and kind (added to, never replaced)
        estimate.json                      the study's cost estimate (rule calibrate, from the table)
      calibration/<digest>.json            the frozen calibration table, named by its key's digest
        telemetry/fleet.json, run/fleet/   the study-wide fleet job's (fleet.allocation: study)
        gallery.html                       the video gallery (players and filmstrips inlined)
        tracked.json                       the tracker run logged by rule track (report/tracker)
        export/candidates.csv, summary.csv pairflow export's tables (csv or parquet)
        card.json, card-results.json,      the claim card (pairflow card): the sealed declared part,
        card.md                            the results against it, both as one page
        iso_compute.json                   the iso-compute controls' derivation (rule calibrate)
        looks/look-<k>.json                a group-sequential look's decision (checkpoint look)
        looks/<panel>/look-<k>.*.json      a panel's generation and score manifests at look k
      accounts/                            one record per job (job-*.json: written by the job itself at
                                           start and exit) and per Slurm submission (slurm-*.json: the
                                           scheduler's figures); the ledger is built from them
      contexts/<digest>.pkl                study context shared by a job's tasks
      cache/prepared/arms-<digest>.json    the preparing job's arms check and calibration table,
      cache/prepared/calibration-<d>.json  copied by rules check_arms and calibrate (no torch there)
      checks/arms.json                     the arms passed their check (rule check_arms)
      checks/evidence.json                 what the plan-time evidence check last found clean
      checks/vouched/<manifest>.json       what a job vouched for when it wrote that manifest (the
                                           memo and vouchers are caches: never archived)
      heal/<output>.txt                    why a plain run recomputes an output
      logs/<job>/<panel>.log               one log per job
      benchmarks/<rule>/<panel>.tsv        Snakemake's per-job wall time and memory
      replicates/r<n>/                     repeatability reruns, the same shape again
      repeatability/report.json, report.md the noise floor measured by those reruns

Pass ``"{panel}"`` as a panel name to get the wildcard pattern a Snakemake rule uses.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CANDIDATE_KINDS = ("videos", "records", "scores", "timing")
"""The per-candidate folders of a panel (``<kind>/<arm>/<stem>``): all a panel rerun clears."""
ARCHIVE_RULE = "archive"
"""The rule that seals the evidence into a snapshot (``evidence.archive``). Its own log,
job accounts and benchmark are not evidence and its jobs are not billed in the ledger
(``budget.ledger``): each run of it would change what it seals."""
CARD_RULE = "card"
"""The rule that writes the claim card's results after the archive (``report.card``)."""
SEALING_RULES = (ARCHIVE_RULE, CARD_RULE)
"""The rules that run when the evidence is sealed or after: their own logs, job accounts
and benchmarks are not evidence and their jobs are not billed in the ledger (a rerun of
either would change what the archive seals)."""
STAGES = ("generate", "score")
"""Stages that fan out per panel (their jobs have run folders, telemetry and failures)."""


def as_named(path: Path | str, root: Path | None = None) -> Path:
    """``path`` as the workflow names it: relative to the working directory (the project
    directory Snakemake runs in; ``root`` where Snakemake will run elsewhere) when it lies
    inside it, else absolute. Outputs then read ``results/...`` in logs and in the
    report's sidebar, a moved project keeps its Snakemake metadata, and a target or
    ``--forcerun`` given this way matches the rule's output (Snakemake compares the strings)."""
    start = Path.cwd() if root is None else Path(root).absolute()
    p = Path(path).absolute()
    return Path(os.path.relpath(p, start)) if p.is_relative_to(start) else p


@dataclass(frozen=True)
class Layout:
    """The results tree rooted at ``scratch`` (a study's ``storage.scratch``)."""

    scratch: Path

    # --- one panel ----------------------------------------------------------------------
    @property
    def panels(self) -> Path:
        """The folder holding every panel's folder."""
        return Path(self.scratch) / "panels"

    def panel(self, panel: str) -> Path:
        return self.panels / panel

    def output(self, panel: str, kind: str, arm: str, stem: str) -> Path:
        """A candidate's file of ``kind``: videos (``.mp4``), records, scores or timing (``.json``)."""
        suffix = ".mp4" if kind == "videos" else ".json"
        return self.panel(panel) / kind / arm / f"{stem}{suffix}"

    def failures(self, panel: str, stage: str) -> Path:
        """A stage's failure records of one panel (``<arm>/<stem>.json`` below it)."""
        return self.panel(panel) / "failures" / stage

    def failure(self, panel: str, stage: str, arm: str, stem: str) -> Path:
        """Where a task that failed after its retries is recorded: never a record location,
        so a failure can never look complete."""
        return self.failures(panel, stage) / arm / f"{stem}.json"

    def telemetry_dir(self, panel: str) -> Path:
        return self.panel(panel) / "telemetry"

    def telemetry(self, panel: str, stage: str) -> Path:
        return self.telemetry_dir(panel) / f"{stage}.json"

    def run_dir(self, panel: str, stage: str) -> Path:
        """A fan-out job's Parsl run folder (worker logs, ``heartbeats/``)."""
        return self.panel(panel) / "run" / stage

    def timed_run_dir(self, panel: str) -> Path:
        """The timed pass's run folder (its ``heartbeats/``): not ``run/timing``, whose
        ``heartbeats/<name>.json`` would have the shape of a timing record's path
        (``timing/<arm>/<stem>.json``)."""
        return self.panel(panel) / "run" / "timed-pass"

    def generation_manifest(self, panel: str) -> Path:
        return self.panel(panel) / "generation.json"

    def score_manifest(self, panel: str) -> Path:
        return self.panel(panel) / "scores.json"

    def panel_stats(self, panel: str) -> Path:
        return self.panel(panel) / "stats.json"

    def panel_table(self, panel: str, suffix: str = ".md") -> Path:
        return self.panel(panel) / f"table{suffix}"

    # --- the study ------------------------------------------------------------------------
    @property
    def study(self) -> Path:
        return Path(self.scratch) / "study"

    @property
    def study_stats(self) -> Path:
        return self.study / "stats.json"

    def study_table(self, suffix: str = ".md") -> Path:
        return self.study / f"table{suffix}"

    @property
    def study_manifest(self) -> Path:
        return self.study / "manifest.json"

    @property
    def timing_manifest(self) -> Path:
        return self.study / "timing.json"

    @property
    def timed_pass_telemetry(self) -> Path:
        return self.study / "telemetry" / "timed_pass.json"

    @property
    def fleet_telemetry(self) -> Path:
        """The study-wide fleet job's telemetry (``fleet.allocation: study``)."""
        return self.study / "telemetry" / "fleet.json"

    @property
    def fleet_run_dir(self) -> Path:
        """The study-wide fleet job's Parsl run folder (worker logs, ``heartbeats/``)."""
        return self.study / "run" / "fleet"

    @property
    def archived(self) -> Path:
        """The marker the archive rule writes once a snapshot is promoted."""
        return self.study / "archived.json"

    def utilisation(self, suffix: str = ".json") -> Path:
        return self.study / f"utilisation{suffix}"

    def ledger(self, suffix: str = ".json") -> Path:
        """Every run's slot-seconds by arm, stage and kind (``ledger``): added to by each run."""
        return self.study / f"ledger{suffix}"

    @property
    def accounts(self) -> Path:
        """Every job's own account and every Slurm submission's scheduler record (``ledger``)."""
        return Path(self.scratch) / "accounts"

    @property
    def estimate(self) -> Path:
        """The study's cost estimate, written by rule calibrate (``estimate``)."""
        return self.study / "estimate.json"

    def calibration(self, key: str) -> Path:
        """The frozen calibration table for ``key`` (``xxh3_128:<hex>``), named by its digest."""
        return Path(self.scratch) / "calibration" / f"{key.split(':', 1)[-1][:32]}.json"

    @property
    def plots(self) -> Path:
        return self.study / "plots"

    @property
    def export(self) -> Path:
        """Where ``pairflow export`` writes its tables by default."""
        return self.study / "export"

    @property
    def card(self) -> Path:
        """The sealed claim card (``report/card``); ``card-results.json`` and ``card.md`` lie beside it."""
        return self.study / "card.json"

    @property
    def looks(self) -> Path:
        """A group-sequential study's looks (``sequential``): each look's decision
        (``look``) and each panel's manifests at that look (``look_manifest``)."""
        return self.study / "looks"

    def look(self, look: int | str) -> Path:
        """Look ``look``'s decision: the questions tested, and whether the study stops."""
        return self.looks / f"look-{look}.json"

    def look_manifest(self, panel: str, look: int | str, part: str) -> Path:
        """A panel's ``part`` manifest (generation or scores) at look ``look``."""
        return self.looks / panel / f"look-{look}.{part}.json"

    @property
    def iso_compute(self) -> Path:
        """The iso-compute controls' derivation (``analysis.isocompute``), written by rule
        calibrate; the plain arms it names join the study (``plan.config``)."""
        return self.study / "iso_compute.json"

    @property
    def gallery(self) -> Path:
        """The video gallery: one HTML page, videos and filmstrips inlined (``gallery.py``)."""
        return self.study / "gallery.html"

    @property
    def tracked(self) -> Path:
        """The tracker run that rule ``track`` logged (``tracker.py``; report/tracker)."""
        return self.study / "tracked.json"

    # --- shared folders ---------------------------------------------------------------------
    @property
    def contexts(self) -> Path:
        return Path(self.scratch) / "contexts"

    @property
    def checks(self) -> Path:
        return Path(self.scratch) / "checks"

    @property
    def arms_check(self) -> Path:
        """Rule ``check_arms``'s output: the arms passed ``arms.check_arms`` (its key inside)."""
        return self.checks / "arms.json"

    @property
    def evidence_memo(self) -> Path:
        """What the plan-time evidence check last found clean (``healing.plan_check``)."""
        return self.checks / "evidence.json"

    @property
    def vouchers(self) -> Path:
        """What each job vouched for when it wrote a manifest (``records.vouch``), one file a manifest."""
        return self.checks / "vouched"

    @property
    def prepared(self) -> Path:
        """What a run's first heavy job (rule build_tiny_model, else check_arms) worked out
        for the light jobs after it (``stages.calibworker.prepare``): a cache under
        ``cache/``, never evidence; deleting it costs one cold import, nothing else."""
        return Path(self.scratch) / "cache" / "prepared"

    def prepared_arms(self, key: str) -> Path:
        """The arms' check for ``key`` (``calibworker.arms_entry_key``): rule check_arms's output bytes."""
        return self.prepared / f"arms-{key.split(':', 1)[-1][:32]}.json"

    def prepared_calibration(self, key: str) -> Path:
        """The calibration table for ``key`` (``calibrate.key``), measured by the preparing job."""
        return self.prepared / f"calibration-{key.split(':', 1)[-1][:32]}.json"

    @property
    def heal(self) -> Path:
        return Path(self.scratch) / "heal"

    @property
    def flop_tables(self) -> Path:
        """FLOPs per call of each hooked transformer unit, one JSON per table key
        (``compute.FlopTable``): measured once, then used to derive every bulk run's FLOPs."""
        return Path(self.scratch) / "flops"

    @property
    def logs(self) -> Path:
        return Path(self.scratch) / "logs"

    @property
    def benchmarks(self) -> Path:
        return Path(self.scratch) / "benchmarks"

    def log(self, stage: str, name: str) -> Path:
        """One job's log (``name``: its panel, or ``study``)."""
        return self.logs / stage / f"{name}.log"

    def benchmark(self, rule: str, name: str) -> Path:
        """Snakemake's ``benchmark:`` file of one job (``name``: its panel, or ``study``)."""
        return self.benchmarks / rule / f"{name}.tsv"

    def replicate(self, rep: str) -> Layout:
        """A repeatability rerun's tree (``rep`` like ``r1``): the same shape again."""
        return Layout(Path(self.scratch) / "replicates" / rep)

    def replicate_timing(self, rep: str, panel: str) -> Path:
        """The marker a repeatability rerun of one panel ends with (its timing manifest)."""
        return self.replicate(rep).panel(panel) / "timing.json"

    def repeatability(self, suffix: str = ".json") -> Path:
        return Path(self.scratch) / "repeatability" / f"report{suffix}"
