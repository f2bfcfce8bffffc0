"""layout: the one owner of where outputs live. Its paths are the documented ones, the
package's path helpers and the Snakefile's targets come from it, and no other module
spells the tree's folder names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import ROOT

from pairflow.layout import Layout


def test_paths_are_the_documented_ones() -> None:
    at = Layout(Path("/s"))
    assert at.output("smoke", "videos", "fbcache", "p1-s0") == Path("/s/panels/smoke/videos/fbcache/p1-s0.mp4")
    assert at.output("smoke", "records", "control", "p1-s0") == Path("/s/panels/smoke/records/control/p1-s0.json")
    assert at.failure("smoke", "score", "pab", "p1-s3") == Path("/s/panels/smoke/failures/score/pab/p1-s3.json")
    assert at.run_dir("{panel}", "generate") == Path("/s/panels/{panel}/run/generate")
    assert at.timed_run_dir("smoke") == Path("/s/panels/smoke/run/timed-pass")  # never timing/<x>/<y>.json's shape
    assert at.generation_manifest("{panel}") == Path("/s/panels/{panel}/generation.json")
    assert at.study_table(".html") == Path("/s/study/table.html")
    assert at.timed_pass_telemetry == Path("/s/study/telemetry/timed_pass.json")
    assert at.replicate_timing("r2", "motion") == Path("/s/replicates/r2/panels/motion/timing.json")
    assert at.benchmark("generate_panel", "{panel}") == Path("/s/benchmarks/generate_panel/{panel}.tsv")
    assert at.heal == Path("/s/heal") and at.contexts == Path("/s/contexts") and at.checks == Path("/s/checks")


def test_the_package_and_the_snakefile_ask_the_layout() -> None:
    """No module but ``layout`` spells the tree's folders; the rules build their paths
    from ``LAYOUT`` (regression: ``results/scratch/panels/...`` was rebuilt by hand in
    about nine places)."""
    folder = re.compile(r'/ "(panels|study|heal|contexts|checks|replicates|failures|telemetry|benchmarks)"'
                        r'|\{SCRATCH\}/')
    offenders = []
    for path in [*(ROOT / "workflow" / "pairflow").rglob("*.py"), *(ROOT / "workflow" / "scripts").glob("*.py"),
                 *(ROOT / "workflow" / "rules").glob("*.smk")]:
        if path.name == "layout.py":
            continue
        offenders += [f"{path.relative_to(ROOT)}:{n}" for n, line in enumerate(path.read_text().splitlines(), 1)
                      if folder.search(line)]
    assert offenders == []
    common = (ROOT / "workflow" / "rules" / "common.smk").read_text()
    assert "LAYOUT = Layout(as_named(STUDY.scratch))" in common


def test_candidate_paths_of_the_package_are_the_layouts(tiny_model: Path, tmp_path: Path) -> None:
    from conftest import small_config

    from pairflow.plan.candidates import (
        candidates,
        failure_path,
        record_path,
        score_path,
        telemetry_path,
        timing_path,
        video_path,
    )
    from pairflow.plan.config import study_from_raw

    study = study_from_raw(small_config(tmp_path, tiny_model), tmp_path)
    at = Layout(study.scratch)
    c = candidates(study, study.panels[0])[1]
    assert video_path(at, c) == at.output("t", "videos", c.arm.name, c.stem)
    assert (record_path(at, c), score_path(at, c), timing_path(at, c)) == tuple(
        at.output("t", kind, c.arm.name, c.stem) for kind in ("records", "scores", "timing"))
    assert failure_path(at, c, "generate") == at.failure("t", "generate", c.arm.name, c.stem)
    assert telemetry_path(at, "t", "score") == at.telemetry("t", "score")


def test_paths_are_named_relative_to_the_project_when_inside_it(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from pairflow.layout import as_named

    monkeypatch.chdir(tmp_path)
    assert as_named(tmp_path / "results" / "scratch") == Path("results/scratch")
    assert as_named("results/scratch/x.json") == Path("results/scratch/x.json")
    outside = tmp_path.parent / "elsewhere" / "scratch"
    assert as_named(outside) == outside  # absolute: no ../ climbing out of the project
    # named for a project snakemake will run in (pairflow rerun-panel --directory), from elsewhere
    project = tmp_path / "project"
    assert as_named(project / "results" / "scratch", project) == Path("results/scratch")
    assert as_named(tmp_path / "results", project) == tmp_path / "results"
