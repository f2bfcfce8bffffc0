"""The pipeline's steps as typed functions: the one entry layer every rule script calls
(each script is a thin adapter: type the config, call one function here).

Map: build model → generate and score panel (per-stage: generate panel, then score panel)
→ timed pass → study stats → plots → utilisation → archive; replicate panel → repeatability. The heavy stages live in
``pairflow.stages``; these functions only bind them to the job (its grant, its paths).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..analysis import isocompute, looks, repeat
from ..analysis.inference import Question
from ..analysis.repeat import replicate_study
from ..analysis.stats import analyse, index, noise_flags, question_values
from ..atomic import job_start, sweep_temps, write_bytes, write_text
from ..budget import ledger
from ..budget.calibrate import calibrate, take_prepared
from ..budget.estimate import estimate_or_refuse
from ..errors import ConfigError, IntegrityError
from ..evidence.archive import promote, verify_tree
from ..evidence.archive import step as archive_step
from ..fleet.orphans import watch_ancestors
from ..fleet.sites import grant_from_env
from ..fleet.sites.slurm import allocation
from ..fleet.startup import mark
from ..fleet.telemetry import utilisation as summarise
from ..fleet.telemetry import utilisation_markdown
from ..generation.provenance import config_snapshot
from ..generation.tinymodel import build_tiny_model
from ..identity import digest_file, digest_obj
from ..jobaccount import current as current_account
from ..jobaccount import failed as account_failed
from ..jobaccount import note, open_account
from ..jobenv import cache_env
from ..layout import Layout
from ..locks import hold
from ..plan.candidates import (
    COMBINED,
    candidates,
    job_stage,
    look_job,
    panel_dir,
    record_path,
    score_path,
    telemetry_path,
    timing_path,
)
from ..plan.config import StudySpec, stop_decision, study_from_raw
from ..records.store import build_manifest, check_schema, read_record, stale_link, write_manifest
from ..records.types import GenerationRecord, ScoreRecord, StudyStats, TimingRecord
from ..report import plots as P
from ..report.card import write_card
from ..report.gallery import write_gallery
from ..report.table import html, markdown
from ..report.tracker import log_study
from .calibworker import arms_entry_key, prepare
from .combined import _console, run_panel
from .generation import run_generation
from .scoring import run_scoring
from .study import run_study
from .timing import run_timed_pass

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from types import TracebackType

log = logging.getLogger(__name__)


def log_to(path: Path) -> None:
    """Send this process's log records to ``path`` (for rule scripts: the rule's log)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, mode="a")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.getLogger("parsl").setLevel(logging.WARNING)  # its INFO lines drown our progress lines
    _log_uncaught()


def _log_uncaught() -> None:
    """Write an uncaught exception (type, message, traceback) to the log before Python
    prints it: Snakemake points the user at the rule's log, which must say why."""
    previous = sys.excepthook
    if getattr(previous, "pairflow", False):
        return
    sys.excepthook = _LoggingHook(previous)


class _LoggingHook:
    """sys.excepthook that logs, then calls the hook it replaced; ``pairflow`` marks it
    so that a second install is a no-op."""

    pairflow = True

    def __init__(self, previous: Callable[[type[BaseException], BaseException, TracebackType | None], Any]) -> None:
        self.previous = previous

    def __call__(self, kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt):  # Ctrl-C: Snakemake says it in one line; no traceback on the console
            log.error("interrupted (SIGINT): this job stopped; a rerun resumes it", exc_info=(kind, exc, tb))
        else:
            log.error("uncaught %s: %s", kind.__name__, exc, exc_info=(kind, exc, tb))
        for handler in logging.getLogger().handlers:
            handler.flush()
        if not issubclass(kind, KeyboardInterrupt):
            self.previous(kind, exc, tb)


Records = tuple[list[GenerationRecord], list[ScoreRecord], list[TimingRecord]]


