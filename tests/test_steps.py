"""steps: rule-script plumbing (logging to the rule's log)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import small_config

from pairflow.config import study_from_raw
from pairflow.steps import generation_rule

SCRIPT = """
import sys
from pathlib import Path
from pairflow.steps import log_to
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


def test_the_rule_that_regenerates_a_panel_follows_the_fleet_keys(tmp_path: Path, tiny_model: Path) -> None:
    """The archive's regenerate command and the stats' advice name the rule that runs."""
    def rule(**fleet: object) -> str:
        cfg = small_config(tmp_path, tiny_model, fleet={"cpu_workers": 1, "retries": 1, **fleet})
        return generation_rule(study_from_raw(cfg, tmp_path))

    assert rule() == "generate_score_panel"
    assert rule(panel_jobs="per-stage") == "generate_panel"
    assert rule(allocation="study") == "fleet_study"
