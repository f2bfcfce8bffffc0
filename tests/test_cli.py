"""cli and the Snakefile's entry: every entry point gives the same answer about a config,
``--configfile`` means that file alone, and verify's dispatch, exit codes and messages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, copy_project, generation_record

from pairflow.archive import promote
from pairflow.cli import main
from pairflow.records import write_record

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
PAIRFLOW = str(Path(sys.executable).with_name("pairflow"))


def project_with(tmp_path: Path, mutate) -> tuple[Path, Path]:  # type: ignore[no-untyped-def]
    project = copy_project(tmp_path / "p")
    (project / "config" / "panels").mkdir(parents=True)
    for sheet in ("smoke.tsv", "motion.tsv"):
        (project / "config" / "panels" / sheet).write_text((ROOT / "config" / "panels" / sheet).read_text())
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    mutate(cfg)
    path = project / "config" / "one.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return project, path


def test_check_config_and_snakemake_give_the_same_one_line_answer(tmp_path: Path) -> None:
    """A cache parameter of the wrong type used to pass check-config and fail after the
    model loaded with a bare TypeError; now check-config refuses it up front, and a run
    refuses it in its arms' check (rule check_arms, a job of its own so that planning
    never imports diffusers) before any generation starts, naming arm and key."""
    project, path = project_with(tmp_path, lambda c: c["arms"]["fbcache"]["cache"]["params"].update(threshold="high"))
    check = subprocess.run([PAIRFLOW, "check-config", str(path)], capture_output=True, text=True, timeout=120,
                           check=False)
    run = subprocess.run([SNAKEMAKE, "--cores", "1", "--configfile", "config/one.yaml"], cwd=project,
                         capture_output=True, text=True, timeout=300, check=False)
    want = "key 'arms/fbcache/cache/params/threshold' is 'high' (str); FirstBlockCacheConfig expects float"
    assert check.returncode == 3 and want in check.stderr, check.stderr
    log = (project / "results" / "scratch" / "logs" / "check_arms.log").read_text()
    assert run.returncode != 0 and want in run.stdout + run.stderr and want in log
    assert "jsonschema" not in run.stdout + run.stderr
    assert not (project / "results" / "scratch" / "panels").exists()  # no generation job started


def test_configfile_replaces_the_default_config(tmp_path: Path) -> None:
    """A config with one panel plans that panel only (Snakemake's default merge kept the other)."""
    def one_panel(c: dict) -> None:
        del c["panels"]["motion"]
        c["storage"] = {"scratch": "elsewhere/scratch", "work": "elsewhere/work"}

    project, _ = project_with(tmp_path, one_panel)
    dry = subprocess.run([SNAKEMAKE, "-n", "--configfile", "config/one.yaml"], cwd=project, capture_output=True,
                         text=True, timeout=300, check=False)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "panels/smoke/generation.json" in dry.stdout and "elsewhere/scratch" in dry.stdout
    assert "motion" not in dry.stdout and "results/scratch" not in dry.stdout

def test_verify_without_a_recorded_config_names_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "panels").mkdir()
    assert main(["verify", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert f"{tmp_path}: no manifest records the study config" in err
    assert f"pairflow verify {tmp_path} --configfile config/config.yaml" in err


def test_half_written_snapshot_is_reported_as_such(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A promotion killed before ``archive.json`` leaves an incomplete snapshot: verify
    says so (and how to finish or retire it), and ``--json`` carries the same finding."""
    scratch, work = tmp_path / "scratch", tmp_path / "work"
    record = generation_record("p", "a", 0, "control", 1, "v")
    record["video"]["path"] = "videos/control/a-s0.mp4"
    write_record(scratch / "panels/p/records/control/a-s0.json", record)
    promote(scratch, work)
    half = work / "snapshots" / "0123456789abcdef"
    (half / "study").mkdir(parents=True)
    (half / "study" / "table.md").write_text("| a |\n")
    assert main(["verify", str(work)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        (f"snapshot: {half}: incomplete snapshot: no archive.json (promotion was interrupted); rerun the workflow to "
        f"finish it, or retire it: pairflow archive retire {half.name} --why \"...\""),
        f"verify {work}: 1 problem(s)"]
    assert main(["verify", str(work), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and [p["kind"] for p in report["problems"]] == ["snapshot"]
    snap = work / json.loads((work / "latest.json").read_text())["snapshot"]
    assert main(["verify", str(snap)]) == 0 and capsys.readouterr().out == f"verify {snap}: OK\n"


def test_version_help_and_exit_codes_follow_conventions(capsys: pytest.CaptureFixture[str]) -> None:
    """--version; every subcommand and argument has help; the top-level help has examples
    and no raw RST; a refused input (3) is told apart from argparse's usage error (2)."""
    from pairflow.cli import EXIT_REFUSED, EXIT_USAGE, _parser

    with pytest.raises(SystemExit) as ex:
        main(["--version"])
    assert ex.value.code == 0 and capsys.readouterr().out.startswith("pairflow 0.")
    parser = _parser()
    text = parser.format_help()
    assert "examples:" in text and "exit codes" in text and "``" not in text
    sub = next(a for a in parser._actions if a.choices and "verify" in a.choices)
    helps = {a.dest: a.help for a in sub._choices_actions}
    for name, cmd in sub.choices.items():
        assert helps.get(name) and cmd.description, name
        for action in cmd._actions:
            assert action.help, (name, action.dest)
    with pytest.raises(SystemExit) as ex:
        main(["verify"])  # missing PATH: argparse's usage error
    assert ex.value.code == EXIT_USAGE != EXIT_REFUSED