def panel_records(study: StudySpec, panels: list[str], timing: bool = True) -> Records:
    """(generation, score, timing) records of the named panels, each self-digest checked
    and each score and timing record bound to its candidate's current generation record
    (``timing`` False: no timing records, as at a group-sequential look).

    Raises IntegrityError naming the record whose ``generation_record_digest`` is not
    the current one (it was computed from another generation of the candidate)."""
    layout = Layout(study.scratch)
    cs = [c for p in panels for c in candidates(study, study.panel(p))]
    gen = [read_record(record_path(layout, c), "generation") for c in cs]
    scores = [read_record(score_path(layout, c), "score") for c in cs]
    timings = [read_record(timing_path(layout, c), "timing") for c in cs] if timing else []
    for where, recs in ((score_path, scores), (timing_path, timings)) if timing else ((score_path, scores),):
        for c, g, r in zip(cs, gen, recs, strict=True):
            why = stale_link(r, g)
            if why:
                raise IntegrityError(
                    f"{where(layout, c)}: {why} ({record_path(layout, c)}); it was computed from another generation "
                    "of the candidate. Rerun the workflow (snakemake --profile profiles/local): it recomputes "
                    "records whose generation record changed")
    return gen, scores, timings


def _write_stats(stats: StudyStats, out_json: Path, out_md: Path, title: str,
                 provenance: dict[str, str]) -> None:
    """Statistics as JSON, the table as Markdown, and the same table as HTML beside it."""
    stats = {**stats, "provenance": provenance}
    check_schema(stats, out_json, "write", name="stats")  # workflow/schemas/stats.schema.yaml
    write_text(out_json, json.dumps(stats, indent=1, sort_keys=True, allow_nan=False) + "\n")
    write_text(out_md, markdown(stats, title, provenance))
    write_text(Path(out_md).with_suffix(".html"), html(stats, title, provenance))


def _roots(paths: dict[str, Path]) -> dict[str, str]:
    return {name: json.loads(Path(p).read_text())["root_digest"] for name, p in paths.items()}


def study_stats(study: StudySpec, manifests: dict[str, Path], out_json: Path, out_md: Path,
                out_manifest: Path) -> None:
    """Statistics over every panel (prompts pooled across panels) and for each panel
    (``panels/<panel>/stats.json`` and ``table.md``), plus the study manifest binding the
    panel roots, the statistics and the tables. One job for all panels: a job per panel
    would add hundreds of Snakemake jobs to a large study's plan for milliseconds of work."""
    layout = Layout(study.scratch)
    with hold(Path(out_json).parent, "study statistics"):
        sweep_temps([Path(out_json).parent, Path(out_manifest).parent]
                    + [panel_dir(layout, p.name) for p in study.panels], job_start())
        _study_stats(study, manifests, out_json, out_md, out_manifest)


def _study_stats(study: StudySpec, manifests: dict[str, Path], out_json: Path, out_md: Path,
                 out_manifest: Path) -> None:
    layout = Layout(study.scratch)
    treatments = [t.name for t in study.treatments]
    roots = _roots(manifests)
    by_panel = {p.name: panel_records(study, [p.name]) for p in study.panels}
    files = []
    for name, recs in by_panel.items():
        pdir = panel_dir(layout, name)
        # A panel's numbers are bound to its own manifests and its own timing records, so
        # re-timing another panel leaves this panel's statistics byte-identical.
        prov = {k: v for k, v in roots.items() if k.endswith(f":{name}")}
        prov[f"timing:{name}"] = digest_obj(sorted(str(r.get("record_digest")) for r in recs[2]))
        _write_stats(analyse(*recs, treatments, study.stats), pdir / "stats.json", pdir / "table.md",
                     f"{study.study} / panel {name}", prov)
        files += [pdir / "stats.json", pdir / "table.md", pdir / "table.html"]
    pooled: Records = ([g for r in by_panel.values() for g in r[0]], [s for r in by_panel.values() for s in r[1]],
                       [t for r in by_panel.values() for t in r[2]])
    stats = analyse(*pooled, treatments, study.stats)
    derivation = iso_derivation(study)
    if derivation is not None:
        stats["iso_compute"] = isocompute.section(derivation, *pooled, study.stats)
    seq = sequential_section(study)
    if seq is not None:
        stats["sequential"] = seq
    _write_stats(stats, out_json, out_md, f"{study.study}: study table", roots)
    manifest = build_manifest("study", study.scratch, [Path(out_json), Path(out_md), Path(out_md).with_suffix(".html"),
                                                       *files],
                              {"study": study.study, "panel_roots": roots, "config": config_snapshot(study)},
                              base=os.path.relpath(study.scratch, Path(out_manifest).parent))
    write_manifest(out_manifest, manifest)


