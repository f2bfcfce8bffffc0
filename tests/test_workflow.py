"""End to end through the real Snakemake, Parsl, diffusers, ffmpeg and pyiqa, on the
session's shared finished study (``conftest.finished_study``: an arm of every kind, two
panels, calibration on): outputs, no-op rerun, resume after a deleted video, verify,
worker-count and job-shape invariance, model loaded once per worker; and every model
family through the panel job."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from conftest import copy_project, copy_study, run_snakemake, small_config, study_config, write_config

from pairflow.evidence.archive import load_manifest, snapshot_files, verify_tree
from pairflow.identity import digest_file
from pairflow.layout import SEALING_RULES
from pairflow.plan.candidates import candidates
from pairflow.plan.config import StudySpec, study_from_raw
from pairflow.records.packs import Pack
from pairflow.report import plots

pytestmark = pytest.mark.slow


def snakemake(project: Path, *args: str) -> str:
    return run_snakemake(project, *args, timeout=900)


def records(scratch: Path, kind: str = "records") -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((scratch / "panels").rglob(f"{kind}/*/*.json"))
            if "run" not in p.relative_to(scratch).parts]  # never a job's run folder (logs, heartbeats)


def study_spec(project: Path) -> StudySpec:
    return study_from_raw(study_config(project), project)


def expected(project: Path) -> set[tuple[str, str, str, int]]:
    """(panel, arm, prompt, seed) of every candidate the study's config implies."""
    s = study_spec(project)
    return {(c.key.panel, c.arm.name, c.key.prompt_id, c.key.seed) for p in s.panels for c in candidates(s, p)}


