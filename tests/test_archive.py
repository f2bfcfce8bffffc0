from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from conftest import generation_record

from pairflow.cli import main
from pairflow.errors import ArchiveError, IntegrityError
from pairflow.evidence.archive import (
    CHUNKED_OVER,
    INDEXED_OVER,
    evidence_files,
    load_manifest,
    pack_group,
    promote,
    read_file,
    retire,
    show,
    verify_archive,
    verify_tree,
)
from pairflow.identity import canonical_json, digest_bytes, digest_file
from pairflow.records import packs
from pairflow.records.store import build_manifest, read_record, write_record

ROOT = Path(__file__).resolve().parents[1]


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


def add_candidate(scratch: Path, panel: str, prompt: str) -> dict:  # type: ignore[type-arg]
    """One more candidate's generation record in ``panel``."""
    record = generation_record(panel, prompt, 0, "control", 1, "v")
    record["video"].update(path=f"videos/control/{prompt}-s0.mp4", digest=digest_bytes(b"pixels"))
    return write_record(scratch / "panels" / panel / "records" / "control" / f"{prompt}-s0.json", record)


def pack_of(work: Path, group: str = "panels/p/generation") -> Path:
    snap = snapshot(work)
    manifest = json.loads((snap / "archive.json").read_text())
    return work / "packs" / (manifest["packs"][group].split(":")[1] + ".pfpack")


def test_promote_copies_evidence_not_pixels_and_verifies(tmp_path: Path) -> None:
    """Study-level files stay plain; the panel's records go into a pack shared under
    work/packs; the root digest covers the records' digests, not the pack."""
    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    manifest = promote(scratch, work)
    snap = snapshot(work)
    assert not list(snap.rglob("*.mp4")) and not list(snap.rglob("a-s0.json"))
    assert (snap / "study" / "table.md").read_text() == "| a |\n"
    assert "regenerate" in manifest and manifest["videos_on_scratch"] == 1
    record = scratch / "panels/p/records/control/a-s0.json"
    rel = "panels/p/records/control/a-s0.json"
    assert manifest["packs"] == {"panels/p/generation": packs.files_root({rel: digest_file(record)})}
    pack = pack_of(work)
    assert pack.parent == work / "packs" and pack.name == manifest["packs"]["panels/p/generation"][9:] + ".pfpack"
    assert packs.Pack(pack).read(rel) == record.read_bytes()
    assert verify_tree(snap) == [] and verify_archive(work).ok


