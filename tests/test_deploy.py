"""Deployment as a Snakemake module: what `snakedeploy deploy-workflow` writes (the config
and profiles copied into a project of its own, a workflow/Snakefile that uses this workflow
as a module) plans the default study with every output under the deploying project, and
the light rules stay local there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))

LOCAL_RULES = {"build_tiny_model", "check_arms", "estimate", "study_stats", "plots", "gallery", "track",
               "utilisation", "archive", "card", "repeatability"}
"""The rules that run where Snakemake runs, never as scheduler jobs (each says ``localrule: True``)."""

MODULE = """configfile: "config/config.yaml"


module pairflow:
    snakefile:
        {snakefile}
    config:
        config


use rule * from pairflow{prefix}

# What Snakemake will run where it runs: the set its own localrules check reads.
print("LOCAL RULES:", " ".join(sorted(workflow._localrules)))
"""
"""The deploying Snakefile as snakedeploy writes it (``{snakefile}``: the module's source,
``{prefix}``: docs/your-own-study.md's `` as pairflow_*`` or none), plus one line that prints the rules
Snakemake marked local."""


def deploy(dest: Path, snakefile: str, prefix: str = " as pairflow_*") -> Path:
    """A deploying project as snakedeploy leaves it: config/ and profiles/ copied, workflow/Snakefile."""
    shutil.copytree(ROOT / "config", dest / "config", ignore=shutil.ignore_patterns("README.md"))
    shutil.copytree(ROOT / "profiles", dest / "profiles")
    (dest / "workflow").mkdir(parents=True)
    (dest / "workflow" / "Snakefile").write_text(MODULE.format(snakefile=snakefile, prefix=prefix))
    return dest


def dry_run(project: Path, env: dict[str, str] | None = None) -> str:
    """``snakemake --profile profiles/local -n`` in ``project`` without PYTHONPATH (the workflow
    must find its own package); its output, after checking it planned with exit 0."""
    env = {k: v for k, v in (env or os.environ).items() if k != "PYTHONPATH"}
    dry = subprocess.run([SNAKEMAKE, "--profile", "profiles/local", "-n"], cwd=project, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    out = dry.stdout + dry.stderr
    assert dry.returncode == 0, out[-4000:]
    return out


def local_rules(out: str) -> set[str]:
    """The rule names the deploying Snakefile's ``LOCAL RULES:`` line printed."""
    return {name for line in out.splitlines() if line.startswith("LOCAL RULES:") for name in line.split()[2:]}


def test_module_deployment_plans_the_default_study_under_the_deploying_project(tmp_path: Path) -> None:
    """Regression (issue 26): relative config paths were rooted at workflow.basedir (the
    deploying project's workflow/ folder), so a deployed dry run looked for
    <deployed>/workflow/config/panels/smoke.tsv; the package path and PAIRFLOW_HOME came from
    it too. Paths now resolve against the working directory, the checkout from the rules'
    own place. Regression (issue 41): a global ``localrules:`` list names the unprefixed
    rules, so under the docs' ``use rule * from pairflow as pairflow_*`` Snakemake warned
    "localrules directive specifies rules that are not present" and dropped all ten: on a
    cluster they would have been submitted as jobs. Each rule now says ``localrule: True``,
    which the prefix keeps."""
    dest = deploy(tmp_path / "my-study", f'"{ROOT / "Snakefile"}"')
    out = dry_run(dest)
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
    assert "localrules directive specifies rules that are not present" not in out
    assert local_rules(out) == {f"pairflow_{r}" for r in LOCAL_RULES}


def snapshot(repo: Path, tag: str) -> Path:
    """A git repository of this checkout's files as they are now (tracked and untracked,
    not ignored), committed and tagged ``tag``: what a user deploys by URL and tag."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, repo / name)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "snapshot"], cwd=repo, check=True)
    subprocess.run([*git, "tag", tag], cwd=repo, check=True)
    return repo


def test_snakedeploy_from_the_repository_url_plans_with_the_local_rules_local(tmp_path: Path) -> None:
    """The form docs/your-own-study.md gives, ``snakedeploy deploy-workflow <repo URL> my-study --tag <tag>``,
    writes ``github("<owner>/<repo>", path="Snakefile", tag="<tag>")`` and
    ``use rule * from <repo>``: Snakemake reads the workflow from its git cache of the
    repository. Here the cache holds a clone of this checkout (no network), so the dry run
    reads every rule file, script and schema through Snakemake's hosted-git source, as a
    deployment from GitHub does."""
    repo = snapshot(tmp_path / "src" / "pairflow", "v-test")
    cache = tmp_path / "cache"
    clone = cache / "snakemake" / "snakemake" / "source-cache" / "snakemake-git-cache" / "github.com" / "example"
    clone.mkdir(parents=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(clone / "pairflow")], check=True)
    dest = deploy(tmp_path / "my-study", 'github("example/pairflow", path="Snakefile", tag="v-test")', prefix="")
    out = dry_run(dest, {**os.environ, "XDG_CACHE_HOME": str(cache)})
    assert "Cloning" not in out and "Fetching" not in out  # read from the cache, not the network
    assert out.count("rule generate_score_panel:") == 2 and "rule timed_pass:" in out
    assert "localrules directive specifies rules that are not present" not in out
    assert local_rules(out) == LOCAL_RULES
