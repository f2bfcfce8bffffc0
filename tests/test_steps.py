"""steps: rule-script plumbing (logging to the rule's log) and the panel rules of each
``fleet.panel_jobs`` setting (a rule of the other setting is refused, by real Snakemake)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, copy_project, small_config

from pairflow.errors import ConfigError
from pairflow.layout import Layout
from pairflow.plan.config import study_from_raw
from pairflow.stages.steps import PANEL_RULES, check_panel_rules, generation_rule, study_manifests

SCRIPT = """
import sys
from pathlib import Path
from pairflow.stages.steps import log_to
log_to(Path(sys.argv[1]))
def deep():
    raise ValueError("the sheet has 3 columns")
deep()
"""


def test_an_uncaught_error_lands_in_the_rule_log(tmp_path: Path) -> None:
    """Snakemake points at the rule's log; the error and its traceback must be there."""
    log = tmp_path / "logs" / "rule.log"
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(log)], capture_output=True, text=True, timeout=60,
                         check=False)
    assert res.returncode == 1 and "ValueError: the sheet has 3 columns" in res.stderr  # console still has it
    text = log.read_text()
    assert "uncaught ValueError: the sheet has 3 columns" in text
    assert "Traceback (most recent call last)" in text and "in deep" in text


def test_a_ctrl_c_in_a_rule_script_goes_to_its_log_not_the_console(tmp_path: Path) -> None:
    """Regression (issue 41): a job stopped by Ctrl-C printed a KeyboardInterrupt traceback
    under Snakemake's one line. The log keeps it; the console gets nothing; exit 130."""
    log = tmp_path / "logs" / "rule.log"
    script = SCRIPT.replace('raise ValueError("the sheet has 3 columns")',
                            "import os, signal; os.kill(os.getpid(), signal.SIGINT)")
    import signal

    # SIGINT as a terminal's Ctrl-C delivers it: a background job (CI's run) inherits it ignored
    res = subprocess.run([sys.executable, "-c", script, str(log)], capture_output=True, text=True, timeout=60,
                         check=False, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert res.returncode in (130, -2) and res.stderr == "", res.stderr  # -2: killed by SIGINT, as Python exits
    text = log.read_text()
    assert "interrupted (SIGINT): this job stopped; a rerun resumes it" in text and "KeyboardInterrupt" in text


@pytest.mark.parametrize("mode, wrong, right", [("combined", "score_panel", "generate_score_panel"),
                                                ("combined", "generate_panel", "generate_score_panel"),
                                                ("per-stage", "generate_score_panel", "score_panel")])
def test_a_panel_rule_of_the_other_panel_jobs_setting_is_refused_naming_the_one_to_use(
        tmp_path: Path, mode: str, wrong: str, right: str) -> None:
    study = study_from_raw(small_config(tmp_path, tmp_path / "model", fleet={"panel_jobs": mode}), tmp_path)
    check_panel_rules(study, ["study_stats", right, *PANEL_RULES[mode]], "c.yaml")  # this setting's rules pass
    with pytest.raises(ConfigError) as e:
        check_panel_rules(study, ["study_stats", wrong], "c.yaml")
    assert f"rule {wrong} does not exist under fleet.panel_jobs: {mode} (c.yaml)" in str(e.value)
    assert f"name {right}" in str(e.value) or f"or {right}" in str(e.value)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project as shipped (Snakefile, workflow, the default config and its panels)."""
    dest = copy_project(tmp_path_factory.mktemp("steps-project"))
    shutil.copytree(ROOT / "config", dest / "config")
    cfg = yaml.safe_load((dest / "config" / "config.yaml").read_text())
    assert cfg["fleet"].get("panel_jobs", "combined") == "combined"
    cfg["fleet"]["panel_jobs"] = "per-stage"
    (dest / "per-stage.yaml").write_text(yaml.safe_dump(cfg))
    return dest


def dry_run(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("snakemake")
    return subprocess.run([str(exe), "-n", "--cores", "2", *args], cwd=project, capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.mark.parametrize("args", [("--forcerun", "score_panel"), ("--omit-from", "generate_panel"),
                                  ("score_panel",)])  # --until and --allowed-rules: read the same way
def test_snakemake_refuses_a_per_stage_rule_under_combined_with_the_setting_and_the_rule(
        project: Path, args: tuple[str, ...]) -> None:
    """Issue 24: `--forcerun score_panel` under the default `panel_jobs: combined` failed
    with "No rule to produce score_panel" (and --omit-from/--allowed-rules ignored it)."""
    proc = dry_run(project, *args)
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert f"rule {args[-1]} does not exist under fleet.panel_jobs: combined (config/config.yaml)" in out
    assert "name generate_score_panel instead" in out and "Traceback" not in out


def test_snakemake_plans_each_settings_own_panel_rules(project: Path) -> None:
    combined = dry_run(project, "--forcerun", "generate_score_panel")
    assert combined.returncode == 0, combined.stderr[-2000:]
    assert "rule generate_score_panel:" in combined.stdout
    per_stage = dry_run(project, "--configfile", "per-stage.yaml", "--forcerun", "score_panel")
    assert per_stage.returncode == 0, per_stage.stderr[-2000:]
    assert "rule score_panel:" in per_stage.stdout and "rule generate_panel:" in per_stage.stdout
    refused = dry_run(project, "--configfile", "per-stage.yaml", "--forcerun", "generate_score_panel")
    assert refused.returncode == 3
    assert ("rule generate_score_panel does not exist under fleet.panel_jobs: per-stage (per-stage.yaml), only "
            "under fleet.panel_jobs: combined; name generate_panel (generation) or score_panel (scoring) instead"
            in refused.stdout + refused.stderr)


def test_study_manifests_names_every_panels_manifests_and_the_timed_pass(tmp_path: Path) -> None:
    """What rule study_stats binds (its script calls steps only)."""
    cfg = small_config(tmp_path, tmp_path / "model")
    (tmp_path / "config" / "panels" / "u.tsv").write_text("prompt_id\tprompt\nb1\ta lighthouse\n")
    cfg["panels"]["u"] = {"sheet": str(tmp_path / "config" / "panels" / "u.tsv"), "seeds": [3]}
    study = study_from_raw(cfg, tmp_path)
    layout = Layout(study.scratch)
    assert study_manifests(study, tmp_path / "timing.json") == {
        "generation:t": layout.generation_manifest("t"), "scores:t": layout.score_manifest("t"),
        "generation:u": layout.generation_manifest("u"), "scores:u": layout.score_manifest("u"),
        "timing": tmp_path / "timing.json"}


def test_the_rule_that_regenerates_a_panel_follows_the_fleet_keys(tmp_path: Path, tiny_model: Path) -> None:
    """The archive's regenerate command and the stats' advice name the rule that runs."""
    def rule(**fleet: object) -> str:
        cfg = small_config(tmp_path, tiny_model, fleet={"cpu_workers": 1, "retries": 1, **fleet})
        return generation_rule(study_from_raw(cfg, tmp_path))

    assert rule() == "generate_score_panel"
    assert rule(panel_jobs="per-stage") == "generate_panel"
    assert rule(allocation="study") == "fleet_study"