def test_root_digest_is_over_the_records_not_the_packing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same evidence packed with another block size: other pack bytes, the same root
    digest and snapshot id."""
    scratch = make_scratch(tmp_path)
    for i in range(6):
        add_candidate(scratch, "p", f"b{i}")
    first = promote(scratch, tmp_path / "w1")
    monkeypatch.setattr(packs, "BLOCK", 100)
    second = promote(scratch, tmp_path / "w2")
    assert first["root_digest"] == second["root_digest"] and snapshot(tmp_path / "w1").name == snapshot(tmp_path / "w2").name
    one, two = pack_of(tmp_path / "w1"), pack_of(tmp_path / "w2")
    assert one.name == two.name and one.read_bytes() != two.read_bytes()
    assert len(packs.Pack(one).blocks) == 1 and len(packs.Pack(two).blocks) == 7
    assert verify_archive(tmp_path / "w2").ok


def test_one_rerun_panel_adds_only_its_packs(tmp_path: Path) -> None:
    """Content addressed across snapshots: after a change to panel q, the new snapshot
    shares panel p's packs and stores q's changed pack only."""
    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    add_candidate(scratch, "q", "c")
    promote(scratch, work)
    before = {p.name for p in (work / "packs").iterdir()}
    first = json.loads((snapshot(work) / "archive.json").read_text())
    add_candidate(scratch, "q", "d")
    promote(scratch, work)
    second = json.loads((snapshot(work) / "archive.json").read_text())
    added = {p.name for p in (work / "packs").iterdir()} - before
    assert len(list((work / "snapshots").iterdir())) == 2
    assert second["packs"]["panels/p/generation"] == first["packs"]["panels/p/generation"]
    assert second["packing"]["files"] == {}  # every pack under its root's own name
    assert added == {second["packs"]["panels/q/generation"][9:] + ".pfpack"}
    assert verify_archive(work).ok


def test_record_is_shown_by_record_digest_or_candidate_id(tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    other = add_candidate(scratch, "p", "b")
    promote(scratch, work)
    snap = snapshot(work)
    stored = (scratch / "panels/p/records/control/b-s0.json").read_bytes()
    assert show(snap, other["record_digest"]) == stored
    assert show(snap, other["candidate"]["candidate_id"].split(":")[1]) == stored
    assert main(["archive", "show", str(snap), other["record_digest"]]) == 0
    assert capsysbinary.readouterr().out == stored
    with pytest.raises(ArchiveError, match="no record with digest or candidate id xxh3_128:00"):
        show(snap, "xxh3_128:00")


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.chmod(0o644)
    path.write_bytes(bytes(data))


def test_flipped_byte_in_a_pack_names_the_pack_and_the_first_failing_record(tmp_path: Path) -> None:
    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    promote(scratch, work)
    pack = pack_of(work)
    flip(pack, pack.stat().st_size - 20)  # inside the last block's deflate stream
    problems = verify_tree(snapshot(work))
    assert any(p.startswith(f"{pack}: first failing record panels/p/records/control/a-s0.json: block 0")
               for p in problems), problems
    report = verify_archive(work)
    assert not report.ok and any(p.file == str(pack) for p in report.problems)
    with pytest.raises(IntegrityError, match="member panels/p/records/control/a-s0.json"):
        packs.Pack(pack).read("panels/p/records/control/a-s0.json")


def test_truncated_pack_names_the_pack_and_the_first_record_it_lost(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The index comes first, so a pack cut short still says which records it lost."""
    monkeypatch.setattr(packs, "BLOCK", 4000)
    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    for i in range(6):
        add_candidate(scratch, "p", f"b{i:02d}")
    promote(scratch, work)
    pack = pack_of(work)
    index = packs.Pack(pack)
    pack.chmod(0o644)
    os.truncate(pack, index.data_start + index.blocks[2][0] + 10)  # into the third block
    lost = min((m for m in index.members.values() if m.block == 2), key=lambda m: m.start).path
    problems = verify_tree(snapshot(work))
    assert any(p.startswith(f"{pack}: first failing record {lost}: block 2 is cut off") and "(truncated)" in p
               and "more member(s) fail" in p for p in problems), problems
    assert packs.Pack(pack).read(min(index.members)) == (scratch / min(index.members)).read_bytes()


def rewrite_index(pack: Path, change) -> None:  # type: ignore[no-untyped-def]
    """Replace a pack's index (its first gzip member) by ``change(index)``, keeping its blocks."""
    with open(pack, "rb") as fh:
        index, start = packs._read_index(fh, pack)
    index = change(index)
    blocks = pack.read_bytes()[start:]
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    pack.chmod(0o644)
    pack.write_bytes(c.compress(canonical_json(index) + b"\n") + c.flush() + blocks)


def test_an_index_that_disagrees_with_its_pack_is_refused(tmp_path: Path) -> None:
    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    promote(scratch, work)
    pack, rel = pack_of(work), "panels/p/records/control/a-s0.json"

    def other_digest(index):  # type: ignore[no-untyped-def]
        index["members"][0][1] = digest_bytes(b"other")
        return index

    rewrite_index(pack, other_digest)  # the index's root no longer covers its members
    with pytest.raises(IntegrityError, match="index disagrees with its pack: root .* is not the digest"):
        packs.Pack(pack)
    assert any("index disagrees with its pack" in p for p in verify_tree(snapshot(work)))

    def past_the_blocks(index):  # type: ignore[no-untyped-def]
        index["members"][0][2] = 5
        index["root"] = packs.files_root({e[0]: e[1] for e in index["members"]})
        return index

    rewrite_index(pack, past_the_blocks)
    with pytest.raises(IntegrityError, match=f"index disagrees with its pack: member {rel} lies in block 5"):
        packs.Pack(pack)

    def consistent_lie(index):  # type: ignore[no-untyped-def]
        index["members"][0][2] = 0
        index["root"] = packs.files_root({e[0]: e[1] for e in index["members"]})
        return index

    rewrite_index(pack, consistent_lie)  # a self-consistent index over other bytes than the blocks hold
    with pytest.raises(IntegrityError, match=f"member {rel}: bytes 0..[0-9]+ of block 0 hash to"):
        packs.Pack(pack).read(rel)
    problems = verify_tree(snapshot(work))
    assert any(p.startswith(f"{pack}: first failing record {rel}") for p in problems), problems
    assert any("holds files with root" in p for p in problems)