def look_panel(study: StudySpec, panel: str, look: int, gen_out: Path, score_out: Path) -> None:
    """A group-sequential look's job for one panel: generate and score the prompts
    released by look ``look`` (``StudySpec.at_look``; those of earlier looks are reused),
    and write the panel's manifests at that look."""
    generate_score_panel(study.at_look(look), panel, gen_out, score_out, look_job(look))


def decide_look(study: StudySpec, look: int, out: Path) -> dict[str, Any]:
    """Checkpoint look: test every pre-registered question on the records the look's
    jobs made (``analysis.looks.decide``) and write the decision ``out``; the workflow
    re-plans from it (the next look's jobs, or the final panel jobs at this release)."""
    at = study.at_look(look)
    gen, scores, _ = panel_records(at, [p.name for p in at.panels], timing=False)
    g, sc = index(gen), index(scores)
    cells: dict[tuple[str, str], tuple[Question, dict[tuple[str, int], float]]] = {}
    by_arm: dict[str, dict[str, tuple[Question | None, dict[tuple[str, int], float]]]] = {}
    for arm, metric, q in looks.questions(study):
        if q is None:
            continue
        got = by_arm.setdefault(arm, question_values(g, sc, arm, study.stats))
        if metric not in got:
            raise IntegrityError(f"look {look}: no {metric} scores for arm {arm} in the released records; rerun the "
                                 "workflow, which rescores them")
        cells[(arm, metric)] = (q, got[metric][1])
    decision = looks.decide(study, look, cells)
    write_text(out, json.dumps(decision, indent=1, sort_keys=True) + "\n")
    log.info("look %d of %d (%d of %d prompts): %s; %s", look, decision["looks"], decision["prompts"],
             decision["max_prompts"], "stop" if decision["stop"] else "continue", decision["why"])
    return decision


def sequential_section(study: StudySpec) -> dict[str, Any] | None:
    """stats.json's ``sequential`` (``analysis.looks.section``) where the study declares
    looks and has stopped; the estimate where rule calibrate made one."""
    seq = study.sequential
    if seq is None:
        return None
    stop = stop_decision(study.scratch, study.panels, list(seq.looks))
    if stop is None:
        raise IntegrityError(f"{Layout(study.scratch).looks}: no look's decision says the study stopped; rerun the "
                             "workflow, which decides the looks")
    layout = Layout(study.scratch)
    est = layout.estimate
    jobs = [json.loads(t.read_text())["job"] for p in study.panels for k in range(1, int(stop["look"]) + 1)
            if (t := telemetry_path(layout, p.name, look_job(k))).is_file()]
    measured = ({"jobs": float(len(jobs)), "work_s": sum(float(j.get("work_s") or 0.0) for j in jobs),
                 "slot_s": sum(float(j.get("slot_s") or 0.0) for j in jobs)} if jobs else None)
    return looks.section(study, stop, json.loads(est.read_text()) if study.fleet.calibrate and est.is_file() else None,
                         measured)


def iso_derivation(study: StudySpec) -> dict[str, Any] | None:
    """The iso-compute derivation rule calibrate wrote (``Layout.iso_compute``), where
    ``iso_compute/enabled`` and its plain arms are in the study; else None."""
    path = Layout(study.scratch).iso_compute
    if not study.iso_compute or not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def study_manifests(study: StudySpec, timing_manifest: Path) -> dict[str, Path]:
    """The manifests the study statistics bind (``study_stats``'s ``manifests``): every
    panel's generation and score manifest (``generation:<panel>``, ``scores:<panel>``)
    and the timed pass's (``timing``)."""
    layout = Layout(study.scratch)
    manifests = {f"{kind}:{p.name}": path(p.name) for kind, path in (("generation", layout.generation_manifest),
                                                                      ("scores", layout.score_manifest))
                 for p in study.panels}
    manifests["timing"] = Path(timing_manifest)
    return manifests


