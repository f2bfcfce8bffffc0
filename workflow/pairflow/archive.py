"""Promote compact evidence from scratch to work storage, and verify trees later.

Records, manifests, statistics, tables and logs are copied (never videos: pixels stay
on scratch and are referenced by digest), each copy byte-verified, and listed in an
archive manifest with a root digest. Archived files are immutable: promoting other
bytes under an archived name is refused naming both digests; identical bytes are a
no-op; a complete snapshot is made read-only. Symlinks are never followed out of the
evidence tree.

Layout of ``work/<study>/``::

    snapshots/<id>/        one snapshot per distinct evidence (``archive.json`` last)
    latest.json            the newest complete, non-retired snapshot
    retired/<id>.json      sealed retirement notes (why, who, when, what was found)

A damaged snapshot is never repaired or deleted: ``retire`` records why it is set
aside, and the next promotion of the same evidence lands in a new snapshot id.
"""

from __future__ import annotations

import datetime
import getpass
import json
import os
import shutil
import socket
import stat
from pathlib import Path
from typing import Any

from .atomic import atomic_path, write_text
from .errors import ArchiveError, PairFlowError
from .identity import digest_file, digest_obj
from .layout import Layout
from .records import build_manifest, check_video, read_record, verify_manifest, write_manifest
from .recordtypes import Manifest

EVIDENCE_SUFFIXES = (".json", ".md", ".log", ".tsv", ".csv", ".png", ".svg", ".html")
ARCHIVE_MANIFEST = "archive.json"
SKIP_DIRS = ("run", "videos")
"""Parsl's run directories (internal interchange/worker logs) and pixels are not evidence."""
SKIP_NAMES = ("archived.json",)
"""The archive rule's own marker is written after promotion."""
REGENERATE = ("Videos are not archived. Each record lists its video's path and xxh3 digest; "
              "to regenerate them bit-for-bit on the same stack (same code commit, environment "
              "digest, model weights, encoder fingerprint and torch threads), check out the "
              "recorded commit and run this archive's `regenerate_command` (the config file(s) the run used).")


def evidence_files(root: Path) -> list[Path]:
    """Compact evidence under ``root``: regular files with an evidence suffix, no symlinks,
    no temporary files. Raises ArchiveError for a symlink that leaves ``root``."""
    root = Path(root).resolve()
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for name in sorted(filenames) + sorted(d for d in dirnames if Path(dirpath, d).is_symlink()):
            p = Path(dirpath) / name
            if p.is_symlink():
                target = p.resolve()
                if not target.is_relative_to(root):
                    raise ArchiveError(f"{p} is a symlink to {target}, outside the evidence tree "
                                       f"{root}; replace it with the file itself or remove it")
                continue  # in-tree links add nothing: their targets are archived directly
            if name.startswith(".tmp-") or name in SKIP_NAMES or not name.endswith(EVIDENCE_SUFFIXES):
                continue
            out.append(p)
    return sorted(out)


def promote(src: Path, dest: Path, extra: dict[str, Any] | None = None) -> Manifest:
    """Copy the compact evidence under ``src`` into an immutable snapshot under ``dest``.

    The snapshot's name is derived from the evidence itself
    (``dest/snapshots/<first 16 hex of the evidence digest>``), so the same evidence
    always lands in the same place and a changed study (a rerun panel) lands in a new
    one; ``dest/latest.json`` points at the newest. Each copy is byte-verified and the
    snapshot gets an ``archive.json`` manifest. Returns that manifest. Raises
    ArchiveError when an archived name already holds other bytes.
    """
    src, dest = Path(src).resolve(), Path(dest)
    files = evidence_files(src)
    digests = {f.relative_to(src).as_posix(): digest_file(f) for f in files}
    snapshot = dest / "snapshots" / snapshot_id(dest, digest_obj(digests).split(":", 1)[1][:16])
    for rel, want in digests.items():
        target = snapshot / rel
        if target.exists():
            have = digest_file(target)
            if have != want:
                raise ArchiveError(f"refusing to overwrite archived {target}: archived "
                                   f"{have}, new {want}; archived evidence is immutable")
            continue
        with atomic_path(target) as tmp:
            shutil.copyfile(src / rel, tmp)
            if digest_file(tmp) != want:
                raise ArchiveError(f"copy of {src / rel} to {target} did not verify; check the work storage")
    videos = {}
    for f in files:
        if "/records/" in f.as_posix():
            rec = read_record(f)
            videos[(f.relative_to(src).parents[2] / rec["video"]["path"]).as_posix()] = rec["video"]["digest"]
    manifest = build_manifest("archive", snapshot, [snapshot / r for r in digests],
                              {**(extra or {}), "videos_on_scratch": videos, "regenerate": REGENERATE})
    path = snapshot / ARCHIVE_MANIFEST
    if not path.exists():
        sweep_temp(snapshot)  # a killed promotion's half-copies: never sealed into the snapshot
        write_manifest(path, manifest)  # written last: a snapshot without it is incomplete
        make_read_only(snapshot)
    pointer = {"snapshot": snapshot.relative_to(dest).as_posix(), "root_digest": manifest["root_digest"]}
    write_text(dest / "latest.json", json.dumps(pointer, indent=1, sort_keys=True) + "\n")
    return manifest


