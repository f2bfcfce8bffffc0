"""Promote compact evidence from scratch to work storage, and verify trees later.

Records, manifests, statistics, tables and logs are copied (never videos: pixels stay
on scratch and are referenced by digest), each copy byte-verified, and listed in an
archive manifest with a root digest. Archived files are immutable: promoting other
bytes under an archived name is refused naming both digests; identical bytes are a
no-op. Symlinks are never followed out of the evidence tree.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from .atomic import atomic_path, write_text
from .errors import ArchiveError, PairFlowError
from .identity import digest_file, digest_obj
from .records import build_manifest, check_video, read_record, verify_manifest, write_manifest

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


def promote(src: Path, dest: Path, extra: dict[str, Any] | None = None) -> dict[str, Any]:
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
    snapshot = dest / "snapshots" / digest_obj(digests).split(":", 1)[1][:16]
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
        write_manifest(path, manifest)
    pointer = {"snapshot": snapshot.relative_to(dest).as_posix(), "root_digest": manifest["root_digest"]}
    write_text(dest / "latest.json", json.dumps(pointer, indent=1, sort_keys=True) + "\n")
    return manifest


def verify_tree(root: Path) -> list[str]:
    """Re-hash everything under an archive or results tree.

    Every ``archive.json``, ``generation.json``, ``scores.json``, ``timing.json`` and
    ``manifest.json`` found is verified; in an archive, files the manifest does not list
    are reported as extra. Every record's self-digest is checked, and on scratch (where
    the videos are) every video's digest. Returns one line per problem.
    """
    root = Path(root)
    problems: list[str] = []
    manifests = sorted(p for p in root.rglob("*.json")
                       if p.name in (ARCHIVE_MANIFEST, "generation.json", "scores.json", "manifest.json", "timing.json"))
    if not manifests:
        return [f"{root}: no manifest found (archive.json, generation.json, scores.json)"]
    for m in manifests:
        problems += verify_manifest(m)
        if m.name == ARCHIVE_MANIFEST:
            listed = set(json.loads(m.read_text()).get("files", {}))
            for f in sorted(m.parent.rglob("*")):
                rel = f.relative_to(m.parent).as_posix()
                if (f.is_file() or f.is_symlink()) and rel != ARCHIVE_MANIFEST and rel not in listed:
                    problems.append(f"{f}: extra file, not listed in {m}")
    for rec in sorted(root.rglob("*.json")):
        if not any(f"/{d}/" in rec.as_posix() for d in ("records", "scores", "timing")):
            continue
        try:
            record = read_record(rec)
            # Where the pixels are here (scratch, not an archive), they must match too.
            if record.get("kind") == "generation" and (rec.parents[2] / "videos").is_dir():
                check_video(record, rec)
        except PairFlowError as e:
            problems.append(str(e))
    return problems