def test_a_damaged_pack_is_kept_and_its_files_packed_again_after_retirement(tmp_path: Path) -> None:
    """Refuse, don't repair: the damaged pack stays, the retired snapshot keeps listing
    it, and the next promotion packs the same files beside it as <root>-2."""
    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    promote(scratch, work)
    first, pack = snapshot(work), pack_of(work)
    flip(pack, pack.stat().st_size - 20)
    retire(work, first.name, "bit rot in a pack")
    manifest = promote(scratch, work)
    again = work / "packs" / pack.name.replace(".pfpack", "-2.pfpack")
    assert pack.exists() and packs.Pack(again).verify() == []
    assert manifest["packing"]["files"] == {"panels/p/generation": f"../../packs/{again.name}"}
    assert snapshot(work).name == f"{first.name}-2" and manifest["packs"] == json.loads(
        (first / "archive.json").read_text())["packs"]
    report = verify_archive(work)
    assert report.ok and [n.kind for n in report.notes] == ["retired"]


KILL_PACKING = """
import os, signal, sys
from pathlib import Path
from pairflow.evidence.archive import promote

fsync = os.fsync
def stop_before_fsync_of_a_pack(fd):  # the kill lands with the pack's bytes written, before fsync and rename
    if "/packs/.tmp-" in os.readlink(f"/proc/self/fd/{fd}"):
        os.kill(os.getpid(), signal.SIGSTOP)
    fsync(fd)
os.fsync = stop_before_fsync_of_a_pack
promote(Path(sys.argv[1]), Path(sys.argv[2]))
"""


def test_a_kill_during_packing_leaves_no_pack_under_its_final_name(tmp_path: Path) -> None:
    """SIGKILL a promotion while it writes a pack (stopped at the pack's fsync, so the
    kill lands mid-write every time): only a .tmp- file is left (verify notes it), no
    pack under a final name; the next promotion completes and sweeps the temp."""
    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    proc = subprocess.Popen([sys.executable, "-c", KILL_PACKING, str(scratch), str(work)],
                            env={**os.environ, "PYTHONPATH": str(ROOT / "workflow")})
    deadline = time.time() + 60
    while Path(f"/proc/{proc.pid}/stat").read_text().split(")")[-1].split()[0] != "T":
        assert proc.poll() is None and time.time() < deadline, "the promotion never reached a pack's fsync"
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    left = sorted((work / "packs").iterdir())
    assert len(left) == 1 and left[0].name.startswith(".tmp-") and left[0].stat().st_size > 0
    report = verify_archive(work)
    assert [n.kind for n in report.notes] == ["temp"] and [p.kind for p in report.problems] == ["snapshot", "latest"], report.lines()
    time.sleep(1.1)
    promote(scratch, work)
    assert [p.suffix for p in (work / "packs").iterdir()] == [".pfpack"]
    assert verify_archive(work).ok


