"""The claim card against its archive, offline (``evidence.cards``, through ``pairflow
verify``): the archived card digests to its seal, every generation record names it,
what the records say ran is read against what it declared; a snapshot without a card
is noted, not failed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import generation_record, small_config, write_config

from pairflow.cli import main
from pairflow.evidence.archive import promote
from pairflow.generation.provenance import provenance
from pairflow.layout import Layout
from pairflow.plan.candidates import Candidate, candidates, record_path
from pairflow.plan.config import StudySpec, load_study
from pairflow.records.store import write_record
from pairflow.report.card import sealed_card


@pytest.fixture
def study(tmp_path: Path, tiny_model: Path) -> StudySpec:
    """The test config (2 prompts x 1 seed, control + pab), its card sealed, and one
    generation record per candidate made under it with the study's own provenance."""
    write_config(tmp_path, small_config(tmp_path, tiny_model, scorers=["temporal_flickering"]))
    s = load_study(tmp_path / "config" / "config.yaml", tmp_path)
    card, created = sealed_card(s)
    assert created and card["sealed"] == "before generation"
    prov = provenance(s)
    for i, c in enumerate(candidates(s, s.panels[0])):
        rec = generation_record(c.key.panel, c.key.prompt_id, c.key.seed, c.arm.name, 1, f"v{i}")
        rec.update({k: prov[k] for k in ("code", "environment", "model", "encoder", "config_digest")},
                   card_seal=card["seal"])
        write_record(record_path(Layout(s.scratch), c), rec)
    return s


def _verify(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code = main(["verify", str(path), "--json"])
    return code, json.loads(capsys.readouterr().out)


def _rewrite(study: StudySpec, c: Candidate, drop: tuple[str, ...] = (), **fields: object) -> None:
    """Rewrite ``c``'s generation record with ``fields`` set and ``drop`` removed (a new self-digest)."""
    path = record_path(Layout(study.scratch), c)
    rec = json.loads(path.read_text())
    for key in ("record_digest", *drop):
        rec.pop(key)
    write_record(path, {**rec, **fields})


def _archived(study: StudySpec, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    """Promote the study's scratch tree to a fresh archive and verify it (``--json``)."""
    work = tmp_path / "work" / study.study
    promote(study.scratch, work)
    return _verify(work, capsys)


def _notes(report: dict, kind: str) -> list[str]:
    return [n["message"] for n in report["notes"] if n["kind"] == kind]


def test_an_archive_made_as_declared_verifies_as_an_archive_without_a_card(study: StudySpec, tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Every record made under the archived card and nothing deviating: verify's lines and
    summary are those of any archive (the card adds a line only when something is wrong or
    deviates), on the archive and on its snapshot alone."""
    work = tmp_path / "work" / study.study
    manifest = promote(study.scratch, work)
    assert "study/card.json" in manifest["files"]
    code, report = _verify(work, capsys)
    assert code == 0 and report["ok"] and report["problems"] == [] and report["notes"] == [], report
    assert main(["verify", str(work)]) == 0 and capsys.readouterr().out == f"verify {work}: OK\n"
    snap = next((work / "snapshots").iterdir())
    code, alone = _verify(snap, capsys)
    assert code == 0 and alone["notes"] == [] and alone["problems"] == []


def test_an_edited_archived_card_and_records_of_another_card_fail(study: StudySpec, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A card edited in the scratch tree after sealing is refused before it is archived
    (``promote`` archives what is there; verify then fails on it); records made under
    another card (the card was replaced after generation began) fail, each named."""
    layout = Layout(study.scratch)
    card = json.loads(layout.card.read_text())
    card["declared"]["stats_alpha_edited"] = True  # an edit that keeps the old seal
    layout.card.write_text(json.dumps(card))
    work = tmp_path / "work" / study.study
    promote(study.scratch, work)
    code, report = _verify(work, capsys)
    assert code == 1 and [p["kind"] for p in report["problems"]] == ["card"]
    assert "was altered after sealing" in report["problems"][0]["message"]

    layout.card.unlink()
    fresh, _ = sealed_card(study)  # sealed anew, after generation had begun: another seal
    assert fresh["sealed"] == "after generation had begun"
    shutil.rmtree(tmp_path / "work")
    promote(study.scratch, tmp_path / "work" / study.study)
    code, report = _verify(tmp_path / "work" / study.study, capsys)
    n = len(candidates(study, study.panels[0]))
    assert code == 1 and [p["kind"] for p in report["problems"]] == ["card"] * n
    assert all(f"not the archived card {fresh['seal']}" in p["message"] for p in report["problems"])


def test_what_the_archived_records_say_ran_is_a_deviation_note(study: StudySpec, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    layout = Layout(study.scratch)
    _rewrite(study, candidates(study, study.panels[0])[0], code={"commit": "0" * 40, "dirty": False})
    code, report = _archived(study, tmp_path, capsys)
    assert code == 0, report  # a deviation is stated, not a failure
    card = json.loads(layout.card.read_text())
    assert _notes(report, "deviation") == [
        f"as run: code.commit: declared {json.dumps(card['declared']['code']['commit'])}, found \"{'0' * 40}\" "
        f"in 1 record(s) (claim card {card['seal']})"]


def test_a_snapshot_without_a_card_verifies_as_before(study: StudySpec, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A study archived before the workflow sealed cards (no card, records without a seal)
    verifies as it always did: nothing about a card is added."""
    Layout(study.scratch).card.unlink()
    for c in candidates(study, study.panels[0]):
        _rewrite(study, c, drop=("card_seal",))
    code, report = _archived(study, tmp_path, capsys)
    assert code == 0 and report["notes"] == [] and report["problems"] == []


def test_records_older_than_the_card_are_counted_in_a_note(study: StudySpec, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    _rewrite(study, candidates(study, study.panels[0])[0], drop=("card_seal",))
    code, report = _archived(study, tmp_path, capsys)
    notes = _notes(report, "declared")
    assert code == 0 and len(notes) == 1 and notes[0].startswith("1 generation record(s) name no claim card")
