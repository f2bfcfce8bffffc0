"""Evidence that proves itself: real faults injected into copies of the session's one
finished tiny study (``conftest.finished_study``, built once through the real Snakemake,
Parsl, diffusers, ffmpeg and pyiqa: an arm of every kind, panels t and u). Each test asserts the exact ``pairflow verify`` lines and exit code, then that a
plain ``snakemake --profile profiles/local`` restores a tree that verifies."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import copy_study, study_config

from pairflow.cli import main
from pairflow.records.store import read_record, write_record

pytestmark = pytest.mark.slow
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
SCRATCH = "results/scratch"


def snakemake(project: Path, *args: str, check: bool = True) -> str:
    proc = subprocess.run([SNAKEMAKE, "--profile", "profiles/local", "--configfile", "config/config.yaml", *args],
                          cwd=project, capture_output=True, text=True, timeout=900, check=False)
    if check and proc.returncode:
        raise AssertionError(f"snakemake failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
    return proc.stdout + proc.stderr


def verify(path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    rc = main(["verify", str(path), *args])
    return rc, capsys.readouterr().out.splitlines()


@pytest.fixture
def study(finished_study: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of the finished study (relative storage paths: a complete study of
    its own); the test runs from inside it."""
    project = copy_study(finished_study, tmp_path / "proj")
    assert study_config(project)["storage"]["scratch"] == SCRATCH
    monkeypatch.chdir(project)
    return project


def count(project: Path, panel: str | None = None) -> int:
    """Candidates the study's config implies, of ``panel`` or of every panel."""
    from pairflow.plan.candidates import candidates
    from pairflow.plan.config import load_study

    spec = load_study(project / "config/config.yaml", project)
    return sum(len(candidates(spec, p)) for p in spec.panels if panel in (None, p.name))


def pairs(project: Path) -> int:
    """(panel, prompt, seed) pairs of every panel: what the timed pass samples (timing.pairs: all)."""
    return count(project) // len(study_config(project)["arms"])


