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
from pairflow.stages.jobs import clear_failures, describe, sweep_panel, timed_imports


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


def test_timed_imports_is_about_zero_for_a_module_already_imported() -> None:
    assert "json" in sys.modules or __import__("json")
    assert 0 <= timed_imports(("json",)) < 0.05
