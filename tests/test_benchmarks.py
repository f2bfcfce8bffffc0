"""benchmarks: every section of benchmarks/run.py still runs (--quick), and the report
renders from what it wrote. Figures are not asserted: speed is measured, not tested."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

pytestmark = pytest.mark.slow


def test_every_section_runs_quick_and_the_report_renders(tmp_path: Path) -> None:
    import run  # benchmarks/run.py

    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--out", str(out),
                           "--scratch", str(tmp_path / "no-study")], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    results = json.loads(out.read_text())
    assert results["quick"] is True
    for name in run.SECTIONS:  # each wrote its figures, or why it could not run here
        assert isinstance(results[name], dict) and results[name]["section_s"] >= 0
        assert len(results[name]) > 1, name
    assert results["e2e"]["skipped"].startswith("no study run")
    for point in results["payload"]["points"].values():
        assert point["new_bytes"] < point["old_bytes"]
    plan = results["plan"]["points"]["quick"]
    assert plan["outputs"] > 0 and plan["evidence_files"] > 0
    assert plan["noop_rerun_planned_jobs"] == 0  # the finished tree it writes is valid evidence: nothing to redo
    archive = results["archive"]["points"]["quick"]
    assert archive["packed"]["files_per_panel"] == 3 and archive["plain"]["files"] > archive["packed"]["files"]
    assert archive["packed"]["bytes"] < archive["plain"]["bytes"]
    md = tmp_path / "B.md"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "render.py"), "--results", str(out), "--out", str(md),
                    "--gpu", str(tmp_path / "none.json")], check=True, capture_output=True, timeout=60)
    text = md.read_text()
    assert "quick mode" in text and "## Task payload" in text and "## Planning large studies" in text
    assert "## Archive: packed against plain snapshots" in text
