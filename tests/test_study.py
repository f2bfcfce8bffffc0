"""``fleet.allocation: study`` (``stages/study``): a study through one job (rule
``fleet_study``) with the real Snakemake, Parsl, tiny model, ffmpeg and scorers.

The session's shared finished study (``conftest.finished_study``: per-panel jobs, one
worker), made again from its calibration in study mode with two workers, killed mid-run
(SIGKILL to Snakemake, its job and so the driver) and resumed, must finish every panel,
keep the candidates finished before the kill, and give the same candidate ids, video
digests and statistics as the per-panel jobs under the same seeds; a panel rerun in
study mode reruns that panel only; on a Slurm cluster the default study is one
allocation spanning its nodes (skipped, with the reason, where no cluster answers)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, copy_project, copy_study, run_processes, small_config, start_time, study_config

from pairflow.evidence.archive import verify_tree
from pairflow.fleet.pool import Grant
from pairflow.fleet.sites.slurm import cluster_unavailable
from pairflow.identity import digest_file
from pairflow.layout import Layout
from pairflow.plan.candidates import candidates
from pairflow.plan.config import study_from_raw
from pairflow.stages.scoring import scoring_context
from pairflow.stages.study import _Panel, _StudyQueue

BIN = Path(sys.executable).parent
PANELS = ("t", "u")  # the shared study's


def _project(dest: Path, model: Path, **fleet: object) -> Path:
    """The shipped default config (its study, arms, panels and seeds), with the model the
    session built, these fleet keys and one timed run per candidate instead of three (no
    test here reads a latency; the other two repeats of 56 candidates cost ~20 s a run)."""
    project = copy_project(dest)
    shutil.copytree(ROOT / "config", project / "config")
    cfg = yaml.safe_load((project / "config" / "config.yaml").read_text())
    cfg["model"]["path"] = str(model)
    cfg["fleet"].update(fleet)
    cfg["timing"] = {**cfg.get("timing", {}), "repeats": 1}
    (project / "config" / "config.yaml").write_text(yaml.safe_dump(cfg))
    return project


def _snakemake(project: Path, *args: str) -> str:
    proc = subprocess.run([str(BIN / "snakemake"), "--cores", "2", "--configfile", "config/config.yaml", *args],
                          cwd=project, capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, f"snakemake failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc.stdout + proc.stderr


def _records(project: Path, kind: str = "records") -> dict[str, dict]:
    scratch = project / "results" / "scratch" / "panels"
    return {r["candidate"]["candidate_id"]: r for r in
            (json.loads(p.read_text()) for p in sorted(scratch.glob(f"*/{kind}/*/*.json")))}


def _numbers(project: Path) -> list:
    stats = json.loads((project / "results/scratch/study/stats.json").read_text())
    return [[{k: m[k] for k in ("metric", "diff", "ci", "p_value", "wins", "treatment_mean")} for m in c["metrics"]]
            for c in stats["comparisons"]]


def _counts(project: Path) -> dict[str, int]:
    """Candidates per panel, as the project's config implies them."""
    spec = study_from_raw(study_config(project), project)
    return {p.name: len(candidates(spec, p)) for p in spec.panels}


@pytest.fixture(scope="module")
def per_panel(finished_study: Path) -> Path:
    """The shared finished study: per-panel jobs (``fleet.panel_jobs: combined``), one worker."""
    cfg = study_config(finished_study)
    assert cfg["fleet"].get("allocation", "panel") != "study" and cfg["fleet"]["cpu_workers"] == 1
    assert tuple(cfg["panels"]) == PANELS
    return finished_study