def check_arms(study: StudySpec, out: Path) -> None:
    """Check every arm against the study's model before any model loads (cache class and
    params, scheduler, attention backend, a student's latents, a search verifier) and
    write the check's record ``out``; raises ConfigError naming the arm and the fix.
    When this run's preparing job (rule build_tiny_model) already checked these arms
    against these model files, its cached record is copied (no torch imported); else
    this job prepares (``calibworker.prepare``: the check, and the calibration table)."""
    entry = Layout(study.scratch).prepared_arms(arms_entry_key(study))
    if entry.is_file():
        log.info("arms checked by this run's preparing job: copying %s", entry)
    else:
        prepare(study, "check_arms")
    write_bytes(out, entry.read_bytes())


def calibrate_study(study: StudySpec, out: Path, planned_key: str) -> None:
    """Rule calibrate: the frozen calibration table ``out``: the one this run's preparing
    job measured (``calibrate.take_prepared``: no torch here), else measured now, one
    representative candidate per arm in a fresh worker (``calibrate.calibrate``)."""
    if not take_prepared(study, out, planned_key):
        started = time.perf_counter()
        calibrate(study, out, force=True, planned_key=planned_key)
        note("work", ledger.measured_work(time.perf_counter() - started, "calibrate",
                                          max(study.generation.threads, study.scoring.threads)))


def estimate_study(study: StudySpec, table: Path, out: Path, configfiles: str) -> int:
    """Rule estimate: the study's cost from the calibration table ``table``, written to
    ``out``; the job's exit status, 3 (the refusal logged) above ``fleet/budget_gpu_hours``
    (``estimate.estimate_or_refuse``)."""
    status = estimate_or_refuse(study, table, out, configfiles)
    if status:
        account_failed("BudgetError", f"refused: over fleet.budget_gpu_hours (exit {status}; see the rule's log)")
    return status


def build_model(model_dir: Path, study: StudySpec | None = None) -> None:
    """Build the embedded tiny model into ``model_dir`` (the default study's model). With
    ``study`` (rule build_tiny_model), the job then prepares what rules check_arms and
    calibrate copy (``calibworker.prepare``), in this one process: a bad arm is only
    logged here, and rule check_arms reports it."""
    if study is None:
        build_tiny_model(model_dir)
        return
    prepare(study, "build_tiny_model", build=lambda: build_tiny_model(model_dir), strict=False)


def generate_panel(study: StudySpec, panel: str, out: Path) -> None:
    """Generate a panel's incomplete candidates with what this job was granted, then
    write its generation manifest ``out``."""
    run_generation(study, panel, out, Layout(study.scratch).run_dir(panel, "generate"),
                   grant_from_env(os.environ, study.fleet.site))
    note_spans(telemetry_path(Layout(study.scratch), panel, "generate"), "generate")


def generate_score_panel(study: StudySpec, panel: str, gen_out: Path, score_out: Path, job: str = COMBINED) -> None:
    """Generate a panel's incomplete candidates and score what is missing or stale in one
    job (``fleet.panel_jobs: combined``), then write its generation manifest ``gen_out``
    and score manifest ``score_out``. ``job`` names its run folder and telemetry record
    (a look's job has its own: ``look_job``)."""
    run_panel(study, panel, gen_out, score_out, Layout(study.scratch).run_dir(panel, job),
              grant_from_env(os.environ, study.fleet.site), job)
    note_spans(telemetry_path(Layout(study.scratch), panel, job), COMBINED)