def test_finished_study_verifies_and_a_rerun_does_nothing(study: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scratch = study / SCRATCH
    assert verify(scratch, capsys) == (0, [f"verify {scratch}: OK"])
    rc, out = verify(scratch, capsys, "--json")
    assert rc == 0 and json.loads("\n".join(out)) == {"path": str(scratch), "ok": True, "problems": [], "notes": []}
    assert verify(study / "results/work/test", capsys) == (0, [f"verify {study / 'results/work/test'}: OK"])
    assert "Nothing to be done" in snakemake(study)


def test_deleted_score_record_edited_study_manifest_and_temp_file(study: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Three faults at once: a score record deleted, a panel root edited in the study
    manifest, a half-written record left by a killed write."""
    scratch = study / SCRATCH
    score = scratch / "panels/t/scores/pab/a2-s0.json"
    score.unlink()
    manifest = scratch / "study/manifest.json"
    m = json.loads(manifest.read_text())
    real = m["panel_roots"]["scores:t"]
    m["panel_roots"]["scores:t"] = "xxh3_128:" + "0" * 32
    manifest.write_text(json.dumps(m, indent=1, sort_keys=True) + "\n")
    temp = scratch / "panels/t/scores/control/.tmp-a1-s0.json.k1ll3d.json"
    temp.write_text('{"kind": "sco')
    os.utime(temp, (time.time() - 3600, time.time() - 3600))
    rc, out = verify(scratch, capsys)
    assert rc == 1
    assert out == [
        f"missing: {score}: record is missing",
        f"altered: {manifest}: root digest mismatch: the manifest itself was altered",
        f"root: {manifest}: panel root scores:t is xxh3_128:{'0' * 32}, the current manifest's is {real}",
        f"note: temp: {temp}: left by an interrupted write; safe to delete",
        f"verify {scratch}: 3 problem(s) (1 note(s))",
    ]
    rc, out = verify(scratch, capsys, "--json")
    report = json.loads("\n".join(out))
    assert rc == 1 and not report["ok"] and [p["kind"] for p in report["problems"]] == ["missing", "altered", "root"]
    log = snakemake(study)
    assert "Nothing to be done" not in log
    assert f"score t: {count(study, 't')} candidates, 1 to score" in (scratch / "logs/generate-score/t.log").read_text()
    assert not temp.exists()  # swept by the scoring job
    assert verify(scratch, capsys) == (0, [f"verify {scratch}: OK"])


def test_deleted_panel_manifest_is_rebuilt(study: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scratch = study / SCRATCH
    gm = scratch / "panels/t/generation.json"
    root = json.loads(gm.read_text())["root_digest"]
    gm.unlink()
    rc, out = verify(scratch, capsys)
    assert rc == 1
    assert out == [
        f"missing: {gm}: manifest is missing",
        (f"root: {scratch / 'panels/t/stats.json'}: computed from panel root generation:t {root}, the current "
         "manifest's is None"),
        f"root: {scratch / 'study/manifest.json'}: panel root generation:t is {root}, the current manifest's is None",
        (f"root: {scratch / 'study/stats.json'}: computed from panel root generation:t {root}, the current manifest's "
         "is None"),
        f"verify {scratch}: 4 problem(s)"]
    snakemake(study)
    n = count(study, "t")
    assert f"generate t: {n} candidates, {n} complete, 0 to run" in (scratch / "logs/generate-score/t.log").read_text()
    assert verify(scratch, capsys) == (0, [f"verify {scratch}: OK"])


def test_stale_links_missing_record_and_failure_record_heal(study: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A generation record sealed again with other run-specific fields (what a forced
    regeneration of a complete candidate leaves): the score and timing records computed
    from the old one must not count. Plus a record lost with its task's failure record
    (the 23-of-24 case). A plain rerun regenerates, rescores and re-times exactly those."""
    scratch = study / SCRATCH
    pdir = scratch / "panels/t"
    path = pdir / "records/pab/a1-s0.json"
    old = read_record(path)
    body = {k: v for k, v in old.items() if k != "record_digest"}
    body["timing"] = {**body["timing"], "generate_s": body["timing"]["generate_s"] + 1.0}
    new = write_record(path, body)["record_digest"]
    lost = pdir / "records/control/a2-s0.json"
    cid = read_record(lost)["candidate"]["candidate_id"]
    lost.unlink()
    failure = pdir / "failures/generate/control/a2-s0.json"
    write_record(failure, {"candidate_id": cid, "panel": "t", "arm": "control", "prompt_id": "a2", "seed": 0,
                           "kind": "failure", "label": "generate t", "class": "host_oom_or_killed",
                           "exception": "WorkerLost", "message": "worker lost", "attempts": 2, "time": 0.0,
                           "slot": "node1"})
    rc, out = verify(scratch, capsys)
    assert (rc, out) == (1, [
        f"missing: {lost}: record is missing",
        (f"link: {pdir / 'scores/pab/a1-s0.json'}: names generation record {old['record_digest']}, the current one "
        f"is {new}"),
        (f"link: {pdir / 'timing/pab/a1-s0.json'}: names generation record {old['record_digest']}, the current one "
        f"is {new}"),
        (f"root: {pdir / 'generation.json'}: its root does not match its records: records/pab/a1-s0.json changed "
        "after it was written"),
        (f"failure: {failure}: generate t failed [host_oom_or_killed] (candidate_id {cid}, arm control, prompt_id a2, "
        "seed 0, slot node1, attempts 2): worker lost"),
        f"verify {scratch}: 5 problem(s)"])
    snakemake(study)
    n, total = count(study, "t"), count(study)
    assert f"generate t: {n} candidates, {n - 1} complete, 1 to run" in (scratch / "logs/generate-score/t.log").read_text()
    assert f"score t: {n} candidates, 2 to score" in (scratch / "logs/generate-score/t.log").read_text()
    assert (f"timed pass: {total} candidates ({pairs(study)} pairs sampled), {total - 2} already timed, 2 to time"
            in (scratch / "logs/timing.log").read_text())
    assert not failure.exists()
    assert verify(scratch, capsys) == (0, [f"verify {scratch}: OK"])


def test_timed_run_with_other_frames_is_listed_and_retimed(study: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A timing record (validly sealed) whose run computed other frames than the bulk run."""
    scratch = study / SCRATCH
    path = scratch / "panels/t/timing/pab/a1-s0.json"
    record = read_record(path)
    record["matches_bulk_frames"] = False
    write_record(path, {k: v for k, v in record.items() if k != "record_digest"})
    rc, out = verify(scratch, capsys)
    timing = scratch / "study/timing.json"
    assert (rc, out) == (1, [
        (f"root: {timing}: its root does not match its records: panels/t/timing/pab/a1-s0.json changed after it "
        "was written"),
        f"frames: {path}: the timed run computed other frames than the bulk run; its latency is not reported",
        f"verify {scratch}: 2 problem(s)"])
    snakemake(study)
    total = count(study)
    assert (f"timed pass: {total} candidates ({pairs(study)} pairs sampled), {total - 1} already timed, 1 to time"
            in (scratch / "logs/timing.log").read_text())
    assert read_record(path)["matches_bulk_frames"] is True
    assert verify(scratch, capsys) == (0, [f"verify {scratch}: OK"])


def test_damaged_snapshot_is_retired_and_a_new_one_promoted(study: Path, capsys: pytest.CaptureFixture[str]) -> None:
    work = study / "results/work/test"
    snap = work / json.loads((work / "latest.json").read_text())["snapshot"]
    # A loose file of the snapshot (one over archive.CHUNKED_OVER is stored in chunks, not
    # as itself): the study table where it is small enough, else the utilisation report.
    rel = next(r for r in ("study/table.md", "study/utilisation.md") if (snap / r).is_file())
    table = snap / rel
    assert not table.stat().st_mode & 0o222 and not snap.stat().st_mode & 0o222  # promoted snapshots: read-only
    os.chmod(table.parent, 0o755)
    os.chmod(table, 0o644)
    table.write_text(table.read_text() + "tampered\n")
    rc, out = verify(work, capsys)
    from pairflow.identity import digest_file

    retire_hint = f"(snapshot {snap.name}; retire it with pairflow archive retire {snap.name} --why \"...\")"
    listed = json.loads((snap / "archive.json").read_text())["files"][rel]
    listers = [snap / "archive.json"] + [snap / "study/manifest.json" for _ in range(
        rel in json.loads((snap / "study/manifest.json").read_text())["files"])]
    assert (rc, out) == (1, [
        f"altered: {table}: digest {digest_file(table)} differs from {listed} listed in {m} " + retire_hint
        for m in listers] + [f"verify {work}: {len(listers)} problem(s)"])
    assert main(["archive", "retire", snap.name, "--why", "table.md edited by hand"]) == 0
    capsys.readouterr()
    note = read_record(work / "retired" / f"{snap.name}.json")
    assert note["why"] == "table.md edited by hand" and note["found"] and note["by"]
    assert not (work / "latest.json").exists() and not (study / SCRATCH / "study/archived.json").exists()
    rc, out = verify(work, capsys)
    retired = f"note: retired: {snap}: retired {note['at']} by {note['by']}: table.md edited by hand"
    assert (rc, out) == (1, [
        (f"latest: {work / 'latest.json'}: missing: every snapshot is retired; rerun the workflow (snakemake "
        "--profile profiles/local) to promote the evidence into a new snapshot"),
        retired, f"verify {work}: 1 problem(s) (1 note(s))"])
    snakemake(study)
    new = json.loads((work / "latest.json").read_text())["snapshot"]
    assert new != f"snapshots/{snap.name}" and (work / new / "archive.json").is_file()
    assert verify(work, capsys) == (0, [retired, f"verify {work}: OK (1 note(s))"])


def test_driver_killed_during_forced_regeneration_heals_on_plain_rerun(study: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """SIGKILL the whole run once Snakemake has deleted the panel manifest for a forced
    regeneration and a candidate is being regenerated; a plain rerun must complete it."""
    scratch = study / SCRATCH
    gm = scratch / "panels/t/generation.json"
    before = {p: p.stat().st_mtime_ns for p in (scratch / "panels/t/records").rglob("*.json")}
    proc = subprocess.Popen([SNAKEMAKE, "--profile", "profiles/local", "--configfile", "config/config.yaml",
                             "--forcerun", "generate_score_panel"], cwd=study, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        end = time.monotonic() + 300
        while time.monotonic() < end and gm.exists():
            time.sleep(0.1)
        assert not gm.exists(), "snakemake never started the forced job"
    finally:
        _kill_all(study, proc.pid)
        proc.wait(timeout=60)
    rc, out = verify(scratch, capsys)
    assert rc == 1 and f"missing: {gm}: manifest is missing" in out
    snakemake(study, "--unlock")
    log = snakemake(study)
    assert "Nothing to be done" not in log
    assert verify(scratch, capsys) == (0, [f"verify {scratch}: OK"])
    assert verify(study / "results/work/test", capsys)[0] == 0
    assert before  # the records existed before the kill


def _kill_all(project: Path, pgid: int) -> None:
    """SIGKILL the run's process group and any process whose command line names the
    project (Parsl's worker pools run in their own sessions)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for cmd in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(project).encode() in cmd.read_bytes():
                os.kill(int(cmd.parent.name), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def test_changed_filter_chain_makes_exactly_the_lossy_records_stale(study: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The recipe digest is the digest of the argv that runs: editing the filter graph
    makes every video written with the old graph stale (to be regenerated), and the
    generation job sees the same."""
    from pairflow.media import recipe
    from pairflow.plan.candidates import candidates
    from pairflow.plan.config import load_study
    from pairflow.stages.generation import complete_record

    spec = load_study(study / "config/config.yaml")
    old = recipe.recipe_digest(spec.encoder, spec.generation.fps)
    monkeypatch.setattr(recipe, "COLOUR_FILTER", recipe.COLOUR_FILTER.replace("range=tv", "range=pc"))
    new = recipe.recipe_digest(spec.encoder, spec.generation.fps)
    assert new != old and "range=pc" in " ".join(recipe.recipe(spec.encoder, spec.generation.fps)["argv"])
    scratch = study / SCRATCH
    rc, out = verify(scratch, capsys)
    recs = sorted((scratch / "panels/t/records").rglob("*.json"))
    assert rc == 1 and len(recs) == count(study, "t") > 0
    for r in recs:
        assert f"stale: {r}: written with encoder recipe {old}, the recipe that runs now is {new}" in out
    for panel in spec.panels:
        assert all(complete_record(spec, c, new) is None for c in candidates(spec, panel))
        assert all(complete_record(spec, c, old) is not None for c in candidates(spec, panel))


def test_statistics_refuse_a_score_record_of_another_generation(study: Path) -> None:
    """Stats load score and timing records only when they name the current generation record."""
    from pairflow.errors import IntegrityError
    from pairflow.plan.config import load_study
    from pairflow.stages.steps import panel_records

    spec = load_study(study / "config/config.yaml")
    assert len(panel_records(spec, ["t"])[1]) == count(study, "t")
    path = study / SCRATCH / "panels/t/records/control/a2-s0.json"
    body = {k: v for k, v in read_record(path).items() if k != "record_digest"}
    body["worker"] = {**body["worker"], "pid": -1}
    current = write_record(path, body)["record_digest"]
    with pytest.raises(IntegrityError, match=f"scores/control/a2-s0.json: names generation record .*, the current one "
                       f"is {current} .*records/control/a2-s0.json.; it was computed from another generation"):
        panel_records(spec, ["t"])


def test_the_plan_time_check_rereads_only_panels_changed_since_it_found_them_clean(
        study: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan-time check remembers the panels it found clean (their records' contents,
    their videos' inode, size, mtime and ctime, and what the config implies for them) and
    skips them while nothing there changes; a record rewritten in place, even at the same
    size, is read and healed."""
    from pairflow.evidence import healing, verification
    from pairflow.plan.config import load_study

    s = load_study(study / "config/config.yaml")
    memo = s.scratch / "checks/evidence.json"
    assert healing.heal_targets(s) == {} and memo.is_file()
    assert set(json.loads(memo.read_text())["panels"]) == set(study_config(study)["panels"])
    reads: list[Path] = []
    real_parse = verification.parse_record  # what checks a record's self-digest and schema
    monkeypatch.setattr(verification, "parse_record", lambda data, p: reads.append(Path(p)) or real_parse(data, p))
    assert healing.heal_targets(s) == {} and reads == []  # nothing changed: nothing read
    score = s.scratch / "panels/t/scores/pab/a2-s0.json"
    text = score.read_text()
    score.write_text(text.replace('"scores"', '"scorez"'))  # same size, new content
    heals = healing.heal_targets(s)
    assert score in reads and list(heals) == [str(s.scratch / "panels/t/scores.json")]
    assert [p.kind for p in heals[str(s.scratch / "panels/t/scores.json")]] == ["altered", "root"]
    assert "t" not in json.loads(memo.read_text())["panels"]  # not clean: checked in full next time
    # verify (deep) never trusts the memo
    score.write_text(text)
    reads.clear()
    assert verification.check_results(s, deep=True).ok and score in reads


def test_the_first_plan_after_a_run_trusts_the_records_its_jobs_vouched_for(
        study: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The panel and timing jobs vouch for the records they checked when they write their
    manifests (pairflow.records.vouch): with no memo, the plan parses none of them in full. (The
    copy has new inodes, so its videos are re-hashed: a voucher signs them by stat.)"""
    from pairflow.evidence import healing, verification
    from pairflow.plan.config import load_study

    s = load_study(study / "config/config.yaml")
    vouched = sorted(os.listdir(s.scratch / "checks/vouched"))
    assert vouched == sorted([*(f"panels--{p}--{m}.json" for p in study_config(study)["panels"]
                                for m in ("generation", "scores")), "study--timing.json"])
    (s.scratch / "checks/evidence.json").unlink(missing_ok=True)  # none yet: the run planned an empty tree
    reads: list[str] = []
    real_parse = verification.parse_record
    monkeypatch.setattr(verification, "parse_record", lambda data, p: reads.append(str(p)) or real_parse(data, p))
    assert healing.heal_targets(s) == {} and reads == []


def _same_size_edit(path: Path, offset: int, data: bytes) -> None:
    """Overwrite bytes in place and restore the file's mtime (as ``touch -r`` would)."""
    st = path.stat()
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def test_same_size_edits_with_restored_mtimes_are_healed_by_a_plain_rerun(
        study: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A byte flipped in a video and a record edited in place, both with size and mtime
    restored: the plan-time check signs records and videos by their ctime too (set by
    the kernel on every write), so a plain rerun heals what verify reports."""
    scratch = study / SCRATCH
    assert "Nothing to be done" in snakemake(study)  # the plan-time memo now holds the clean tree
    video = scratch / "panels/t/videos/pab/a1-s0.mp4"
    old = video.read_bytes()
    _same_size_edit(video, len(old) // 2, bytes([old[len(old) // 2] ^ 0xFF]))
    score = scratch / "panels/t/scores/control/a2-s0.json"
    text = score.read_bytes()
    _same_size_edit(score, text.index(b'"scores"'), b'"scorez"')
    rc, out = verify(scratch, capsys)
    assert rc == 1 and [line.split(":")[0] for line in out[:-1]] == ["altered", "altered", "root"], out
    log = snakemake(study)
    assert "Nothing to be done" not in log
    assert verify(scratch, capsys) == (0, [f"verify {scratch}: OK"])
    assert video.read_bytes() == old  # the same stack regenerates the same bytes
    assert "Nothing to be done" in snakemake(study)


def test_video_rot_under_an_unchanged_stat_is_the_documented_bound(
        study: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Bytes that change with no write through the filesystem (media bit rot: inode,
    size, mtime and ctime unchanged) are the bound: the plan trusts the stat it saw when
    it last hashed the video, ``pairflow verify`` re-hashes and, finding the problem,
    drops the memo, after which a plain rerun re-hashes every video and heals it."""
    scratch = study / SCRATCH
    assert "Nothing to be done" in snakemake(study)
    memo_path = scratch / "checks/evidence.json"
    video = scratch / "panels/t/videos/control/a1-s0.mp4"
    old = video.read_bytes()
    _same_size_edit(video, 100, bytes([old[100] ^ 0x01]))
    # Simulate rot the kernel never saw: the memo's stat for this video is the new one.
    from pairflow.records.vouch import stat_key as _stat_key

    memo = json.loads(memo_path.read_text())
    memo["videos"]["t"]["videos/control/a1-s0.mp4"][0] = _stat_key(video.stat())
    sig = memo["panels"]["t"]["files"]
    from pairflow.evidence.healing import PANEL_READS, _signature

    pdir = scratch / "panels/t"
    memo["panels"]["t"]["files"] = _signature((pdir / "generation.json", pdir / "scores.json"),
                                              tuple(pdir / k for k in PANEL_READS))
    assert memo["panels"]["t"]["files"] != sig
    memo_path.write_text(json.dumps(memo, sort_keys=True) + "\n")
    assert "Nothing to be done" in snakemake(study)  # the bound: the plan cannot see it
    rc, out = verify(scratch, capsys)
    assert rc == 1 and out[0].startswith(f"altered: {video}: digest ") and not memo_path.exists()
    assert "Nothing to be done" not in snakemake(study)
    assert verify(scratch, capsys) == (0, [f"verify {scratch}: OK"]) and video.read_bytes() == old


def test_arms_check_rerun_with_missing_evidence_runs_the_panel_in_the_same_run(
        study: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The arms' check key changes (arm order in the YAML) while a record is missing:
    check_arms reruns and so does the panel job (not only the check), in one run."""
    import yaml

    scratch = study / SCRATCH
    cfg_path = study / "config/config.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["arms"] = dict(reversed(list(cfg["arms"].items())))
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    (scratch / "panels/t/records/control/a1-s0.json").unlink()
    log = snakemake(study)
    assert "rule check_arms:" in log and "rule generate_score_panel:" in log
    n = count(study, "t")
    assert f"generate t: {n} candidates, {n - 1} complete, 1 to run" in (scratch / "logs/generate-score/t.log").read_text()
    assert verify(scratch, capsys) == (0, [f"verify {scratch}: OK"])
    assert "Nothing to be done" in snakemake(study)


def test_a_dry_run_writes_nothing_and_shows_the_healing_jobs(study: Path) -> None:
    """``snakemake -n`` over a damaged tree: no heal stamp, no memo, no file changed in
    the tree; the plan lists the panel job a real run will redo."""
    scratch = study / SCRATCH
    (scratch / "panels/t/scores/pab/a2-s0.json").unlink()
    before = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in study.rglob("*")
              if p.is_file() and ".snakemake" not in p.parts}
    for flags in (["-n"], ["--dry-run"], ["-np"], ["--summary"]):
        log = snakemake(study, *flags)
        after = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in study.rglob("*")
                 if p.is_file() and ".snakemake" not in p.parts}
        assert after == before, (flags, set(after) ^ set(before))
        if flags != ["--summary"]:
            assert "rule generate_score_panel:" in log and "a run recomputes" in log, log[-3000:]
    assert not (scratch / "heal").exists()


def test_symlinks_in_the_results_tree_are_refused_and_the_record_healed(
        study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A record replaced by a symlink to a copy outside ``results/`` and a stray symlink
    to /etc/hostname: verify refuses both (evidence is a regular file in its tree, as the
    archive demands); a plain rerun regenerates the record and names the stray link with
    the command that removes it."""
    scratch = study / SCRATCH
    record = scratch / "panels/t/records/pab/a2-s0.json"
    copy = tmp_path / "outside" / "a2-s0.json"
    copy.parent.mkdir()
    shutil.copy(record, copy)
    record.unlink()
    record.symlink_to(copy)
    stray = scratch / "panels/t/records/pab/hostname.json"
    stray.symlink_to("/etc/hostname")
    study_link = scratch / "study/notes.md"
    study_link.symlink_to("/etc/hostname")
    rc, out = verify(scratch, capsys)
    assert rc == 1 and out == [
        (f"altered: {record}: a symlink (to {copy}), not a record; evidence must be a regular file inside its "
         "tree. Delete the link and rerun the panel, which regenerates it"),
        (f"extra: {stray}: a symlink (to /etc/hostname) not implied by the config (no current candidate is named "
         f"so); remove it: rm {stray}"),
        (f"symlink: {study_link}: a symlink (to /etc/hostname); evidence is a regular file inside its tree and the "
         f"archive refuses links. Replace it with the file itself or remove it: rm {study_link}"),
        f"verify {scratch}: 3 problem(s)"], out
    log = snakemake(study, check=False)
    assert "Nothing to be done" not in log
    assert not record.is_symlink() and record.is_file()  # regenerated in place of the link
    stray.unlink()
    study_link.unlink()
    snakemake(study)
    assert verify(scratch, capsys) == (0, [f"verify {scratch}: OK"])


def test_a_linked_panel_folder_and_a_stray_link_are_named_by_the_plain_run_as_verify_names_them(
        study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 40: a panel folder replaced by a symlink to a byte-identical copy outside the
    tree, and a stray symlink to a system file at another panel's top level, used to pass
    a plain run silently ("Nothing to be done") while verify and the archive refused them.
    The plain run names each, as verify does and with its fix, as it names an extra file."""
    scratch = study / SCRATCH
    panel = scratch / "panels/u"
    copy = tmp_path / "outside" / "u"
    shutil.copytree(panel, copy, symlinks=True)
    shutil.rmtree(panel)
    panel.symlink_to(copy)
    stray = scratch / "panels/t/hostname"
    stray.symlink_to("/etc/hostname")
    want = [f"symlink: {stray}: a symlink (to /etc/hostname); evidence is a regular file inside its tree and the "
            f"archive refuses links. Replace it with the file itself or remove it: rm {stray}",
            f"symlink: {panel}: a symlink (to {copy}); evidence is a regular file inside its tree and the archive "
            f"refuses links. Replace it with the folder itself or remove it: rm {panel}"]
    assert verify(scratch, capsys) == (1, [*want, f"verify {scratch}: 2 problem(s)"])
    for _ in range(2):  # the first plan after the change and one whose memo found the panels clean
        log = snakemake(study)
        for line in want:
            assert f"PairFlow: no rerun heals this, pairflow verify fails until it is removed: {line}" in log, log
    dry = snakemake(study, "-n")
    assert all(line in dry for line in want), dry
    stray.unlink()
    panel.unlink()
    shutil.copytree(copy, panel, symlinks=True)
    log = snakemake(study)
    assert "no rerun heals" not in log, log
    assert verify(scratch, capsys) == (0, [f"verify {scratch}: OK"])


def test_outputs_of_candidates_no_longer_in_the_config_are_extra(study: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A prompt removed from the sheet: after the rerun its records, videos, scores and
    timing records (every arm) are listed as extra, each with the command removing it."""
    scratch = study / SCRATCH
    sheet = study / "config/panels/t.tsv"
    sheet.write_text("".join(line for line in sheet.read_text().splitlines(keepends=True) if not line.startswith("a2")))
    log = snakemake(study)
    rc, out = verify(scratch, capsys)
    pdir = scratch / "panels/t"
    cfg = study_config(study)
    gone = sorted(pdir / kind / arm / f"a2-s{seed}.{'mp4' if kind == 'videos' else 'json'}"
                  for kind in ("records", "videos", "scores", "timing") for arm in cfg["arms"]
                  for seed in cfg["panels"]["t"]["seeds"])
    assert rc == 1 and out == [
        f"extra: {f}: not implied by the config (no current candidate is named so); remove it: rm {f}"
        for f in gone] + [f"verify {scratch}: {len(gone)} problem(s)"], out
    # the plain run names them too (the first ones, and counts the rest)
    named = [line for line in out[:-1] if f"PairFlow: no rerun heals this, pairflow verify fails until it is removed: "
             f"{line}" in log]
    assert named and (len(named) == len(gone) or f"PairFlow: {len(gone) - len(named)} more such problem(s)" in log)
    for f in gone:
        f.unlink()
    assert verify(scratch, capsys) == (0, [f"verify {scratch}: OK"])
