from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import generation_record

from pairflow.archive import evidence_files, promote, retire, verify_archive, verify_tree
from pairflow.errors import ArchiveError
from pairflow.identity import digest_bytes
from pairflow.records import write_record


def make_scratch(root: Path) -> Path:
    scratch = root / "scratch"
    record = generation_record("p", "a", 0, "control", 1, "v")
    record["video"].update(path="videos/control/a-s0.mp4", digest=digest_bytes(b"pixels"))
    write_record(scratch / "panels" / "p" / "records" / "control" / "a-s0.json", record)
    (scratch / "panels" / "p" / "videos" / "control").mkdir(parents=True)
    (scratch / "panels" / "p" / "videos" / "control" / "a-s0.mp4").write_bytes(b"pixels")
    (scratch / "study").mkdir(parents=True)
    (scratch / "study" / "table.md").write_text("| a |\n")
    (scratch / "logs").mkdir()
    (scratch / "logs" / "x.log").write_text("log line\n")
    return scratch


def snapshot(work: Path) -> Path:
    return work / json.loads((work / "latest.json").read_text())["snapshot"]


def writable(snap: Path) -> Path:
    """Undo the read-only bits of a promoted snapshot, so a test can damage it."""
    for p in [snap, *snap.rglob("*")]:
        p.chmod(p.stat().st_mode | 0o200)
    return snap


def test_promote_copies_evidence_not_pixels_and_verifies(tmp_path: Path) -> None:
    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    manifest = promote(scratch, work)
    snap = snapshot(work)
    assert not list(snap.rglob("*.mp4"))
    assert (snap / "study" / "table.md").read_text() == "| a |\n"
    assert "regenerate" in manifest and manifest["videos_on_scratch"]
    assert verify_tree(snap) == []


@pytest.mark.parametrize("damage, words", [
    (lambda s: (s / "study" / "table.md").write_text("| b |\n"), ["table.md: digest"]),
    (lambda s: (s / "logs" / "x.log").unlink(), ["x.log: missing"]),
    (lambda s: (s / "logs" / "new.log").write_text("?"), ["new.log: extra file"]),
])
def test_verify_names_flipped_missing_and_extra_files(tmp_path: Path, damage, words) -> None:  # type: ignore[no-untyped-def]
    promote(make_scratch(tmp_path), tmp_path / "work")
    snap = writable(snapshot(tmp_path / "work"))
    damage(snap)
    problems = verify_tree(snap)
    for w in words:
        assert any(w in p for p in problems), problems


