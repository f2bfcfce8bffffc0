"""vouch: what a job vouches for when it writes a manifest, and what the first plan after
it (the plan-time check, ``healing``, no memo yet) trusts of it. The tree is the planning
benchmark's finished study (valid records, 64-byte videos, manifests and the vouchers a
job writes beside them); the real jobs' vouchers are tested end to end in test_evidence."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pairflow.evidence import healing, verification
from pairflow.identity import digest_obj
from pairflow.layout import Layout
from pairflow.plan.config import StudySpec, study_from_raw
from pairflow.records import vouch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def tree(monkeypatch: pytest.MonkeyPatch) -> Iterator[StudySpec]:
    """A finished study of 2 panels x 3 prompts x 1 seed x 2 arms, vouched for."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from sections.common import scale_project, write_evidence  # benchmarks/: the plan section's factories

    proj = scale_project(2, 3)
    monkeypatch.chdir(proj)
    write_evidence(proj)
    yield study_from_raw(yaml.safe_load((proj / "config/config.yaml").read_text()), proj, source="test")
    shutil.rmtree(proj)


def _count(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Record every record parsed in full (self-digest, schema) and every file hashed."""
    calls: dict[str, list[str]] = {"parsed": [], "hashed": []}
    parse, digest = verification.parse_record, verification.digest_file
    monkeypatch.setattr(verification, "parse_record", lambda data, p: calls["parsed"].append(str(p)) or parse(data, p))
    for module in (verification, healing):  # healing hashes the videos its memo does not vouch for
        monkeypatch.setattr(module, "digest_file", lambda p: calls["hashed"].append(str(p)) or digest(p))
    return calls


def _candidate_files(paths: list[str]) -> list[str]:
    """Those of ``paths`` in a panel's per-candidate folders (records, videos, scores, timing)."""
    return [p for p in paths if any(f"/{kind}/" in p for kind in ("records", "videos", "scores", "timing"))]


def test_the_first_plan_trusts_what_the_jobs_vouched_for(tree: StudySpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """No memo yet: no record is parsed in full and no video re-hashed; without the
    vouchers the same check reads and hashes everything and finds the same (nothing)."""
    layout = Layout(tree.scratch)
    assert not layout.evidence_memo.exists()
    assert sorted(os.listdir(layout.checks / "vouched")) == sorted(
        [f"panels--{p}--{m}.json" for p in ("p000", "p001") for m in ("generation", "scores")]
        + ["study--timing.json"])
    calls = _count(monkeypatch)
    assert healing.heal_targets(tree, write=False) == {}
    assert calls["parsed"] == [] and _candidate_files(calls["hashed"]) == []  # the study's tables are hashed
    vouch.drop_vouchers(tree.scratch)
    assert healing.heal_targets(tree, write=False) == {}
    assert len(calls["parsed"]) == 12 * 3 and len([f for f in calls["hashed"] if f.endswith(".mp4")]) == 12


def test_an_edited_record_or_video_is_checked_in_full_despite_the_voucher(
        tree: StudySpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record whose bytes differ from the vouched digest is parsed (and its self-digest
    refuses it); a video whose (inode, size, mtime, ctime) changed is re-hashed."""
    pdir = Layout(tree.scratch).panel("p000")
    score = next((pdir / "scores").rglob("*.json"))
    text = score.read_text()
    st = score.stat()
    score.write_text(text.replace('"scores"', '"scorez"'))  # same size, mtime restored
    os.utime(score, ns=(st.st_atime_ns, st.st_mtime_ns))
    video = next((pdir / "videos").rglob("*.mp4"))
    video.write_bytes(b"\1" * 64)
    calls = _count(monkeypatch)
    heals = healing.heal_targets(tree, write=False)
    assert calls["parsed"] == [str(score)] and [f for f in calls["hashed"] if f.endswith(".mp4")] == [str(video)]
    assert sorted(heals) == [str(pdir / "generation.json"), str(pdir / "scores.json")]
    assert [p.kind for p in heals[str(pdir / "scores.json")]] == ["altered", "root"]
    assert [p.kind for p in heals[str(pdir / "generation.json")]] == ["altered"]


def test_a_voucher_counts_only_for_its_manifest_and_today_s_schemas(
        tree: StudySpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """A manifest written again (another root) or records checked against other schemas:
    the voucher vouches for nothing, every record of it is parsed in full."""
    layout = Layout(tree.scratch)
    gm = layout.generation_manifest("p000")
    old = json.loads(gm.read_text())
    body = {k: v for k, v in old.items() if k != "root_digest"}
    body["base"] = "../p000"  # the same folder, named otherwise: another root
    gm.write_text(json.dumps({**body, "root_digest": digest_obj(body)}))
    files = sorted((layout.panel("p000") / "records").rglob("*.json"))
    assert vouch.vouched(tree.scratch, gm) == ({}, {})
    calls = _count(monkeypatch)
    heals = healing.heal_targets(tree, write=False)
    assert sorted(calls["parsed"]) == [str(f) for f in files]
    assert list(heals) == [str(layout.study_manifest)]  # the study's manifest names the old root
    assert old["root_digest"] != json.loads(gm.read_text())["root_digest"]
    calls["parsed"].clear()
    monkeypatch.setattr(vouch, "schemas_digest", lambda: "xxh3_128:other")
    healing.heal_targets(tree, write=False)
    assert len(calls["parsed"]) == 12 * 3


def test_drop_memo_drops_the_vouchers(tree: StudySpec) -> None:
    """After a failed verify (``drop_memo``) the next plan checks and re-hashes everything."""
    layout = Layout(tree.scratch)
    healing.heal_targets(tree)
    assert layout.evidence_memo.is_file() and os.listdir(layout.checks / "vouched")
    healing.drop_memo(tree.scratch)
    assert not layout.evidence_memo.exists() and os.listdir(layout.checks / "vouched") == []


def test_a_video_that_does_not_match_its_record_is_not_vouched_for(tree: StudySpec) -> None:
    layout = Layout(tree.scratch)
    gm = layout.generation_manifest("p001")
    rec_path = next((layout.panel("p001") / "records").rglob("*.json"))
    rec: dict[str, Any] = json.loads(rec_path.read_text())
    (layout.panel("p001") / rec["video"]["path"]).write_bytes(b"\2" * 64)
    vouch.vouch(tree.scratch, gm, json.loads(gm.read_text()), {rec_path: rec})
    assert vouch.vouched(tree.scratch, gm)[1] == {}
