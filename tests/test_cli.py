"""The command line: verify's dispatch, exit codes and messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pairflow.archive import promote
from pairflow.cli import main
from pairflow.records import write_record


def test_verify_without_a_recorded_config_names_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "panels").mkdir()
    assert main(["verify", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path}: no manifest records the study config" in err
    assert f"pairflow verify {tmp_path} --configfile config/config.yaml" in err


def test_half_written_snapshot_is_reported_as_such(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A promotion killed before ``archive.json`` leaves an incomplete snapshot: verify
    says so (and how to finish or retire it), and ``--json`` carries the same finding."""
    scratch, work = tmp_path / "scratch", tmp_path / "work"
    write_record(scratch / "panels/p/records/control/a-s0.json", {"video": {"path": "videos/control/a-s0.mp4", "digest": "xxh3_128:00"}})
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
