"""Deployment as a Snakemake module: what `snakedeploy deploy-workflow` writes (the config
copied into a project of its own, a workflow/Snakefile that uses this workflow as a
module) plans the default study with every output under the deploying project."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))

MODULE = """configfile: "config/config.yaml"


module pairflow:
    snakefile:
        "{snakefile}"
    config:
        config


use rule * from pairflow as pairflow_*
"""
"""The deploying Snakefile as snakedeploy writes it, with a local path in place of
``github("<owner>/<repo>", path="Snakefile", tag=...)``."""


def deploy(dest: Path) -> Path:
    """A deploying project as snakedeploy leaves it: config/ copied, workflow/Snakefile."""
    shutil.copytree(ROOT / "config", dest / "config", ignore=shutil.ignore_patterns("README.md"))
    (dest / "workflow").mkdir(parents=True)
    (dest / "workflow" / "Snakefile").write_text(MODULE.format(snakefile=ROOT / "Snakefile"))
    return dest


def test_module_deployment_plans_the_default_study_under_the_deploying_project(tmp_path: Path) -> None:
    """Regression (issue 26): relative config paths were rooted at workflow.basedir (the
    deploying project's workflow/ folder), so a deployed dry run looked for
    <deployed>/workflow/config/panels/smoke.tsv; the package path and PAIRFLOW_HOME came from
    it too. Paths now resolve against the working directory, the checkout from the rules'
    own place."""
    dest = deploy(tmp_path / "my-study")
    # No PYTHONPATH: the workflow must put its own checkout's package first by itself.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    dry = subprocess.run([SNAKEMAKE, "--profile", str(ROOT / "profiles" / "local"), "-n"], cwd=dest, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    out = dry.stdout + dry.stderr
    assert dry.returncode == 0, out[-4000:]
    for job in ("pairflow_build_tiny_model", "pairflow_check_arms", "pairflow_timed_pass", "pairflow_gallery",
                "pairflow_archive"):
        assert job in out
    assert out.count("rule pairflow_generate_score_panel:") == 2  # smoke and motion
    outputs = [line.split(":", 1)[1].strip() for line in out.splitlines() if line.strip().startswith("output:")]
    assert outputs and all(not o.startswith("/") for o in ", ".join(outputs).split(", ")), outputs
    assert "results/scratch/panels/smoke/generation.json" in out and "resources/tiny-wan" in out
    assert str(ROOT) not in "\n".join(outputs)
    # nothing was written into the deployed checkout or beside the deploying Snakefile
    assert not (dest / "workflow" / "config").exists() and not (dest / "workflow" / "results").exists()