def sweep_temp(snapshot: Path) -> list[Path]:
    """Remove the ``.tmp-*`` files and folders a killed promotion left in an unsealed
    ``snapshot`` (copies it never renamed into place), so none is sealed read-only with
    it. Returns what was removed."""
    from .evidence import temp_files

    gone = temp_files(snapshot)
    for t in gone:
        if t.is_dir() and not t.is_symlink():
            shutil.rmtree(t)
        else:
            t.unlink(missing_ok=True)
    return gone


def snapshot_id(dest: Path, base: str) -> str:
    """``base`` (from the evidence digest), or ``base-<n>`` with the first ``n`` that is
    not retired: evidence promoted again after its snapshot was retired gets a fresh one."""
    n, name = 1, base
    while (dest / RETIRED / f"{name}.json").exists():
        n += 1
        name = f"{base}-{n}"
    return name


def make_read_only(root: Path) -> None:
    """Drop every write bit under ``root`` (files, then directories bottom-up)."""
    for dirpath, _dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                os.chmod(p, stat.S_IMODE(os.lstat(p).st_mode) & ~0o222)
        os.chmod(dirpath, stat.S_IMODE(os.lstat(dirpath).st_mode) & ~0o222)


RETIRED = "retired"


def retire(dest: Path, snapshot: str, why: str, scratch: Path | None = None) -> Path:
    """Set a (damaged) snapshot aside: keep its files, write a sealed retirement note
    ``dest/retired/<snapshot>.json`` (why, who, when, what verify found), point
    ``latest.json`` at the newest other complete snapshot (or remove it), and remove
    ``scratch/study/archived.json`` when it names the snapshot, so the next run promotes
    the evidence again into a new snapshot. Returns the note's path. Raises ArchiveError
    for an unknown or already retired snapshot, or an empty reason."""
    from .records import write_record

    dest = Path(dest)
    sdir = dest / "snapshots" / snapshot
    known = sorted(p.name for p in (dest / "snapshots").iterdir()) if (dest / "snapshots").is_dir() else []
    if not why.strip():
        raise ArchiveError(f"retiring {snapshot}: give the reason with --why \"...\" (it is kept with the evidence)")
    if snapshot not in known:
        raise ArchiveError(f"no snapshot {snapshot!r} under {dest / 'snapshots'}; known: {known}")
    note = dest / RETIRED / f"{snapshot}.json"
    if note.exists():
        raise ArchiveError(f"snapshot {snapshot} is already retired ({note})")
    try:
        root = json.loads((sdir / ARCHIVE_MANIFEST).read_text()).get("root_digest")
    except (OSError, ValueError):
        root = None
    found = verify_tree(sdir) if (sdir / ARCHIVE_MANIFEST).exists() else [f"{sdir}: no {ARCHIVE_MANIFEST}"]
    write_record(note, {
        "kind": "retirement", "snapshot": snapshot, "why": why.strip(), "archive_root_digest": root,
        "found": found, "by": f"{getpass.getuser()}@{socket.gethostname()}",
        "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")})
    latest = dest / "latest.json"
    try:
        pointed = json.loads(latest.read_text()).get("snapshot")
    except (OSError, ValueError):
        pointed = None
    if pointed in (None, f"snapshots/{snapshot}"):
        _repoint_latest(dest)
    if scratch is not None:
        done = Layout(scratch).archived
        try:
            if Path(json.loads(done.read_text())["archive"]).name == snapshot:
                done.unlink()
        except (OSError, ValueError, KeyError):
            pass
    return note


def retired(dest: Path) -> dict[str, dict[str, Any]]:
    """Retirement notes under ``dest`` by snapshot id (self-digest checked)."""
    out = {}
    for p in sorted((Path(dest) / RETIRED).glob("*.json")):
        if not p.name.startswith(".tmp-"):
            out[p.stem] = read_record(p)
    return out


def _complete(sdir: Path) -> bool:
    return (sdir / ARCHIVE_MANIFEST).is_file() and not verify_tree(sdir)


def _repoint_latest(dest: Path) -> None:
    """``latest.json`` → the newest complete, verifying, non-retired snapshot; removed if none."""
    gone = set(retired(dest))
    snaps = [p for p in (dest / "snapshots").iterdir() if p.name not in gone and _complete(p)]
    latest = dest / "latest.json"
    if not snaps:
        latest.unlink(missing_ok=True)
        return
    best = max(snaps, key=lambda p: (p / ARCHIVE_MANIFEST).stat().st_mtime_ns)
    root = json.loads((best / ARCHIVE_MANIFEST).read_text())["root_digest"]
    write_text(latest, json.dumps({"snapshot": best.relative_to(dest).as_posix(), "root_digest": root},
                                  indent=1, sort_keys=True) + "\n")


