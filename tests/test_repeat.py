"""repeat: the repeatability report (bitwise share, per-metric noise floor, latency CV)
computed by hand-checkable numbers, written as JSON and Markdown; and the repeatability
rules as Snakemake plans them (a real ``snakemake -n``) for the default study."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, copy_project, generation_record, metric_spec, score_record, small_config, timing_record

from pairflow.analysis.repeat import markdown, noise_report, replicate_study, write
from pairflow.analysis.stats import noise_flags
from pairflow.errors import PairingError
from pairflow.layout import Layout
from pairflow.plan.config import study_from_raw

SPEC = metric_spec("aesthetic_quality")


def run(videos: dict[str, str], values: dict[str, float], latency: dict[str, float]) -> tuple[list, list, list]:
    """One run of a panel of one prompt: control and ``fast``, each with its video (equal
    names: bit-identical videos), its aesthetic score and its timed latency."""
    gens = {arm: generation_record("p", "a1", 0, arm, 7, video) for arm, video in videos.items()}
    scores = [score_record(g, gens["control"], {"aesthetic_quality": (values[arm], SPEC)}) for arm, g in gens.items()]
    timings = [timing_record(g, latency[arm]) for arm, g in gens.items()]
    return list(gens.values()), scores, timings


def test_noise_report_states_the_bitwise_share_the_score_spread_and_the_latency_cv() -> None:
    runs = {
        "original": run({"control": "c", "fast": "f"}, {"control": 0.50, "fast": 0.40}, {"control": 2.0, "fast": 1.0}),
        "r1": run({"control": "c", "fast": "f-other"}, {"control": 0.50, "fast": 0.43}, {"control": 2.2, "fast": 1.0}),
        "r2": run({"control": "c", "fast": "f"}, {"control": 0.50, "fast": 0.40}, {"control": 1.8, "fast": 1.0}),
    }
    report = noise_report(runs)
    assert report["replicates"] == ["r1", "r2"]
    assert report["videos_compared"] == 4  # 2 replicates x 2 videos
    assert report["bitwise_identical_share"] == 3 / 4  # r1's fast video differs
    floor = report["noise_floor"]["aesthetic_quality"]
    assert floor["candidates"] == 2
    assert floor["max_range"] == pytest.approx(0.03)  # fast: 0.40, 0.43, 0.40
    assert floor["median_range"] == pytest.approx(0.015)  # median of control's 0 and fast's 0.03
    assert floor["max_sd"] == pytest.approx(statistics.pstdev([0.40, 0.43, 0.40]))
    cv = report["latency_cv"]
    control_cv = statistics.stdev([2.0, 2.2, 1.8]) / 2.0
    assert cv["across_runs_max"] == pytest.approx(control_cv)
    assert cv["across_runs_median"] == pytest.approx(control_cv / 2)  # fast's latency never moved: CV 0
    within = statistics.stdev([0.99, 1.0, 1.01]) / 1.0  # timing_record's three repeats at +-1 %
    assert cv["within_run_median"] == pytest.approx(within)


def test_unsampled_timings_and_no_replicates_give_none_not_zero() -> None:
    gens, scores, timings = run({"control": "c", "fast": "f"}, {"control": 0.5, "fast": 0.4},
                                {"control": 2.0, "fast": 1.0})
    unsampled = [timing_record(g, None) for g in gens]
    report = noise_report({"original": (gens, scores, unsampled)})
    assert report["videos_compared"] == 0 and report["bitwise_identical_share"] is None
    assert report["latency_cv"] == {"across_runs_median": None, "across_runs_max": None, "within_run_median": None}
    assert report["noise_floor"]["aesthetic_quality"]["max_range"] == 0
    text = markdown(report, [])
    assert "Replicates: none; videos compared with the original: 0; bitwise identical: n/a." in text
    assert "across runs median n/a" in text


def test_a_replicate_candidate_missing_from_the_original_is_a_pairing_error() -> None:
    original = run({"control": "c"}, {"control": 0.5}, {"control": 2.0})
    replicate = run({"control": "c", "fast": "f"}, {"control": 0.5, "fast": 0.4}, {"control": 2.0, "fast": 1.0})
    with pytest.raises(PairingError, match="replicate r1: candidate .*'fast'.* no generation record in the original"):
        noise_report({"original": original, "r1": replicate})


def test_write_keeps_the_flags_and_the_markdown_table(tmp_path: Path) -> None:
    runs = {"original": run({"control": "c", "fast": "f"}, {"control": 0.5, "fast": 0.40}, {"control": 2, "fast": 1}),
            "r1": run({"control": "c", "fast": "f"}, {"control": 0.5, "fast": 0.42}, {"control": 2, "fast": 1})}
    report = noise_report(runs)
    stats = {"comparisons": [{"treatment": "fast", "metrics": [
        {"metric": "aesthetic_quality", "diff": -0.01, "ci": [-0.015, -0.005]},
        {"metric": "psnr", "diff": 3.0, "ci": [2.0, 4.0]}]}]}  # no floor measured for psnr: no flag
    flags = noise_flags(stats, report["noise_floor"])  # type: ignore[arg-type]
    assert flags == ["fast / aesthetic_quality: diff -0.01 [-0.015, -0.005] vs floor ±0.02: within the noise floor "
                     "(indistinguishable from a rerun)"]
    write(report, flags, tmp_path / "r.json", tmp_path / "r.md")
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["noise_flags"] == flags and saved["noise_floor"] == json.loads(json.dumps(report["noise_floor"]))
    text = (tmp_path / "r.md").read_text()
    assert "| aesthetic_quality | 2 | 0.02 | 0.01 | 0.01 |" in text
    assert f"- {flags[0]}" in text and "bitwise identical: 100.0%" in text


def test_a_replicate_is_the_same_study_under_replicates(tmp_path: Path) -> None:
    study = study_from_raw(small_config(tmp_path, tmp_path / "model"), tmp_path)
    r1 = replicate_study(study, "r1")
    assert Path(r1.scratch) == Path(study.scratch) / "replicates" / "r1"
    assert r1.panels == study.panels and r1.arms == study.arms and r1.generation == study.generation
    assert Layout(r1.scratch).panel("t") == Layout(study.scratch).replicate("r1").panel("t")


@pytest.fixture(scope="module")
def default_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project as shipped (Snakefile, workflow, the default config and its panels)."""
    project = copy_project(tmp_path_factory.mktemp("repeat-project"))
    shutil.copytree(ROOT / "config", project / "config")
    return project