def fleet_study(study: StudySpec, outputs: dict[str, tuple[Path, Path]]) -> None:
    """Generate and score every panel in ``outputs`` (panel → (generation manifest, score
    manifest)) in this one job (``fleet.allocation: study``), each panel's manifests
    written as it completes."""
    run_study(study, outputs, grant_from_env(os.environ, study.fleet.site))  # the whole job: sites.slurm.whole_job
    note_spans(Layout(study.scratch).fleet_telemetry, COMBINED)


def generation_rule(study: StudySpec) -> str:
    """The Snakemake rule that generates a panel (``--forcerun`` it to regenerate)."""
    if study.fleet.allocation == "study":
        return "fleet_study"
    return "generate_score_panel" if study.fleet.panel_jobs == "combined" else "generate_panel"


PANEL_RULES = {"combined": ("generate_score_panel",), "per-stage": ("generate_panel", "score_panel")}
"""The rules that write a panel's generation and score manifests under each
``fleet.panel_jobs`` setting; the Snakefile defines only the current setting's."""


def check_panel_rules(study: StudySpec, names: Iterable[str], source: str) -> None:
    """Refuse a rule name the user gave (``--forcerun``, ``--until``, ``--omit-from``,
    ``--allowed-rules``, a target) that exists only under the other ``fleet.panel_jobs``
    setting. Snakemake itself would say "No rule to produce score_panel", or ignore the
    name (``--omit-from``, ``--allowed-rules``) and run something else than was asked.
    Raises ConfigError naming the rule, the setting, where it came from and the rule to use."""
    mode = study.fleet.panel_jobs
    for name in names:
        for other, rules in PANEL_RULES.items():
            if other != mode and name in rules:
                instead = ("name generate_score_panel instead (one job per panel generates and scores)"
                           if mode == "combined" else
                           "name generate_panel (generation) or score_panel (scoring) instead, one job each per panel")
                raise ConfigError(f"rule {name} does not exist under fleet.panel_jobs: {mode} ({source}), only "
                                  f"under fleet.panel_jobs: {other}; {instead}, or set fleet.panel_jobs: {other}")


def score_panel(study: StudySpec, panel: str, out: Path) -> None:
    """Score a panel's videos whose scores are missing or stale, then write its score
    manifest ``out``."""
    run_scoring(study, panel, out, Layout(study.scratch).run_dir(panel, "score"),
                grant_from_env(os.environ, study.fleet.site))
    note_spans(telemetry_path(Layout(study.scratch), panel, "score"), "score")


def timed_pass(study: StudySpec, out: Path) -> None:
    """The exclusive timed pass over every panel of the study, in this job's allocation;
    its progress lines reach the console as the panel jobs' do."""
    with _console("pairflow"):
        run_timed_pass(study, [p.name for p in study.panels], out, allocation(dict(os.environ)))
    record = _this_jobs(Layout(study.scratch).timed_pass_telemetry)
    if record is not None:
        note("work", ledger.timed_work(record, study.generation.threads))


def _this_jobs(path: Path) -> dict[str, Any] | None:
    """The telemetry record at ``path`` when this job wrote it (its window opened after this
    job's process started), else None (an earlier job's, or none: this job ran no task)."""
    account = current_account()
    if account is None or not Path(path).is_file():
        return None
    record: dict[str, Any] = json.loads(Path(path).read_text())
    return record if float(record["window"]["start"]) >= account.start else None


def note_spans(path: Path, stage: str) -> None:
    """Note in this job's account the work its telemetry record at ``path`` shows (task
    spans by arm, stage and kind: ``ledger.spans_work``), the ledger's work for a fan-out job."""
    record = _this_jobs(path)
    if record is not None:
        note("work", ledger.spans_work(record, stage))


def replicate_panel(study: StudySpec, rep: str, panel: str, out: Path) -> None:
    """Generate, score and time one panel again under ``replicates/<rep>`` with what this
    job was granted (``sites.grant_from_env``)."""
    grant = grant_from_env(os.environ, study.fleet.site)
    r = replicate_study(study, rep)
    at = Layout(r.scratch)
    if r.fleet.panel_jobs == "combined":
        run_panel(r, panel, at.generation_manifest(panel), at.score_manifest(panel), at.run_dir(panel, COMBINED),
                  grant)
    else:
        run_generation(r, panel, at.generation_manifest(panel), at.run_dir(panel, "generate"), grant)
        run_scoring(r, panel, at.score_manifest(panel), at.run_dir(panel, "score"), grant)
    run_timed_pass(r, [panel], Path(out), grant.allocation)