def verify_archive(dest: Path) -> Any:
    """An archive (``work/<study>``) as an ``evidence.Report``: every non-retired
    snapshot is complete and verifies, retired ones are notes, and ``latest.json``
    points at a complete, non-retired snapshot with its root digest."""
    from .evidence import Report, links, temp_files

    dest = Path(dest)
    report = Report()
    try:
        gone = retired(dest)
    except PairFlowError as e:
        report.add("altered", dest / RETIRED, str(e))
        gone = {}
    snaps = sorted(p for p in (dest / "snapshots").iterdir()) if (dest / "snapshots").is_dir() else []
    for sdir in snaps:
        if sdir.name in gone:
            n = gone[sdir.name]
            report.add("retired", sdir, f"retired {n['at']} by {n['by']}: {n['why']}")
            continue
        if not (sdir / ARCHIVE_MANIFEST).is_file():
            report.add("snapshot", sdir, f"incomplete snapshot: no {ARCHIVE_MANIFEST} (promotion was interrupted); "
                       "rerun the workflow to finish it, or retire it: pairflow archive retire "
                       f"{sdir.name} --why \"...\"")
            continue
        for line in verify_tree(sdir):
            file, _, message = line.partition(": ")
            file = os.path.normpath(file)
            kind = "extra" if "extra file" in message else "missing" if message.startswith("missing") else "altered"
            report.add(kind, file, f"{message} (snapshot {sdir.name}; retire it with pairflow archive retire "
                       f"{sdir.name} --why \"...\")")
    latest = dest / "latest.json"
    live = [s for s in snaps if s.name not in gone]
    if not latest.is_file():
        if live or not snaps:
            report.add("latest", latest, "missing: no snapshot is current; rerun the workflow to promote one")
        else:
            report.add("latest", latest, "missing: every snapshot is retired; rerun the workflow "
                       "(snakemake --profile profiles/local) to promote the evidence into a new snapshot")
    else:
        try:
            pointer = json.loads(latest.read_text())
            target = dest / pointer["snapshot"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            report.add("latest", latest, f"unreadable ({e})")
        else:
            if target.name in gone:
                report.add("latest", latest, f"points at retired snapshot {target.name}")
            elif not (target / ARCHIVE_MANIFEST).is_file():
                report.add("latest", latest, f"points at {target.name}, which is not a complete snapshot")
            elif json.loads((target / ARCHIVE_MANIFEST).read_text()).get("root_digest") != pointer.get("root_digest"):
                report.add("latest", latest, f"root digest {pointer.get('root_digest')} differs from {target.name}'s")
    for link in links(dest):
        if link.relative_to(dest).parts[0] == "snapshots" and len(link.relative_to(dest).parts) > 2:
            continue  # inside a snapshot: verify_tree names it (extra, or missing where a file is listed)
        report.add("symlink", link, f"a symlink (to {os.readlink(link)}); an archive holds regular files only. "
                   "Replace it with the file itself or remove it")
    for t in temp_files(dest):
        report.add("temp", t, "left by an interrupted write; safe to delete")
    return report


def verify_tree(root: Path) -> list[str]:
    """Re-hash everything under an archive or results tree.

    Every ``archive.json``, ``generation.json``, ``scores.json``, ``timing.json`` and
    ``manifest.json`` found is verified; in an archive, files the manifest does not list
    are reported as extra. Every record's self-digest is checked, and on scratch (where
    the videos are) every video's digest. Returns one line per problem.
    """
    root = Path(root)
    problems: list[str] = []
    names = (ARCHIVE_MANIFEST, "generation.json", "scores.json", "manifest.json", "timing.json")
    manifests = sorted(p for p in root.rglob("*.json") if ".tmp-" not in p.as_posix() and p.name in names)
    if not manifests:
        return [f"{root}: no manifest found (archive.json, generation.json, scores.json)"]
    for m in manifests:
        problems += verify_manifest(m)
        if m.name == ARCHIVE_MANIFEST:
            listed = set(json.loads(m.read_text()).get("files", {}))
            for f in sorted(m.parent.rglob("*")):
                rel = f.relative_to(m.parent).as_posix()
                if ((f.is_file() or f.is_symlink()) and rel != ARCHIVE_MANIFEST and rel not in listed
                        and not f.name.startswith(".tmp-")):
                    problems.append(f"{f}: extra file, not listed in {m}")
    for rec in sorted(root.rglob("*.json")):
        if (not any(f"/{d}/" in rec.as_posix() for d in ("records", "scores", "timing"))
                or rec.name.startswith(".tmp-")):  # an interrupted write, not a record
            continue
        try:
            record = read_record(rec)
            # Where the pixels are here (scratch, not an archive), they must match too.
            if record.get("kind") == "generation" and (rec.parents[2] / "videos").is_dir():
                check_video(record, rec)
        except PairFlowError as e:
            problems.append(str(e))
    return problems
