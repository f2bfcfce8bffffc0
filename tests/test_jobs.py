"""stages/jobs: what every panel job does around its tasks: name a task as the stall
error does, clear the failure records of candidates now done, sweep the temporaries an
interrupted write left (older than the job only), time imports."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from conftest import small_config

from pairflow.atomic import TMP_PREFIX
from pairflow.layout import Layout
from pairflow.plan.candidates import candidates, failure_path
from pairflow.plan.config import study_from_raw
from pairflow.stages.jobs import clear_failures, describe, sweep_after, sweep_panel, timed_imports


def test_describe_names_arm_prompt_and_seed(tmp_path: Path) -> None:
    study = study_from_raw(small_config(tmp_path, tmp_path / "model"), tmp_path)
    c = candidates(study, study.panel("t"))[1]
    assert describe({"candidate": c}) == f"{c.arm.name}/{c.stem}" == "pab/a1-s0"


def test_clear_failures_removes_only_the_done_candidates_records_of_that_stage(tmp_path: Path) -> None:
    study = study_from_raw(small_config(tmp_path, tmp_path / "model"), tmp_path)
    cs = candidates(study, study.panel("t"))
    for c in cs:
        for stage in ("generate", "score"):
            failure_path(Layout(study.scratch), c, stage).parent.mkdir(parents=True, exist_ok=True)
            failure_path(Layout(study.scratch), c, stage).write_text("{}")
    clear_failures(study, cs[:2], "generate")
    clear_failures(study, cs[:2], "generate")  # already gone: no error
    assert [failure_path(Layout(study.scratch), c, "generate").exists() for c in cs] == [False, False, True, True]
    assert all(failure_path(Layout(study.scratch), c, "score").exists() for c in cs)


def test_sweep_panel_removes_older_temporaries_and_keeps_a_live_writers(tmp_path: Path) -> None:
    study = study_from_raw(small_config(tmp_path, tmp_path / "model"), tmp_path)
    layout = Layout(study.scratch)
    records = layout.panel("t") / "records" / "pab"
    records.mkdir(parents=True)
    old, live, kept = records / f"{TMP_PREFIX}a.json", records / f"{TMP_PREFIX}b.json", records / "a1-s0.json"
    for f in (old, live, kept):
        f.write_text("x")
    started = time.time()
    os.utime(old, (started - 60, started - 60))
    os.utime(live, (started + 1, started + 1))
    other = layout.panel("t") / "elsewhere"  # a folder the job does not write: not swept
    other.mkdir()
    (other / f"{TMP_PREFIX}c").write_text("x")
    os.utime(other / f"{TMP_PREFIX}c", (started - 60, started - 60))
    sweep_panel(study, "t", started, ("records",))
    assert not old.exists() and live.exists() and kept.exists() and (other / f"{TMP_PREFIX}c").exists()


def test_sweep_after_removes_every_temp_a_killed_writer_of_this_job_left(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    """Issue 38 (faults): once the job's pool is down, every temp in the panel's folders is a
    killed writer's, however fresh (a task lost seconds ago and redone), and goes with one
    warning each; another panel's folders and the panel's other files stay."""
    import logging

    study = study_from_raw(small_config(tmp_path, tmp_path / "model"), tmp_path)
    layout = Layout(study.scratch)
    videos, records = layout.panel("t") / "videos" / "pab", layout.panel("t") / "records" / "control"
    for d in (videos, records):
        d.mkdir(parents=True)
    fresh = videos / f"{TMP_PREFIX}a1-s0.mp4.k1lledwr1ter0001.mp4"
    half = records / f"{TMP_PREFIX}a1-s0.json.0123456789abcdef.json"
    final = records / "a1-s0.json"
    other = layout.panel("u") / "videos" / "pab"
    other.mkdir(parents=True)
    theirs = other / f"{TMP_PREFIX}b1-s0.mp4.k1lledwr1ter0002.mp4"
    for f in (fresh, half, final, theirs):
        f.write_text("x")
    with caplog.at_level(logging.WARNING, logger="pairflow.stages.jobs"):
        sweep_after(study, "t", ("records", "videos"))
    assert not fresh.exists() and not half.exists() and final.exists() and theirs.exists()
    assert sum("left by a writer killed in this job" in r.getMessage() for r in caplog.records) == 2


def test_timed_imports_is_about_zero_for_a_module_already_imported() -> None:
    assert "json" in sys.modules or __import__("json")
    assert 0 <= timed_imports(("json",)) < 0.05