@pytest.fixture
def study_run(finished_study: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A private copy of the shared finished study (for tests that run something in it):
    the project, its config and its scratch folder."""
    project = copy_study(finished_study, tmp_path / "proj")
    return project, study_config(project), project / "results" / "scratch"


@pytest.fixture
def shared(finished_study: Path):  # type: ignore[no-untyped-def]
    """The shared finished study itself, for tests that only read it."""
    return finished_study, study_config(finished_study), finished_study / "results" / "scratch"


def test_full_study_produces_every_artifact(shared) -> None:  # type: ignore[no-untyped-def]
    project, cfg, scratch = shared
    gens = records(scratch)
    want = expected(project)
    assert len(want) == 5 * len(cfg["arms"])  # t: 2 prompts x 2 seeds, u: 1 x 1; every arm
    assert {(r["candidate"]["panel"], r["arm"]["name"], r["candidate"]["prompt_id"], r["candidate"]["seed"])
            for r in gens} == want
    assert len(records(scratch, "scores")) == len(want)
    timings = records(scratch, "timing")
    assert len(timings) == len(want) and all(t["timing"]["pass"] == "timed" and t["matches_bulk_frames"]
                                             for t in timings)
    table = (scratch / "study" / "table.md").read_text()
    assert "xxh3_128:" in table and "Latency pass: timed" in table
    for arm in cfg["arms"]:  # a row per treatment, over its 5 pairs (its name may carry a note)
        assert bool(re.search(rf"^\| {arm}( \([^|]*\))? \| 5 \|", table, re.M)) == (arm != "control"), arm
    for png in ("forest", "latency", "scatter", "per_prompt", "pareto"):
        assert (scratch / "study" / "plots" / f"{png}.png").stat().st_size > 1000
    stats = json.loads((scratch / "study" / "stats.json").read_text())
    assert {m["metric"] for m in stats["comparisons"][0]["metrics"]} == {"psnr", "ssim", "temporal_flickering"}
    work = project / cfg["storage"]["work"] / "test"
    snap = work / json.loads((work / "latest.json").read_text())["snapshot"]
    assert not list(snap.rglob("*.mp4")) and not list(snap.rglob("records/*/*.json"))  # records are packed
    packed = {p: Pack(p) for p in snapshot_files(snap, load_manifest(snap))[0].values()}
    assert any("/records/" in m for p in packed.values() for m in p.members)
    assert verify_tree(scratch) == [] and verify_tree(snap) == []
    # calibration before the fan-out; the estimate and the ledger beside it; all archived
    (table,) = (scratch / "calibration").glob("*.json")
    assert set(json.loads(table.read_text())["arms"]) == set(cfg["arms"])
    ledger = json.loads((scratch / "study" / "ledger.json").read_text())
    # every job Snakemake ran is in the ledger (its own log is the reference), each finished
    ran = [r for log in (project / ".snakemake/log").glob("*.snakemake.log")
           for r in re.findall(r"^(?:local)?rule (\w+):$", log.read_text(), re.M) if r not in ("all", *SEALING_RULES)]
    assert sorted(j["rule"] for j in ledger["jobs"].values()) == sorted(ran) and len(ran) >= 10, ran  # the archive and card jobs are never billed
    assert all(j["status"] == "ok" and j["held"]["slot_s"] > 0 for j in ledger["jobs"].values())
    t = ledger["totals"]
    assert t["busy_share"] == pytest.approx(t["work_s"] / t["slot_s"]) and 0 < t["busy_share"] < 1
    assert ledger["estimate"]["total_slot_s"] > 0 and t["by_kind"]["work"] > 0
    assert set(ledger["per_stage"]) == {"generate", "score", "warm-up", "timing"}
    assert {arm for arm in ledger["totals"]["by_arm"]} == {*cfg["arms"], "(study)"}  # (study): jobs for every arm
    archived = set(snapshot_files(snap, load_manifest(snap))[0]) | {
        p.relative_to(snap).as_posix() for p in snap.rglob("*") if p.is_file()} | {
        rel for rel in load_manifest(snap)["packing"].get("chunks", {})}  # large files: in chunks
    assert {"study/ledger.json", "study/estimate.json", f"calibration/{table.name}"} <= archived


def test_every_record_and_manifest_the_study_writes_fits_its_schema(shared) -> None:  # type: ignore[no-untyped-def]
    """The real run's records (scratch and the archived snapshot) are read through the
    schema check of their kind, and every manifest through the manifest schema."""
    from pairflow.records.store import check_schema, parse_record

    project, cfg, scratch = shared
    kinds: dict[str, int] = {}
    found = [(path, path.relative_to(root), path.read_bytes())
             for root in (scratch, project / cfg["storage"]["work"])
             for path in sorted(root.rglob("*.json"))]
    for pack in sorted((project / cfg["storage"]["work"] / "test" / "packs").glob("*.pfpack")):  # the snapshot's records
        found += [(pack / m.path, Path(m.path), data) for m, data in Pack(pack).items()]
    for path, rel, data in found:
        if set(rel.parts) & {"records", "scores", "timing", "failures", "retired"} and not path.name.startswith(".tmp-"):
            kind = parse_record(data, path)["kind"]
            kinds[kind] = kinds.get(kind, 0) + 1
        elif path.suffix == ".json" and "root_digest" in (body := json.loads(data)) and "files" in body:
            check_schema(body, path, "read", "manifest")
            kinds[f"manifest {body['kind']}"] = kinds.get(f"manifest {body['kind']}", 0) + 1
    assert kinds["generation"] == kinds["score"] == kinds["timing"] >= len(expected(project))  # + the snapshot
    assert {"manifest panel-generation", "manifest panel-scores", "manifest timing", "manifest study",
            "manifest archive"} <= set(kinds)


def test_a_study_over_its_budget_is_refused_before_any_job_starts(study_run) -> None:  # type: ignore[no-untyped-def]
    """Issue 28 item 3: with the calibration table present, planning refuses a study whose
    estimate exceeds fleet.budget_gpu_hours (exit 3), naming the estimate, the budget and
    the settings that drive the cost; a dry run prints the estimate first."""
    project, cfg, _ = study_run
    over = {**cfg, "fleet": {**cfg["fleet"], "budget_gpu_hours": 1e-6}}
    (project / "config" / "budget.yaml").write_text(json.dumps(over))
    exe = Path(sys.executable).with_name("snakemake")
    proc = subprocess.run([str(exe), "--cores", "2", "--configfile", "config/budget.yaml", "-n"], cwd=project,
                          capture_output=True, text=True, timeout=600)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 3, text[-3000:]
    assert "PairFlow estimate for study 'test'" in text and "EXCEEDED" in text
    assert "over fleet/budget_gpu_hours = 1e-06 in config/budget.yaml" in text and "timing.repeats" in text


def _planned(project: Path, cfg: dict) -> list[str]:
    """The jobs a dry run of ``project`` plans with its config replaced by ``cfg``."""
    (project / "config" / "config.yaml").write_text(json.dumps(cfg))
    return sorted(re.findall(r"^(?:local)?rule (\w+):", snakemake(project, "-n"), re.M))


def test_a_budget_or_a_tracker_replans_only_what_depends_on_it(study_run) -> None:  # type: ignore[no-untyped-def]
    """Settings that change no output replan nothing. On the finished study a passing
    budget plans no job (it was a params trigger of rule estimate, whose remade output
    then reran 10 jobs: both panel jobs and the timed pass among them); naming a tracker
    plans rule track (its output is the tracker's run), rule archive (it seals once the
    tracker's run is done), rule card after it (its results name the archive's root) and
    rule all."""
    project, cfg, _ = study_run
    assert _planned(project, cfg) == []
    assert _planned(project, {**cfg, "fleet": {**cfg["fleet"], "budget_gpu_hours": 100.0}}) == []
    tracked = {**cfg, "report": {**cfg.get("report", {}), "tracker": "mlflow",
                                 "tracker_uri": f"file:{project / 'mlruns'}"}}
    assert _planned(project, tracked) == ["all", "archive", "card", "track"]


def test_without_a_table_the_budget_refusal_is_one_message_exit_3_not_retried(tiny_model: Path,
                                                                              tmp_path: Path) -> None:
    """No calibration table when the run is planned: rule calibrate makes it, rule estimate
    refuses (one line in its log, exit 3, never retried, even with --retries 1 as in
    profiles/slurm) and the run ends with the refusal once and exit 3, no traceback."""
    project = copy_project(tmp_path / "proj")
    cfg = small_config(project, tiny_model, fleet={"cpu_workers": 1, "retries": 1, "budget_gpu_hours": 1e-9})
    write_config(project, cfg)
    proc = subprocess.run([str(Path(sys.executable).with_name("snakemake")), "--profile", "profiles/local",
                           "--configfile", "config/config.yaml", "--retries", "1"], cwd=project, capture_output=True,
                          text=True, timeout=900)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 3, text[-4000:]
    assert "Traceback" not in text and text.count("localrule estimate:") == 1, text[-4000:]
    assert text.count("over fleet/budget_gpu_hours = 1e-09 in config/config.yaml") == 1
    assert "rule generate_score_panel:" not in text
    log = (project / "results" / "scratch" / "logs" / "estimate.log").read_text()
    assert "refused: " in log and "Traceback" not in log


def test_pair_shares_its_stream_and_arms_differ(shared) -> None:  # type: ignore[no-untyped-def]
    _, cfg, scratch = shared
    by = {(r["arm"]["name"], r["candidate"]["prompt_id"], r["candidate"]["seed"]): r for r in records(scratch)}
    for p, s in (("a1", 0), ("a1", 1), ("a2", 0), ("a2", 1), ("b1", 3)):
        c = by[("control", p, s)]
        for arm in cfg["arms"]:  # every arm of a pair starts from the pair's stream
            assert by[(arm, p, s)]["candidate"]["stream_seed"] == c["candidate"]["stream_seed"]
        # (a search's first candidate is control's generation, so best2 may equal control)
        for arm in ("pab", "mix", "student"):
            assert c["video"]["digest"] != by[(arm, p, s)]["video"]["digest"], (arm, p, s)


def test_each_worker_loaded_the_model_once(shared) -> None:  # type: ignore[no-untyped-def]
    """A worker's tasks reuse the model its warm-up task (or its first task) loaded: one
    load per worker process and model (the study's, and a student arm's own checkpoint),
    paid once, and recorded apart from the per-video times."""
    _, cfg, scratch = shared
    student = cfg["arms"]["student"]["model"]["path"]
    by_pid: dict[int, list[dict]] = {}
    for r in records(scratch):
        by_pid.setdefault(r["worker"]["pid"], []).append(r)
    assert any(len(rs) >= 2 for rs in by_pid.values())  # some worker ran several tasks
    for rs in by_pid.values():
        assert all(set(r["worker"]["model_loads"].values()) == {1} for r in rs)  # each model once
        assert all(r["worker"]["model_loads"].keys() <= {cfg["model"]["path"], student} for r in rs)
        warm = rs[0]["worker"]["warm_up"]
        assert all(r["worker"]["warm_up"] == warm for r in rs)
        # per pipeline: the study's model (its load: the warm-up's) and the student's own
        for own in (False, True):
            runs = [r for r in rs if ("arm_model" in r) == own]
            loads = sorted([*(r["timing"]["load_s"] for r in runs), *([warm["load_s"]] if warm and not own else [])],
                           reverse=True)
            assert len(loads) < 2 or loads[0] > 10 * loads[1], (own, loads)
        assert all({"import_s", "load_s", "generate_s", "encode_s"} <= set(r["timing"]) for r in rs)


def test_rerun_does_nothing(study_run) -> None:  # type: ignore[no-untyped-def]
    project, _, _ = study_run
    assert "Nothing to be done" in snakemake(project)


def test_deleted_video_regenerates_only_that_candidate_bit_exactly(study_run) -> None:  # type: ignore[no-untyped-def]
    project, _, scratch = study_run
    video = scratch / "panels" / "t" / "videos" / "pab" / "a2-s1.mp4"
    before = digest_file(video)
    others = {p: digest_file(p) for p in (scratch / "panels").rglob("records/*/*.json")
              if not (p.name == "a2-s1.json" and p.parent.name == "pab")}
    video.unlink()
    snakemake(project, "--forcerun", "generate_score_panel")
    log = (scratch / "logs" / "generate-score" / "t.log").read_text()
    n = sum(1 for c in expected(project) if c[0] == "t")
    assert f"generate t: {n} candidates, {n - 1} complete, 1 to run" in log
    assert digest_file(video) == before
    assert all(digest_file(p) == d for p, d in others.items())  # nothing else was rewritten
    assert verify_tree(scratch) == []


def test_rerun_one_panel_leaves_the_others_untouched(study_run) -> None:  # type: ignore[no-untyped-def]
    project, cfg, scratch = study_run
    other = {p: digest_file(p) for p in (scratch / "panels" / "t").rglob("*") if p.is_file() and "/run/" not in str(p)
             and p.suffix in (".json", ".mp4") and p.parent.parent.name != "t"}
    study_before = (scratch / "study" / "stats.json").stat().st_mtime_ns
    exe = Path(sys.executable).with_name("pairflow")
    proc = subprocess.run([str(exe), "rerun-panel", "u", "--configfile", "config/config.yaml", "--", "--cores", "2"],
                          cwd=project, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    log = (scratch / "logs" / "generate-score" / "u.log").read_text()
    n = sum(1 for c in expected(project) if c[0] == "u")
    assert f"generate u: {n} candidates, 0 complete, {n} to run" in log
    changed = [str(p) for p, d in other.items() if digest_file(p) != d]
    assert other and not changed, changed
    assert "generate t:" not in proc.stdout + proc.stderr.split("Complete log")[0].replace("generate_panel", "")
    assert (scratch / "study" / "stats.json").stat().st_mtime_ns > study_before
    work = project / cfg["storage"]["work"] / "test"
    assert len(list((work / "snapshots").iterdir())) >= 2  # a new archive snapshot; the old one kept
    assert verify_tree(scratch) == []


def test_study_numbers_do_not_depend_on_worker_count_or_job_shape(shared, study_run) -> None:  # type: ignore[no-untyped-def]
    """Two workers instead of one, and a generation job then a scoring job per panel
    (``fleet.panel_jobs: per-stage``) instead of one job: the same videos and numbers.
    Panel u of a copy of the shared study is made again that way, with panel t kept
    (test_study makes the whole study again in one ``fleet.allocation: study`` job)."""
    _, _, scratch = shared
    other, cfg2, scratch2 = study_run
    cfg2["fleet"].update(cpu_workers=2, panel_jobs="per-stage")
    (other / "config" / "config.yaml").write_text(json.dumps(cfg2))
    shutil.rmtree(scratch2 / "panels" / "u")
    out2 = snakemake(other)
    assert "rule generate_panel" in out2 and "rule score_panel" in out2 and "generate_score_panel" not in out2
    log = (scratch2 / "logs" / "generate" / "u.log").read_text()
    n = sum(1 for c in expected(other) if c[0] == "u")
    assert f"generate u: {n} candidates, 0 complete, {n} to run" in log

    def numbers(s: Path) -> list:
        stats = json.loads((s / "study" / "stats.json").read_text())
        return [[{k: m[k] for k in ("metric", "diff", "ci", "p_value", "wins", "treatment_mean")}
                 for m in comp["metrics"]] for comp in stats["comparisons"]]

    assert numbers(scratch) == numbers(scratch2)
    a = {(r["arm"]["name"], r["candidate"]["prompt_id"], r["candidate"]["seed"]): r["video"]["digest"]
         for r in records(scratch)}
    b = {(r["arm"]["name"], r["candidate"]["prompt_id"], r["candidate"]["seed"]): r["video"]["digest"]
         for r in records(scratch2)}
    assert a == b
    # Two workers served the run (a warmed worker takes tasks while the other still warms
    # up, so with tiny tasks one worker may run all of a panel's candidates).
    spans = [s for t in (scratch2 / "panels" / "u").glob("telemetry/*.json")
             for s in json.loads(t.read_text())["spans"]]
    assert len({s["rank"] for s in spans}) == 2
    assert verify_tree(scratch2) == []


@pytest.mark.parametrize("family, pipeline", [("wan", "WanPipeline"), ("cogvideox", "CogVideoXPipeline"),
                                              ("ltx", "LTXPipeline"), ("hunyuanvideo", "HunyuanVideoPipeline")])
def test_families_run_the_default_workflow_with_a_cache_arm_and_a_few_step_arm(tmp_path: Path, family: str,
                                                                               pipeline: str) -> None:
    """Tiny Wan, CogVideoX (its transformer takes 16 text tokens, its pipeline defaults to
    226), LTX and HunyuanVideo pipelines, built offline with diffusers' classes, as `model.kind: local`
    checkpoints through the workflow's model-facing steps, in this process as their rules'
    scripts call them (the arms' check, the panel job: generate and score, the timed pass,
    the statistics) with a cache arm and a few-step arm. Records name the pipeline class and
    family; the few-step arm's compute ratio is exactly its share of the steps. (The
    family-blind rest, plots, archive and verify, runs once, on the shared study.)"""
    from pairflow.fleet.pool import Grant
    from pairflow.generation.tinymodel import build_tiny_model
    from pairflow.layout import Layout
    from pairflow.plan.candidates import COMBINED
    from pairflow.stages import steps
    from pairflow.stages.combined import run_panel
    from pairflow.stages.timing import run_timed_pass

    model = build_tiny_model(tmp_path / f"tiny-{family}", family)
    cfg = small_config(tmp_path, model)
    cfg["model"] = {"kind": "local", "path": str(model)}
    cfg["generation"].update(frames=9, steps=2)
    cfg["arms"]["fewstep"] = {"steps": 1}
    arms = {"control", "pab", "fewstep"}
    if family == "wan":  # the embedded family also runs a best-of-2 search arm
        cfg["arms"]["best2"] = {"search": {"n": 2, "verifier": "temporal_flickering"}}
        arms.add("best2")
    cfg["timing"] = {"warmup": 0, "repeats": 1}
    (tmp_path / "config" / "panels" / "t.tsv").write_text("prompt_id\tprompt\na1\ta red fox running through "
                                                           "fresh snow at dawn, cinematic\n")
    study = study_from_raw(cfg, tmp_path)
    at = Layout(study.scratch)
    steps.check_arms(study, at.arms_check)  # rule check_arms
    run_panel(study, "t", at.generation_manifest("t"), at.score_manifest("t"), at.run_dir("t", COMBINED),
              Grant())  # rule generate_score_panel
    run_timed_pass(study, ["t"], at.timing_manifest)  # rule timed_pass
    steps.study_stats(study, steps.study_manifests(study, at.timing_manifest), at.study_stats, at.study_table(),
                      at.study_manifest)  # rule study_stats
    scratch = study.scratch
    recs = records(scratch)
    assert len(recs) == len(arms) and {r["arm"]["name"] for r in recs} == arms
    for r in recs:
        assert r["pipeline"]["class"] == pipeline and r["video"]["frames"] == 9
        assert r["pipeline"]["family"] == {"wan": "wan", "cogvideox": "cogvideo", "ltx": "ltx",
                                           "hunyuanvideo": "hunyuan_video"}[family]
        assert r["pipeline"]["max_text_tokens"] == (16 if family == "cogvideox" else 64)
        assert r["compute"]["transformer_flops"] > 0
    assert len(records(scratch, "scores")) == len(records(scratch, "timing")) == len(arms)
    stats = json.loads((scratch / "study" / "stats.json").read_text())
    by = {c["treatment"]: c for c in stats["comparisons"]}
    assert by["fewstep"]["compute"]["ratio"] == pytest.approx(0.5, rel=1e-12)
    assert by["pab"]["compute"]["attention_skipped"] > 0 and by["pab"]["compute"]["ratio"] < 1
    assert "compute ratio [CI]" in (scratch / "study" / "table.md").read_text()
    if family == "wan":
        assert by["best2"]["compute"]["ratio"] == pytest.approx(2.0, rel=1e-3)
        search = next(r for r in recs if r["arm"]["name"] == "best2")["search"]
        assert [c["index"] for c in search["candidates"]] == [0, 1] and search["chosen"] in (0, 1)
        timed = json.loads(next((scratch / "panels" / "t" / "timing" / "best2").glob("*.json")).read_text())
        assert timed["timing"]["covers"].startswith("2 generations") and timed["matches_bulk_frames"] is True
    assert verify_tree(scratch) == []


def test_report_shows_the_table_and_plots_in_headless_chromium(study_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Snakemake's HTML report, opened in Debian's chromium through playwright: the landing
    page links the study table and the forest plot; the table has a row per treatment and
    headers with their direction; every plot renders at a readable size; the gallery shows
    control and the treatment for every pair, with the score records' numbers. CI installs
    chromium and sets PAIRFLOW_REQUIRE_BROWSER=1, so there it never skips."""
    import importlib.util
    import os
    import shutil

    if not (shutil.which("chromium") and importlib.util.find_spec("playwright")):
        if os.environ.get("PAIRFLOW_REQUIRE_BROWSER"):
            raise AssertionError("PAIRFLOW_REQUIRE_BROWSER is set but chromium or playwright is missing")
        pytest.skip("needs Debian's chromium and playwright (see docs/results-and-reports.md)")
    project, cfg, scratch = study_run
    snakemake(project, "--report", "results/report.html")
    sys.path.insert(0, str(project / "workflow" / "checks"))
    from report_screenshot import inspect

    found = inspect(project / "results" / "report.html", tmp_path / "shots")
    assert found["landing_text"] and {"Study", "forest.png"} <= set(found["landing_links"])
    treatments = [a for a in cfg["arms"] if a != "control"]
    assert found["table_rows"] == len(treatments)  # a row per treatment
    assert any("speedup" in h for h in found["table_headers"])
    assert any("higher is better" in h for h in found["table_headers"])
    for name, (natural_w, shown_w, shown_h) in found["plots"].items():
        assert natural_w > 100 and shown_w > 100 and shown_h > 100, (name, natural_w, shown_w, shown_h)
    natural_w, shown_w, _ = found["plots"]["forest.png"]  # issue 41: its text was ~6 px where the report draws it
    assert plots.FOREST_MIN_FONT_PT * plots.DPI / 72 * min(1.0, shown_w / natural_w) >= 10, found["plots"]
    assert (tmp_path / "shots" / "table.png").stat().st_size > 10_000
    # the gallery, inside the report: every pair of both panels, both arms drawn, numbers = the score records
    scores = {(r["candidate"]["panel"], r["candidate"]["prompt_id"], r["candidate"]["seed"], r["arm"]["name"]): r
              for r in records(scratch, "scores")}
    pairs = found["gallery"]
    assert len(pairs) == 5 * len(treatments) and {p["arm"] for p in pairs} == set(treatments)
    assert all(next(p for p in pairs if p["arm"] == a)["shows"] == "plays" for a in treatments)  # worst first
    for p in pairs:  # each shows what it says: playing videos, drawn filmstrips, or numbers only
        assert p["shows"] in ("plays", "filmstrips", "numbers")
        assert len(p["videos"]) == (2 if p["shows"] == "plays" else 0), p
        assert all(v["ready"] >= 2 and v["w"] > 0 and v["time"] > 0 and not v["paused"] for v in p["videos"]), p
        assert p["labels"] in (["control", p["arm"]], []) and len(p["images"]) == len(p["labels"])
        assert all(i["w"] > 0 and i["shown"] > 50 for i in p["images"])
        assert len(p["links"]) == 2 and all(Path(unquote(urlparse(u).path)).is_file() for u in p["links"])
        key = next(k for k in scores if k[1:] == (p["prompt"], p["seed"], p["arm"]))
        rec, ctrl = scores[key], scores[(key[0], key[1], key[2], "control")]
        assert p["digest"] == rec["record_digest"]
        for m in p["metrics"]:
            assert float(m["treatment"]) == rec["scores"][m["metric"]]["value"]
            if m["metric"] in ctrl["scores"]:
                assert float(m["diff"]) == rec["scores"][m["metric"]]["value"] - ctrl["scores"][m["metric"]]["value"]


def test_e2e_benchmark_reads_the_work_share_from_records_and_benchmark_files(shared) -> None:  # type: ignore[no-untyped-def]
    """The benchmark section that reports where a study's time goes runs on a real run."""
    import importlib.util

    project, _, scratch = shared
    spec = importlib.util.spec_from_file_location("bench_run", Path(__file__).parents[1] / "benchmarks" / "run.py")
    run = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(run)  # type: ignore[union-attr]
    e = run.bench_e2e(1, True, scratch)
    assert e["candidates"] == len(expected(project)) and 0 < e["work_share"] < 1
    assert e["work_s"] == pytest.approx(e["generate_s_sum"] + e["encode_s_sum"] + e["score_s_sum"])
    assert {"generate_score_panel", "timed_pass"} <= set(e["job_wall_s_by_rule"])
    assert e["warm_up_tasks"] >= 2 and e["model_load_s_sum"] > 0  # one warm-up per slot per panel job