def plan(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("snakemake")
    return subprocess.run([str(exe), "-n", "--cores", "2", *args], cwd=project, capture_output=True, text=True,
                          timeout=300, check=False)


def job_counts(out: str) -> dict[str, int]:
    """Snakemake's "Job stats" table of a dry run: rule -> jobs."""
    table = out.split("Job stats:", 1)[1].split("\n\n", 1)[0]
    rows = [line.split() for line in table.splitlines()[3:]]
    return {row[0]: int(row[1]) for row in rows if len(row) == 2 and row[1].isdigit()}


def test_the_repeatability_target_plans_one_replicate_job_per_replicate_and_panel(default_project: Path) -> None:
    """Default study: 2 replicates (schema default) x 2 panels (panels: [] means every
    one), after the study itself (its statistics are the report's input)."""
    proc = plan(default_project, "repeatability")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    counts = job_counts(proc.stdout)
    assert counts["replicate_panel"] == 4 and counts["repeatability"] == 1
    assert counts["study_stats"] == 1 and counts["generate_score_panel"] == 2 and counts["timed_pass"] == 1
    for rep in ("r1", "r2"):
        for panel in ("smoke", "motion"):
            assert f"replicates/{rep}/panels/{panel}/timing.json" in proc.stdout
    assert "archive" not in counts  # on demand: the report does not need the archive
    assert not (default_project / "results").exists()  # a dry run writes nothing in the tree


def test_repeatability_settings_change_the_plan(default_project: Path, tmp_path: Path) -> None:
    cfg = (default_project / "config" / "config.yaml").read_text()
    other = tmp_path / "config.yaml"
    other.write_text(cfg + "\nrepeatability: {replicates: 3, panels: [motion]}\n")
    proc = plan(default_project, "repeatability", "--configfile", str(other))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert job_counts(proc.stdout)["replicate_panel"] == 3
    assert "replicates/r3/panels/motion/timing.json" in proc.stdout and "replicates/r1/panels/smoke" not in proc.stdout