def repeatability(study: StudySpec, stats_json: Path, out_json: Path, out_md: Path) -> None:
    """The repeatability report over original and replicate runs, with noise-floor flags
    on the study's paired differences."""
    panels = list(study.repeatability.panels)
    runs = {"original": panel_records(study, panels)}
    for n in range(1, study.repeatability.replicates + 1):
        runs[f"r{n}"] = panel_records(repeat.replicate_study(study, f"r{n}"), panels)
    report = repeat.noise_report(runs)
    flags = noise_flags(json.loads(Path(stats_json).read_text()), report["noise_floor"])
    repeat.write(report, flags, out_json, out_md)


def plots(study: StudySpec, stats_json: Path, out: dict[str, Path]) -> None:
    """The report's figures for the whole study."""
    gen, scores, timings = panel_records(study, [p.name for p in study.panels])
    stats = json.loads(Path(stats_json).read_text())
    where = Path(os.path.relpath(Path(stats_json).resolve(), Path(study.scratch).resolve())).as_posix()
    caption = (f"{study.study}: from scratch/{where} ({digest_file(Path(stats_json))}), whose provenance lists "
               "the manifest roots of every record behind this figure")
    colours = P.arm_colours([a.name for a in study.arms])  # one colour per arm in every figure and the gallery
    P.forest(stats, out["forest"], caption, colours)
    P.pareto(stats, out["pareto"], caption, colours)
    P.latency(timings, out["latency"], caption, colours)
    P.scatter(scores, out["scatter"], caption, colours)
    P.per_prompt(scores, gen, out["per_prompt"], caption, colours)


def gallery(study: StudySpec, stats_json: Path, out: Path) -> None:
    """The report's video gallery (``gallery.py``): control beside each treatment per pair."""
    gen, scores, timings = panel_records(study, [p.name for p in study.panels])
    used = write_gallery(study, gen, scores, timings, out, Path(stats_json))
    log.info("gallery: %d pairs, %d on the page, %d play, %d with filmstrips; %.2f MiB of media (%.2f MiB of "
             "videos)", used["pairs"], used["listed"], used["playing"], used["shown"], used["bytes"] / 2**20,
             used["video_bytes"] / 2**20)


def track(study: StudySpec, stats_json: Path, table_md: Path, gallery: Path, manifest: Path, out: Path) -> None:
    """Log the study table, headline numbers and gallery to the tracker ``report/tracker``
    names (``track.py``), tagged with the study manifest's root digest."""
    run = log_study(study, stats_json, table_md, gallery, manifest, out)
    log.info("tracker: %s run %s in experiment %s at %s", run["tracker"], run["run_id"], run["experiment_id"],
             run["tracking_uri"])


def utilisation(study: StudySpec, out_json: Path, out_md: Path) -> None:
    """Per-slot busy share of every panel's generation and scoring job (from their
    telemetry records; one job per panel under ``fleet.panel_jobs: combined``), the timed
    pass's window, and the digests of the records used."""
    layout = Layout(study.scratch)
    paths = {f"{job_stage(study, stage)}:{p.name}": telemetry_path(layout, p.name, job_stage(study, stage))
             for p in study.panels for stage in ("generate", "score")}  # combined: one job, one record
    if study.sequential is not None:  # each look's panel jobs: their own records
        paths |= {f"{look_job(k)}:{p.name}": telemetry_path(layout, p.name, look_job(k))
                  for p in study.panels for k in range(1, len(study.sequential.looks) + 1)}
    if study.fleet.allocation == "study":  # one job for every panel: its one record
        paths = {"fleet:study": Layout(study.scratch).fleet_telemetry}
    paths = {k: v for k, v in paths.items() if v.exists()}  # a job that found nothing to do writes none
    u = summarise({k: json.loads(v.read_text()) for k, v in paths.items()})
    timed = Layout(study.scratch).timed_pass_telemetry
    u["timed_pass"] = json.loads(timed.read_text()) if timed.exists() else None
    prov = {k: digest_file(v) for k, v in paths.items()}
    write_text(out_json, json.dumps({**u, "provenance": prov}, indent=1, sort_keys=True) + "\n")
    write_text(out_md, utilisation_markdown(u, prov))
    add_to_ledger(study)