def test_flipped_byte_in_archived_record_is_caught(tmp_path: Path) -> None:
    promote(make_scratch(tmp_path), tmp_path / "work")
    rec = next(writable(snapshot(tmp_path / "work")).rglob("a-s0.json"))
    data = bytearray(rec.read_bytes())
    data[len(data) // 2] ^= 0x01
    rec.write_bytes(bytes(data))
    assert any("a-s0.json" in p for p in verify_tree(snapshot(tmp_path / "work")))


def test_identical_promotion_is_a_noop_and_changes_make_a_new_snapshot(tmp_path: Path) -> None:
    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    first = promote(scratch, work)["root_digest"]
    assert promote(scratch, work)["root_digest"] == first
    assert len(list((work / "snapshots").iterdir())) == 1
    (scratch / "study" / "table.md").write_text("| c |\n")
    promote(scratch, work)
    assert len(list((work / "snapshots").iterdir())) == 2


def test_archived_bytes_are_immutable(tmp_path: Path) -> None:
    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    promote(scratch, work)
    snap = writable(snapshot(work))
    (snap / "study" / "table.md").write_text("tampered\n")
    with pytest.raises(ArchiveError, match="refusing to overwrite archived .*table.md: archived xxh3_128:.*new xxh3_128:"):
        promote(scratch, work)


def test_symlink_out_of_the_evidence_tree_is_refused(tmp_path: Path) -> None:
    scratch = make_scratch(tmp_path)
    secret = tmp_path / "secret.json"
    secret.write_text("{}")
    os.symlink(secret, scratch / "study" / "leak.json")
    with pytest.raises(ArchiveError, match="leak.json is a symlink to .*outside the evidence tree"):
        evidence_files(scratch)


def test_promoted_snapshot_is_read_only_and_follows_the_umask(tmp_path: Path) -> None:
    """Copies are created with the umask's mode (group-readable under 002), then every
    write bit of the complete snapshot is dropped."""
    old = os.umask(0o002)
    try:
        promote(make_scratch(tmp_path), tmp_path / "work")
    finally:
        os.umask(old)
    snap = snapshot(tmp_path / "work")
    modes = {p.relative_to(snap).as_posix(): p.stat().st_mode & 0o777 for p in [snap, *snap.rglob("*")]}
    assert modes["study/table.md"] == 0o444 and modes["archive.json"] == 0o444
    assert modes["study"] == 0o555 and modes["."] == 0o555
    assert (tmp_path / "work" / "latest.json").stat().st_mode & 0o777 == 0o664


def test_retired_snapshot_is_kept_reported_and_replaced_on_next_promotion(tmp_path: Path) -> None:
    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    promote(scratch, work)
    first = snapshot(work)
    with pytest.raises(ArchiveError, match="no snapshot 'nope' under .*; known: \\['" + first.name):
        retire(work, "nope", "x")
    with pytest.raises(ArchiveError, match="give the reason with --why"):
        retire(work, first.name, "  ")
    retire(work, first.name, "bad disk")
    assert first.is_dir() and not (work / "latest.json").exists()
    with pytest.raises(ArchiveError, match="already retired"):
        retire(work, first.name, "again")
    promote(scratch, work)  # the same evidence: a fresh snapshot id, never the retired one
    assert snapshot(work).name == f"{first.name}-2"
    report = verify_archive(work)
    assert report.ok and [n.kind for n in report.notes] == ["retired"] and "bad disk" in report.notes[0].message


def test_a_promotion_killed_mid_copy_leaves_no_temp_file_in_the_sealed_snapshot(tmp_path: Path) -> None:
    """SIGKILL during a copy leaves a ``.tmp-*`` half-copy in the unsealed snapshot; the
    next promotion finishes the snapshot and sweeps it before sealing, so no temp file
    is sealed read-only for ever."""
    import signal
    import subprocess
    import sys

    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    killer = ("import os, signal, sys\nfrom pathlib import Path\nimport pairflow.archive as a\n"
              "def half(src, dst):\n    Path(dst).write_bytes(Path(src).read_bytes()[:3])\n"
              "    os.kill(os.getpid(), signal.SIGKILL)\n"
              "a.shutil.copyfile = half\na.promote(Path(sys.argv[1]), Path(sys.argv[2]))\n")
    proc = subprocess.run([sys.executable, "-c", killer, str(scratch), str(work)], capture_output=True, timeout=120,
                          check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    (snap,) = (work / "snapshots").iterdir()
    left = [p for p in snap.rglob("*") if p.name.startswith(".tmp-")]
    assert left and not (snap / "archive.json").exists()
    assert verify_archive(work).lines()[0].startswith(f"snapshot: {snap}: incomplete snapshot")
    promote(scratch, work)
    assert snapshot(work) == snap and (snap / "archive.json").is_file()
    assert not [p for p in snap.rglob("*") if p.name.startswith(".tmp-")]
    assert verify_archive(work).lines() == []


def test_a_symlink_in_the_archive_is_a_problem(tmp_path: Path) -> None:
    promote(make_scratch(tmp_path), tmp_path / "work")
    work = tmp_path / "work"
    (work / "notes.json").symlink_to("/etc/hostname")
    report = verify_archive(work)
    assert not report.ok and report.lines() == [
        f"symlink: {work / 'notes.json'}: a symlink (to /etc/hostname); an archive holds regular files only. "
        "Replace it with the file itself or remove it"]
