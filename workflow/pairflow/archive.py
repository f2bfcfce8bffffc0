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

from .atomic import atomic_path
from .errors import ArchiveError, PairFlowError
from .identity import digest_file
from .records import build_manifest, read_record, verify_manifest, write_manifest

EVIDENCE_SUFFIXES = (".json", ".md", ".log", ".tsv", ".csv", ".png", ".svg", ".html")
ARCHIVE_MANIFEST = "archive.json"
REGENERATE = ("Videos are not archived. Each record lists its video's path and xxh3 digest; "
              "to regenerate them bit-for-bit on the same stack (same code commit, environment "
              "digest, model weights, encoder fingerprint and torch threads), check out the "
              "recorded commit and run `snakemake --configfile <config> --forcerun generate_panel`.")


def evidence_files(root: Path) -> list[Path]:
    """Compact evidence under ``root``: regular files with an evidence suffix, no symlinks,
    no temporary files. Raises ArchiveError for a symlink that leaves ``root``."""
    root = Path(root).resolve()
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in sorted(filenames) + sorted(d for d in dirnames if Path(dirpath, d).is_symlink()):
            p = Path(dirpath) / name
            if p.is_symlink():
                target = p.resolve()
                if not target.is_relative_to(root):
                    raise ArchiveError(f"{p} is a symlink to {target}, outside the evidence tree "
                                       f"{root}; replace it with the file itself or remove it")
                continue  # in-tree links add nothing: their targets are archived directly
            if name.startswith(".tmp-") or not name.endswith(EVIDENCE_SUFFIXES):
                continue
            out.append(p)
    return sorted(out)


def promote(src: Path, dest: Path, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Copy the compact evidence under ``src`` into ``dest`` and write its archive manifest.

    Returns the manifest. Raises ArchiveError on an immutable-name conflict.
    """
    src, dest = Path(src).resolve(), Path(dest)
    files = evidence_files(src)
    copied = []
    for f in files:
        rel = f.relative_to(src)
        target = dest / rel
        want = digest_file(f)
        if target.exists():
            have = digest_file(target)
            if have != want:
                raise ArchiveError(f"refusing to overwrite archived {target}: archived "
                                   f"{have}, new {want}; archived evidence is immutable; "
                                   "archive the new run under a new study name or work root")
            copied.append(target)
            continue
        with atomic_path(target) as tmp:
            shutil.copyfile(f, tmp)
            if digest_file(tmp) != want:
                raise ArchiveError(f"copy of {f} to {target} did not verify; check the work storage")
        copied.append(target)
    videos = {}
    for f in files:
        if f.name.endswith(".json") and "/records/" in f.as_posix():
            rec = read_record(f)
            videos[rec["video"]["path"]] = rec["video"]["digest"]
    old = dest / ARCHIVE_MANIFEST
    if old.exists():
        listed = json.loads(old.read_text()).get("files", {})
        copied += [dest / r for r in listed if (dest / r) not in copied and (dest / r).exists()]
    manifest = build_manifest("archive", dest, sorted(set(copied)),
                              {**(extra or {}), "videos_on_scratch": videos, "regenerate": REGENERATE})
    write_manifest(old, manifest)
    return manifest


def verify_tree(root: Path) -> list[str]:
    """Re-hash everything under an archive or results tree.

    Every ``archive.json``, ``generation.json``, ``scores.json`` and ``manifest.json``
    found is verified; in an archive, files the manifest does not list are reported as
    extra. Every record's self-digest is checked. Returns one line per problem.
    """
    root = Path(root)
    problems: list[str] = []
    manifests = sorted(p for p in root.rglob("*.json")
                       if p.name in (ARCHIVE_MANIFEST, "generation.json", "scores.json", "manifest.json"))
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
        if "/records/" in rec.as_posix() or "/scores/" in rec.as_posix():
            try:
                read_record(rec)
            except PairFlowError as e:
                problems.append(str(e))
    return problems