def test_snapshot_written_before_packing_still_verifies_and_is_reused(tmp_path: Path) -> None:
    """An unpacked snapshot (as earlier versions wrote it: every file plain, videos listed
    in archive.json) verifies, is caught when altered, is shown from, and promoting the
    same evidence again keeps it rather than writing packs."""
    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    files = evidence_files(scratch)
    digests = {f.relative_to(scratch).as_posix(): digest_file(f) for f in files}
    from pairflow.identity import digest_obj

    snap = work / "snapshots" / digest_obj(digests).split(":", 1)[1][:16]
    for rel in digests:
        (snap / rel).parent.mkdir(parents=True, exist_ok=True)
        (snap / rel).write_bytes((scratch / rel).read_bytes())
    manifest = build_manifest("archive", snap, [snap / r for r in digests],
                              {"videos_on_scratch": {"panels/p/videos/control/a-s0.mp4": digest_bytes(b"pixels")}})
    (snap / "archive.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    (work / "latest.json").write_text(json.dumps({"snapshot": f"snapshots/{snap.name}",
                                                  "root_digest": manifest["root_digest"]}))
    assert verify_tree(snap) == [] and verify_archive(work).ok
    rec = read_record(snap / "panels/p/records/control/a-s0.json")
    assert show(snap, rec["record_digest"]) == (snap / "panels/p/records/control/a-s0.json").read_bytes()
    assert promote(scratch, work)["root_digest"] == manifest["root_digest"]
    assert not (work / "packs").exists() and verify_archive(work).ok
    flip(snap / "panels/p/records/control/a-s0.json", 40)
    assert any("a-s0.json" in p for p in verify_tree(snap))


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
    killer = ("import os, signal, sys\nfrom pathlib import Path\nimport pairflow.evidence.archive as a\n"
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


def big_table(scratch: Path, changed: range = range(0)) -> bytes:
    """A study-level file over CHUNKED_OVER, one entry per line (as the study manifests
    are written); the lines in ``changed`` differ, as after one panel's rerun."""
    lines = [f"panels/p{i:04d}/timing/control/a-s0.json\txxh3_128:{'f' if i in changed else '0'}{i:031x}\n"
             for i in range(2000)]
    data = "".join(lines).encode()
    (scratch / "study" / "big.tsv").write_bytes(data)
    return data


def test_large_study_level_file_is_stored_in_chunks_and_reassembled(tmp_path: Path) -> None:
    """Over CHUNKED_OVER a study-level file is not copied plain: its content-defined chunks
    go into a chunk pack, archive.json keeps the file's own digest, and verify and
    read_file reassemble it."""
    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    data = big_table(scratch)
    assert len(data) > CHUNKED_OVER
    manifest = promote(scratch, work)
    snap = snapshot(work)
    assert not (snap / "study" / "big.tsv").exists()
    assert manifest["files"]["study/big.tsv"] == digest_bytes(data)
    entry = manifest["packing"]["chunks"]["study/big.tsv"]  # type: ignore[typeddict-item]
    chunks = listed_chunks(snap, entry)
    assert len(chunks) > INDEXED_OVER and b"".join(packs.split_chunks(data)) == data
    assert set(entry) == {"index"} and 0 < len(entry["index"]) < len(chunks) // 10  # archive.json: the index's digests
    assert read_file(snap, "study/big.tsv") == data
    assert verify_tree(snap) == [] and verify_archive(work).ok


def listed_chunks(snap: Path, entry: list[str] | dict[str, list[str]]) -> list[str]:
    """The chunk digests of one ``packing.chunks`` entry, through its index when it has one
    (read here from the chunk packs, apart from archive.read_chunked)."""
    if isinstance(entry, list):
        return entry
    members: dict[str, bytes] = {}
    for rel in json.loads((snap / "archive.json").read_text())["packing"]["chunk_packs"]:
        members.update((m.path, data) for m, data in packs.Pack(Path(os.path.normpath(snap / rel))).items()
                       if isinstance(data, bytes))
    return b"".join(members[h] for h in entry["index"]).decode().split()


def test_repromotion_shares_the_unchanged_chunks(tmp_path: Path) -> None:
    """One panel's lines changed: the new snapshot stores only the chunks around them."""
    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    big_table(scratch)
    first = promote(scratch, work)
    data = big_table(scratch, changed=range(1000, 1031))
    second = promote(scratch, work)
    snaps = [next(d for d in (work / "snapshots").iterdir()
                  if json.loads((d / "archive.json").read_text())["root_digest"] == m["root_digest"])
             for m in (first, second)]
    entries = [m["packing"]["chunks"]["study/big.tsv"] for m in (first, second)]  # type: ignore[typeddict-item]
    old, new = (listed_chunks(d, e) for d, e in zip(snaps, entries, strict=True))
    assert len(set(new) - set(old)) <= 3 < len(new)
    index_added = set(entries[1]["index"]) - set(entries[0]["index"])
    assert 1 <= len(index_added) <= 2 < len(entries[1]["index"])  # a run of changed chunks: one index chunk or two
    [added] = set(second["packing"]["chunk_packs"]) - set(first["packing"]["chunk_packs"])  # type: ignore[typeddict-item]
    pack = packs.Pack(Path(os.path.normpath(snapshot(work) / added)))
    assert set(pack.members) == (set(new) - set(old)) | index_added and pack.size < len(data) // 10
    assert read_file(snapshot(work), "study/big.tsv") == data and verify_archive(work).ok


def test_flipped_bit_in_a_chunk_names_the_file_and_the_chunk(tmp_path: Path) -> None:
    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    big_table(scratch)
    manifest = promote(scratch, work)
    snap = snapshot(work)
    [rel] = manifest["packing"]["chunk_packs"]  # type: ignore[typeddict-item]
    pack = Path(os.path.normpath(snap / rel))
    flip(pack, pack.stat().st_size - 20)  # inside the last block: its chunks fail
    problems = verify_tree(snap)
    assert any(p.startswith(f"{snap / 'study/big.tsv'}: chunk ") and f"damaged in chunk pack {pack}" in p
               for p in problems), problems
    report = verify_archive(work)
    assert not report.ok and any(p.file == str(snap / "study/big.tsv") for p in report.problems)
    with pytest.raises(IntegrityError, match="chunk"):
        read_file(snap, "study/big.tsv")


def test_a_damaged_index_chunk_names_the_file_and_the_index(tmp_path: Path) -> None:
    """A long chunk list is read through its index: an index chunk missing from every chunk
    pack names the file, the index chunk and the fix, and verify fails."""
    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    big_table(scratch)
    promote(scratch, work)
    path = writable(snapshot(work)) / "archive.json"
    manifest = json.loads(path.read_text())
    manifest["packing"]["chunks"]["study/big.tsv"]["index"][1] = "0" * 32  # packing is outside the root digest
    path.write_text(json.dumps(manifest))
    problems = verify_tree(snapshot(work))
    assert any(p.startswith(f"{snapshot(work) / 'study/big.tsv'}: index chunk 1 of ") and "xxh3_128:" + "0" * 32 in p
               and "in none of the chunk packs archive.json lists" in p and "archive retire" in p
               for p in problems), problems
    with pytest.raises(IntegrityError, match="index chunk 1 of"):
        read_file(snapshot(work), "study/big.tsv")


def test_verify_checks_the_reassembled_file_against_its_digest(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Intact chunks put together in another order are not the file archive.json lists."""
    from pairflow.evidence import archive

    monkeypatch.setattr(archive, "INDEXED_OVER", 10**6)  # the chunks listed in archive.json itself
    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    big_table(scratch)
    promote(scratch, work)
    path = writable(snapshot(work)) / "archive.json"
    manifest = json.loads(path.read_text())
    chunks = manifest["packing"]["chunks"]["study/big.tsv"]
    chunks[0], chunks[1] = chunks[1], chunks[0]  # packing is outside the root digest
    path.write_text(json.dumps(manifest))
    problems = verify_tree(snapshot(work))
    assert any(p.startswith(f"{snapshot(work) / 'study/big.tsv'}: digest ") and "differs" in p
               for p in problems), problems


def test_packs_checked_in_worker_processes_report_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Verify's process pool (used for many packs) finds what the serial check finds."""
    from pairflow.evidence import archive

    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    for name in ("q", "r", "s"):
        add_candidate(scratch, name, "c")
    promote(scratch, work)
    pack = pack_of(work, "panels/q/generation")
    flip(pack, pack.stat().st_size - 20)
    serial = verify_tree(snapshot(work))
    monkeypatch.setattr(archive, "PARALLEL_OVER", 0)
    monkeypatch.setattr(archive.os, "cpu_count", lambda: 2)
    assert verify_tree(snapshot(work)) == serial and any(p.startswith(f"{pack}: first failing") for p in serial)


def test_a_long_pack_listing_is_stored_in_chunks_and_still_verifies(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Over CHUNKED_OVER the listing of packs (one line a pack, O(panels)) leaves
    archive.json for the chunk packs; the root digest, show and verify read it back."""
    from pairflow.evidence import archive

    monkeypatch.setattr(archive, "CHUNKED_OVER", 100)
    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    for name in ("q", "r", "s"):
        add_candidate(scratch, name, "c")
    manifest = promote(scratch, work)
    snap = snapshot(work)
    on_disk = json.loads((snap / "archive.json").read_text())
    assert "packs" not in on_disk and archive.PACKS_KEY in on_disk["packing"]["chunks"]
    assert load_manifest(snap)["packs"] == manifest["packs"] and len(manifest["packs"]) == 4
    other = add_candidate(scratch, "q", "d")
    promote(scratch, work)
    assert show(snapshot(work), other["record_digest"]) == json.dumps(other, indent=1, sort_keys=True).encode() + b"\n"
    assert verify_archive(work).ok
    [rel] = on_disk["packing"]["chunk_packs"]
    pack = Path(os.path.normpath(snap / rel))
    flip(pack, pack.stat().st_size - 20)
    problems = verify_tree(snap)
    assert any(p.startswith(f"{snap / archive.PACKS_KEY}: chunk ") for p in problems), problems


def panel_bookkeeping(scratch: Path, panel: str, ms: int) -> None:
    """What a panel job leaves beside its records: its log, benchmark, job account and
    the two stat vouchers of its manifests (``records.vouch``)."""
    for rel in (f"logs/generate-score/{panel}.log", f"benchmarks/generate_score_panel/{panel}.tsv",
                f"accounts/job-generate_score_panel-panel={panel}-{ms}-42.json",
                f"checks/vouched/panels--{panel}--generation.json", f"checks/vouched/panels--{panel}--scores.json"):
        (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
        (scratch / rel).write_text(f"{rel} {ms}\n")


def test_a_snapshot_has_a_few_packs_a_panel_and_a_constant_number_of_other_files(tmp_path: Path) -> None:
    """Regression (issue 40): the per-panel vouchers were archived as plain files (2,505
    files at 500 panels, 1,006 of them study-level). A panel's log, benchmark and job
    account go into its timing pack, the vouchers are not archived, the other accounts
    share one pack: the snapshot's own files do not grow with the panels."""
    def own_files(panels: int) -> tuple[int, int]:
        scratch, work = make_scratch(tmp_path / f"n{panels}"), tmp_path / f"n{panels}" / "work"
        (scratch / "accounts").mkdir()
        (scratch / "accounts" / "job-study_stats-1000-1.json").write_text("{}\n")
        for i in range(panels):
            add_candidate(scratch, f"q{i}", "c")
            panel_bookkeeping(scratch, f"q{i}", 1000 + i)
        manifest = promote(scratch, work)
        assert not [rel for rel in manifest["files"] if rel.startswith(("checks/vouched/", "accounts/", "logs/generate"))]
        assert manifest["packs"].keys() >= {f"panels/q{i}/timing" for i in range(panels)} | {"accounts"}
        assert verify_archive(work).ok
        return sum(1 for p in snapshot(work).rglob("*") if p.is_file()), len(manifest["packs"])

    (few, _), (many, packed) = own_files(2), own_files(12)
    assert few == many and packed == 1 + 2 * 12 + 1  # panel p's generation pack, two a panel q<i>, accounts


def test_the_caches_and_the_archive_job_s_own_files_are_not_evidence(tmp_path: Path) -> None:
    """The plan-time memo and vouchers (rewritten by every plan), the archive job's log,
    account and benchmark (new in every run of the rule) and the claim card's results part
    and page (written after the archive, naming its root) are not archived, so a rerun
    after a killed promotion computes the same snapshot id (issue 40: it promoted a new
    snapshot beside the interrupted one)."""
    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    mine = {"checks/evidence.json": "{}", "checks/vouched/study--timing.json": "{}", "logs/archive.log": "1\n",
            "accounts/job-archive-1000-1.json": "{}", "benchmarks/archive/study.tsv": "s\n",
            # the claim card's results part and page name the archive's root
            "study/card-results.json": "{}", "study/card.md": "# card\n"}
    for rel, text in mine.items():
        (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
        (scratch / rel).write_text(text)
    first = promote(scratch, work)
    assert not set(mine) & set(first["files"]) and "accounts" not in first["packs"]
    for rel in mine:
        (scratch / rel).write_text("rewritten by the rerun\n")
    (scratch / "accounts" / "job-archive-2000-2.json").write_text("{}")
    assert promote(scratch, work)["root_digest"] == first["root_digest"]
    assert len(list((work / "snapshots").iterdir())) == 1 and verify_archive(work).ok


def test_the_sealed_claim_card_is_evidence(tmp_path: Path) -> None:
    """The sealed card (sealed before generation, never rewritten, named by every
    generation record) is archived; its results part and page are not."""
    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    (scratch / "study").mkdir(exist_ok=True)
    for name in ("card.json", "card-results.json", "card.md"):
        (scratch / "study" / name).write_text("{}\n")
    files = promote(scratch, work)["files"]
    assert "study/card.json" in files and "study/card-results.json" not in files and "study/card.md" not in files


def test_pack_groups_of_panels_replicates_and_job_files() -> None:
    panels = {"t", "a-b"}
    assert {rel: pack_group(rel, panels) for rel in (
        "panels/t/records/c/a-s0.json", "panels/t/scores.json", "panels/a-b/telemetry/generate-score.json",
        "replicates/r1/panels/t/scores/c/a-s0.json", "replicates/r1/panels/t/records/c/a-s0.json",
        "logs/generate-score/a-b.log", "benchmarks/score_panel/t.tsv", "logs/replicates/r2-a-b.log",
        "accounts/job-generate_score_panel-panel=a-b-1796425222190-19518.json",
        "accounts/job-replicate_panel-rep=r1-panel=t-17-1.json", "accounts/job-study_stats-17-1.json",
        "logs/stats/study.log", "study/table.md", "checks/arms.json")} == {
        "panels/t/records/c/a-s0.json": "panels/t/generation", "panels/t/scores.json": "panels/t/score",
        "panels/a-b/telemetry/generate-score.json": "panels/a-b/timing",
        "replicates/r1/panels/t/scores/c/a-s0.json": "replicates/r1/panels/t/score",
        "replicates/r1/panels/t/records/c/a-s0.json": "replicates/r1/panels/t/generation",
        "logs/generate-score/a-b.log": "panels/a-b/timing", "benchmarks/score_panel/t.tsv": "panels/t/timing",
        "logs/replicates/r2-a-b.log": "replicates/r2/panels/a-b/timing",
        "accounts/job-generate_score_panel-panel=a-b-1796425222190-19518.json": "panels/a-b/timing",
        "accounts/job-replicate_panel-rep=r1-panel=t-17-1.json": "replicates/r1/panels/t/timing",
        "accounts/job-study_stats-17-1.json": "accounts",
        "logs/stats/study.log": None, "study/table.md": None, "checks/arms.json": None}


def test_an_interrupted_snapshot_of_older_evidence_is_removed_with_its_packs(tmp_path: Path) -> None:
    """A promotion killed before archive.json, then the evidence changed (a panel rerun):
    the next promotion seals its own snapshot and removes the unsealed one and the packs
    only it would have listed; a retired unsealed snapshot is kept (its note says why)."""
    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    add_candidate(scratch, "q", "c")
    promote(scratch, work)
    kept = {p.name for p in (work / "packs").iterdir()}
    add_candidate(scratch, "q", "d")
    promote(scratch, work)
    second = snapshot(work)
    writable(second)
    (second / "archive.json").unlink()  # as a kill before sealing leaves it
    second_packs = {p.name for p in (work / "packs").iterdir()} - kept
    (work / "latest.json").unlink()
    assert {p.kind for p in verify_archive(work).problems} == {"snapshot", "latest"}
    retire(work, second.name, "kept to look at")
    unsealed = work / "snapshots" / "0123456789abcdef"
    (unsealed / "study").mkdir(parents=True)
    (unsealed / "study" / "table.md").write_text("| half |\n")
    add_candidate(scratch, "q", "e")
    promote(scratch, work)
    assert not unsealed.exists() and second.is_dir()
    assert not second_packs & {p.name for p in (work / "packs").iterdir()} and kept <= {p.name for p in (work / "packs").iterdir()}
    assert len(list((work / "snapshots").iterdir())) == 3 and verify_archive(work).ok


def test_no_pack_is_removed_while_a_snapshot_s_listing_cannot_be_read(tmp_path: Path) -> None:
    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    add_candidate(scratch, "q", "c")
    promote(scratch, work)
    first = writable(snapshot(work))
    before = sorted((work / "packs").iterdir())
    (first / "archive.json").write_text("{not json")
    add_candidate(scratch, "q", "d")
    promote(scratch, work)
    assert set(before) <= set((work / "packs").iterdir())


def test_a_second_promotion_into_the_same_archive_is_refused_while_one_runs(tmp_path: Path) -> None:
    from pairflow.errors import LockError
    from pairflow.locks import hold

    scratch, work = make_scratch(tmp_path), tmp_path / "work"
    with hold(work, "another promotion"), pytest.raises(LockError, match="being written by another run"):
        promote(scratch, work)
    promote(scratch, work)
    assert verify_archive(work).ok
