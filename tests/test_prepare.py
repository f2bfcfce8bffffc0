"""The preparing job (issue 37): the run's first heavy job imports torch once for the
model's build, the arms' check and the calibration; rules check_arms and calibrate keep
their outputs and rerun triggers and copy from its cache without importing torch."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import copy_study, run_snakemake, small_config

from pairflow.budget.calibrate import FORMAT, device_kind
from pairflow.errors import ConfigError
from pairflow.layout import Layout
from pairflow.plan.config import study_from_raw
from pairflow.stages import steps
from pairflow.stages.calibworker import arms_entry_key, prepare

LIGHT = """
import json, sys
from pathlib import Path
import yaml
from pairflow.plan.config import study_from_raw
from pairflow.stages.steps import calibrate_study, check_arms
cfg, root, arms_out, table_out, key = sys.argv[1:]
study = study_from_raw(yaml.safe_load(Path(cfg).read_text()), Path(root))
check_arms(study, Path(arms_out))        # rule check_arms's step
calibrate_study(study, Path(table_out), key)  # rule calibrate's step
print(json.dumps(sorted(m for m in ("torch", "diffusers", "transformers") if m in sys.modules)))
"""


def test_the_light_rules_copy_the_prepared_check_and_table_without_importing_torch(tmp_path: Path) -> None:
    """With the preparing job's entries in the cache, rules check_arms and calibrate write
    exactly those bytes and import neither torch nor diffusers; the table's entry is
    taken (a forced rerun of calibrate measures afresh), the check's stays."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "model_index.json").write_text('{"_class_name": "WanPipeline"}\n')
    cfg = small_config(tmp_path, model)
    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    study = study_from_raw(copy.deepcopy(cfg), tmp_path)
    at = Layout(study.scratch)
    arms_bytes = b'{\n "check": "arms",\n "passed": true\n}\n'
    entry = at.prepared_arms(arms_entry_key(study))
    entry.parent.mkdir(parents=True)
    entry.write_bytes(arms_bytes)
    key = "xxh3_128:" + "ab" * 16
    # measured on this machine and its device kind, where rule calibrate's job runs (local site)
    table = {"kind": "calibration", "format": FORMAT, "key": key, "measured_in": "build_tiny_model",
             "device": device_kind(), "made": {"host": os.uname().nodename}}
    at.prepared_calibration(key).write_text(json.dumps(table))
    out = subprocess.run([sys.executable, "-c", LIGHT, str(cfg_path), str(tmp_path), str(at.arms_check),
                          str(at.calibration(key)), key], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []  # no torch, diffusers, transformers
    assert at.arms_check.read_bytes() == arms_bytes and entry.is_file()
    assert json.loads(at.calibration(key).read_text()) == table and not at.prepared_calibration(key).exists()
    # another model file's bytes name another entry: the check is not copied
    (model / "model_index.json").write_text('{"_class_name": "WanPipeline", "v": 2}\n')
    assert at.prepared_arms(arms_entry_key(study)) != entry


def test_a_bad_arm_leaves_the_build_job_green_and_fails_rule_check_arms_with_its_message(
        tiny_model: Path, tmp_path: Path) -> None:
    """The build job (not strict) logs the failing check and caches nothing; rule
    check_arms then checks itself and raises today's ConfigError."""
    cfg = small_config(tmp_path, tiny_model)
    cfg["arms"]["fb"] = {"cache": {"class": "FirstBlockCachConfig", "params": {"threshold": 0.1}}}
    study = study_from_raw(cfg, tmp_path)
    at = Layout(study.scratch)
    assert prepare(study, "build_tiny_model", strict=False) is False
    assert not at.prepared_arms(arms_entry_key(study)).exists()
    with pytest.raises(ConfigError, match=r"arms/fb/cache/class.*did you mean 'FirstBlockCacheConfig'"):
        steps.check_arms(study, at.arms_check)
    assert not at.arms_check.exists()
    del cfg["arms"]["fb"]
    good = study_from_raw(cfg, tmp_path)
    steps.check_arms(good, at.arms_check)  # the preparing job itself: checks, caches, copies
    assert at.arms_check.read_bytes() == at.prepared_arms(arms_entry_key(good)).read_bytes()
    assert json.loads(at.arms_check.read_text())["passed"] is True


@pytest.mark.slow
def test_one_cold_process_prepares_and_a_forced_check_regenerates_nothing(finished_study: Path,
                                                                          tmp_path: Path) -> None:
    """In the session's finished study (its model prebuilt, so rule check_arms is the
    preparing job; fleet.calibrate on) the table was measured in check_arms's process and
    rule calibrate took it; forcing check_arms alone copies the check again and runs
    nothing else."""
    project = copy_study(finished_study, tmp_path / "proj")
    scratch = project / "results" / "scratch"
    tables = list((scratch / "calibration").glob("*.json"))
    assert len(tables) == 1
    table = json.loads(tables[0].read_text())
    assert table["measured_in"] == "check_arms" and table["import"]["s"] > 0.5
    assert table["device"] == device_kind() and "device" not in table["keyed_by"]  # recorded, not keyed
    assert "measured by this run's preparing job (check_arms)" in (scratch / "logs" / "calibrate.log").read_text()
    records = {p: p.stat().st_mtime_ns for p in (scratch / "panels").rglob("*.json")}
    out = run_snakemake(project, "--forcerun", "check_arms")
    assert "rule check_arms:" in out
    for rule in ("calibrate", "estimate", "generate_score_panel", "timed_pass", "study_stats"):
        assert f"rule {rule}:" not in out, rule
    assert "arms checked by this run's preparing job: copying" in (scratch / "logs" / "check_arms.log").read_text()
    assert {p: p.stat().st_mtime_ns for p in (scratch / "panels").rglob("*.json")} == records