@pytest.fixture(scope="module")
def study(per_panel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[Path, int], str]:
    """A copy of the shared study with its results gone but for the calibration table and
    the arms' check (so neither runs again), in study mode with two workers, SIGKILLed
    once some candidates are complete, then resumed. Returns the project, the records
    complete at the kill (path → mtime) and the resumed run's output."""
    project = copy_study(per_panel, tmp_path_factory.mktemp("study") / "p")
    cfg = study_config(project)
    scratch = project / cfg["storage"]["scratch"]
    keep = {scratch / "calibration", Layout(scratch).checks}
    for p in [*scratch.iterdir(), *Layout(scratch).checks.iterdir()]:
        if p not in keep and p != Layout(scratch).arms_check:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    work = project / cfg["storage"]["work"]
    for p in work.rglob("*"):  # promoted snapshots are read-only
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o755)
    shutil.rmtree(work)
    cfg["fleet"].update(allocation="study", cpu_workers=2)
    (project / "config/config.yaml").write_text(yaml.safe_dump(cfg))
    total = sum(_counts(project).values())
    records = scratch / "panels"
    proc = subprocess.Popen([str(BIN / "snakemake"), "--cores", "2", "--configfile", "config/config.yaml"],
                            cwd=project, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    running: dict[int, int] = {}
    try:
        deadline = time.time() + 1800
        while len([p for p in records.glob("*/records/*/*.json") if not p.name.startswith(".tmp-")]) < 3:
            assert proc.poll() is None and time.time() < deadline, "the study job ended or stalled before the kill"
            time.sleep(0.1)
        running = run_processes(project, proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # finished records only: a write the kill interrupted is a temp the rerun removes
    kept = {p: p.stat().st_mtime_ns for p in records.glob("*/records/*/*.json") if not p.name.startswith(".tmp-")}
    assert 3 <= len(kept) < total
    # The pool's watchdog ends the orphaned workers (orphans: SIGTERM, SIGKILL 10 s later)
    # before the rerun: wait for every process of the killed run, not a fixed 25 s.
    deadline = time.time() + 60
    while live := [p for p, t in {**running, **run_processes(project)}.items() if start_time(p) == t]:
        assert time.time() < deadline, f"processes of the killed study run still live after 60 s: {live}"
        time.sleep(0.5)
    _snakemake(project, "--unlock")
    out = _snakemake(project, "--rerun-incomplete")
    return project, kept, out


@pytest.mark.slow
def test_study_mode_is_one_job_and_gives_per_panel_modes_numbers(per_panel: Path, study) -> None:  # type: ignore[no-untyped-def]
    project, _, out = study
    assert "rule fleet_study" in out and "generate_score_panel" not in out
    scratch = project / "results/scratch"
    for p in PANELS:
        assert (scratch / "panels" / p / "generation.json").exists() and (scratch / "panels" / p / "scores.json").exists()
    a, b = _records(per_panel), _records(project)
    assert len(a) == sum(_counts(project).values()) and a.keys() == b.keys()
    assert {k: r["video"]["digest"] for k, r in a.items()} == {k: r["video"]["digest"] for k, r in b.items()}
    sa, sb = _records(per_panel, "scores"), _records(project, "scores")
    assert sa.keys() == sb.keys() == a.keys()
    assert _numbers(per_panel) == _numbers(project)
    assert verify_tree(scratch) == []
    # One job wrote every record; its telemetry is the study's one record of generation and scoring.
    spans = json.loads((scratch / "study/telemetry/fleet.json").read_text())["spans"]
    assert {s.get("stage") for s in spans if s.get("kind") != "warm-up"} == {"generate", "score"}
    assert not list(scratch.glob("panels/*/telemetry/generate-score.json"))
    u = json.loads((scratch / "study/utilisation.json").read_text())
    assert [j["job"] for j in u["jobs"]] == ["fleet:study"]


@pytest.mark.slow
def test_resume_after_a_kill_keeps_finished_candidates_and_writes_panels_as_they_complete(study) -> None:  # type: ignore[no-untyped-def]
    project, kept, _ = study
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # not one finished candidate regenerated
    log = (project / "results/scratch/logs/fleet/study.log").read_text()  # the resumed job's (Snakemake clears it)
    plan = {p: (int(n), int(k)) for p, n, k in re.findall(r"generate (\w+): (\d+) candidates, (\d+) complete", log)}
    # At least what was complete at the kill: a worker the kill orphaned may finish the
    # candidate it was on before the pool's watchdog ends it (a complete, verified record).
    assert plan.keys() == set(PANELS) and sum(k for _, k in plan.values()) >= len(kept)
    # The first panel's manifests were written while the other panel's tasks still ran.
    first = log.rindex("done (1 of 2 panels)")
    assert "done (2 of 2 panels)" in log[first:] and " done (" in log[first:log.rindex("done (2 of 2 panels)")]


@pytest.mark.slow
def test_status_reads_the_study_job(study) -> None:  # type: ignore[no-untyped-def]
    project, _, _ = study
    proc = subprocess.run([str(BIN / "pairflow"), "status", "--configfile", "config/config.yaml", "--json"],
                          cwd=project, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    st = json.loads(proc.stdout)
    assert st["finished"] and st["done"] == st["total"] == 3 * sum(_counts(project).values())
    busy = {s["busy_share"] for s in st["stages"] if s["stage"] != "timing"}
    assert len(busy) == 1 and 0 < busy.pop() <= 1  # every panel reports the one job's busy share


@pytest.mark.slow
def test_rerun_panel_in_study_mode_reruns_that_panel_only(study) -> None:  # type: ignore[no-untyped-def]
    project, _, _ = study
    scratch = project / "results/scratch"
    other = {p: digest_file(p) for p in (scratch / "panels" / "t").rglob("*")
             if p.is_file() and p.suffix in (".json", ".mp4") and p.parent.parent.name in ("records", "videos", "scores")}
    proc = subprocess.run([str(BIN / "pairflow"), "rerun-panel", "u", "--configfile", "config/config.yaml", "--",
                           "--cores", "2"], cwd=project, capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    log = (scratch / "logs/fleet/study.log").read_text()  # this job's (Snakemake clears it)
    n = _counts(project)
    assert f"generate t: {n['t']} candidates, {n['t']} complete, 0 to run" in log
    assert f"generate u: {n['u']} candidates, 0 complete, {n['u']} to run" in log
    assert other and all(digest_file(p) == d for p, d in other.items())
    assert verify_tree(scratch) == []


@pytest.mark.slow
def test_one_allocation_spans_the_clusters_nodes(tiny_model: Path, tmp_path: Path) -> None:
    """On the Slurm cluster (``.ci/slurm-up``): generation and scoring of every panel in
    one Slurm job across its nodes (``--nodes 2`` when it has two), the timed pass in its own."""
    why = cluster_unavailable()
    if why is not None:
        pytest.skip(why)
    nodes = min(2, int(subprocess.run(["sinfo", "-h", "-o", "%D"], capture_output=True, text=True,
                                      check=True).stdout.split()[0]))
    project = _project(tmp_path / "p", tiny_model, allocation="study")
    # The shipped profile asks for 2 nodes; a one-node cluster gets 1 (a --set-resources
    # on the command line would replace the profile's whole set-resources).
    profile = project / "profiles/slurm/config.v8+.yaml"
    prof = yaml.safe_load(profile.read_text())
    assert prof["set-resources"]["fleet_study"]["nodes"] == 2
    prof["set-resources"]["fleet_study"]["nodes"] = nodes
    profile.write_text(yaml.safe_dump(prof))
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    env.pop("SLURM_CONF", None)
    run = subprocess.run([str(BIN / "snakemake"), "--profile", "profiles/slurm", "--configfile", "config/config.yaml"],
                         cwd=project, env=env, capture_output=True, text=True, timeout=2400)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    gen, scores = _records(project), _records(project, "scores")
    assert len(gen) == len(scores) == 84  # the default study: 4 declared arms and 2 iso-compute controls
    jobs = {r["worker"]["slurm_job"] for r in [*gen.values(), *scores.values()]}
    assert len(jobs) == 1 and None not in jobs  # one allocation for the whole study
    assert len({r["worker"]["host"] for r in gen.values()}) == nodes  # workers on every node
    timing = {r["worker"]["slurm_job"] for p in (project / "results/scratch/panels").glob("*/timing/*/*.json")
              if (r := json.loads(p.read_text()))["sampled"]}  # timing.pairs: auto may stop before some
    assert timing and not timing & jobs  # the timed pass: its own exclusive job


def test_the_queue_feeds_a_window_scores_first_then_panels_in_order_and_survives_failures(tmp_path: Path,
                                                                                         tiny_model: Path) -> None:
    """The driver's queue without a pool: the first window is panel t's generation then
    panel u's, never more than the window in flight; a failed task frees its place for
    the next, and a panel whose tasks failed gets no manifests."""
    cfg = small_config(tmp_path, tiny_model, fleet={"cpu_workers": 1, "retries": 0, "allocation": "study"})
    (tmp_path / "config/panels/u.tsv").write_text("prompt_id\tprompt\nb1\ta lighthouse at night\n")
    cfg["panels"]["u"] = {"sheet": str(tmp_path / "config/panels/u.tsv"), "seeds": [3]}
    study = study_from_raw(cfg, tmp_path)
    panels = []
    for name in ("t", "u"):
        p = _Panel(name, tmp_path / f"{name}-gen.json", tmp_path / f"{name}-scores.json",
                   candidates(study, study.panel(name)))
        for c in p.todo_all:
            p.pairs.setdefault(c.key.pair_key, []).append(c)
        panels.append(p)
    shared = scoring_context(study, Grant())
    q = _StudyQueue(study, panels, shared["scorer"], window=3)
    in_flight = q.prepare(shared)
    submitted = list(in_flight)
    assert q.in_flight == 3 and not q.scores  # no video yet: nothing to score
    while in_flight:  # every task fails: each frees its place for the next
        new = q.failed(in_flight.pop(0)[1])
        in_flight += new
        submitted += new
        assert q.in_flight == len(in_flight) <= 3
    assert [t[1]["candidate"].key.panel for t in submitted] == ["t"] * 4 + ["u"] * 2
    assert {t[1]["stage"] for t in submitted} == {"generate"}
    assert {p.name: (p.failed, p.outstanding, p.done) for p in panels} == {"t": (4, 0, False), "u": (2, 0, False)}
    assert not list(tmp_path.glob("*.json"))  # no manifests for panels whose tasks failed