def add_to_ledger(study: StudySpec) -> dict[str, Any]:
    """Add this run's jobs to ``study/ledger.json`` (never replacing earlier runs' entries)
    beside the newest estimate (``study/estimate.json``, when rule estimate wrote one),
    and write ``study/ledger.md``. Called by rule utilisation and after a failed run."""
    lay = Layout(study.scratch)
    est = json.loads(lay.estimate.read_text()) if lay.estimate.is_file() else None
    book = ledger.update(study, lay.ledger(), est)
    write_text(lay.ledger(".md"), ledger.markdown(book))
    return book


def card(study: StudySpec) -> None:
    """The claim card's results part and page (``report.card.write_card``), after the
    archive: the card sealed before generation is kept byte for byte, and read against."""
    _, _, found, _ = write_card(study)
    log.info("claim card %s: %s", Layout(study.scratch).card,
             "as declared" if not found else f"{len(found)} deviation(s) from the sealed card")


def archive(study: StudySpec, out: Path, configfiles: tuple[str, ...] = ("config/config.yaml",)) -> None:
    """Bring the ledger up to date (every job before this one has ended: the ledger
    sealed is the one later runs keep, the archive rule's own jobs not being billed),
    promote the compact evidence under scratch to a snapshot under ``work/<study>``,
    verify the snapshot, and record where it went in ``out``. ``configfiles`` are the
    config file(s) the run used; the snapshot's regenerate command names them."""
    add_to_ledger(study)
    dest = study.work / study.study
    command = ["snakemake", "--configfile", *configfiles, "--forcerun", generation_rule(study)]
    manifest = promote(study.scratch, dest, {"study": study.study, "configfiles": list(configfiles),
                                             "regenerate_command": shlex.join(command)})
    pointer = json.loads((dest / "latest.json").read_text())
    problems = verify_tree(dest / pointer["snapshot"])
    if problems:
        raise IntegrityError("archive did not verify:\n" + "\n".join(problems))
    archive_step("verified")
    write_text(out, json.dumps({"archive": str(dest / pointer["snapshot"]),
                                "root_digest": manifest["root_digest"]}, indent=1) + "\n")
    archive_step("archived", str(out))


def study_for_rule(sm: Any) -> StudySpec:
    """What every rule script does first, given Snakemake's ``snakemake`` object: log to
    the rule's log, end this process when Snakemake dies (``orphans``), type the config,
    and set this job's cache environment (which Parsl workers inherit). Relative paths in
    the config resolve against the working directory Snakemake runs the job in (the
    project), as when the run was planned (``common.smk``).
    """
    mark("driver_imported")  # the script's imports (Snakemake's job object, this package) are done
    log_to(Path(sm.log[0]))
    watch_ancestors()  # a job whose Snakemake was killed stops too, releasing its locks
    study = study_from_raw(copy.deepcopy(dict(sm.config)), Path.cwd(), source="config")
    resources = {k: v for k, v in dict(sm.resources.items()).items() if isinstance(v, (int, float, str))}
    open_account(Layout(study.scratch).accounts, sm.rule, {k: str(v) for k, v in dict(sm.wildcards.items()).items()},
                 int(getattr(sm, "attempt", 1)), int(sm.threads), resources)  # the ledger's record of this job
    job = "-".join([sm.rule, *(str(v) for v in sm.wildcards)])
    os.environ.update(cache_env(study.scratch, job, int(getattr(sm, "attempt", 1)), study.weights.mirror))
    return study
