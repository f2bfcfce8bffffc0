"""Records and manifests: one self-digesting JSON per candidate, one manifest per panel.

A record's ``record_digest`` is the xxh3 of its canonical JSON without that field; a
reader recomputes it, so a flipped byte is caught before statistics see the record.
A manifest lists every record's file digest and a root digest over the sorted list.
Imports without torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .atomic import write_text
from .errors import IntegrityError
from .identity import canonical_json, digest_bytes, digest_file, digest_obj

SCHEMA_VERSION = 1
RUN_SPECIFIC = ("timing", "worker", "site")
"""Top-level record fields that legitimately differ between two runs of the same candidate."""


def seal(record: dict[str, Any]) -> dict[str, Any]:
    """Return ``record`` with ``schema_version`` and its own ``record_digest``."""
    body = {k: v for k, v in record.items() if k != "record_digest"}
    body["schema_version"] = SCHEMA_VERSION
    return {**body, "record_digest": digest_obj(body)}


def write_record(path: Path, record: dict[str, Any]) -> dict[str, Any]:
    """Seal and atomically write ``record``; returns the sealed record."""
    sealed = seal(record)
    write_text(Path(path), json.dumps(sealed, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    return sealed


def read_record(path: Path) -> dict[str, Any]:
    """Read a record and check its self-digest.

    Raises IntegrityError naming the file if it is unreadable, not JSON, or altered.
    """
    path = Path(path)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise IntegrityError(f"{path}: record is missing; rerun the panel to regenerate it") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise IntegrityError(f"{path}: record is not valid JSON ({e}); delete it and rerun the panel") from e
    if not isinstance(record, dict) or "record_digest" not in record:
        raise IntegrityError(f"{path}: not a PairFlow record (no record_digest); delete it and rerun")
    body = {k: v for k, v in record.items() if k != "record_digest"}
    actual = digest_obj(body)
    if actual != record["record_digest"]:
        raise IntegrityError(f"{path}: record digest mismatch (stored {record['record_digest']}, "
                             f"computed {actual}); the file was altered, delete it and rerun the panel")
    return record


def check_video(record: dict[str, Any], path: Path) -> None:
    """Raise IntegrityError if the record's video is missing or its bytes changed."""
    video = record["video"]
    vpath = Path(path).parents[2] / video["path"]  # records/<arm>/<file> -> the panel directory
    if not vpath.is_file():
        raise IntegrityError(f"{vpath}: video of record {path} is missing; rerun the panel to regenerate")
    actual = digest_file(vpath)
    if actual != video["digest"]:
        raise IntegrityError(f"{vpath}: video digest {actual} differs from {video['digest']} in "
                             f"{path}; the video changed after it was recorded, delete both and rerun")


def stable_view(record: dict[str, Any]) -> dict[str, Any]:
    """The record without run-specific fields (what must match across reruns)."""
    return {k: v for k, v in record.items() if k not in RUN_SPECIFIC + ("record_digest",)}


def relative_posix(path: Path | str, root: Path | str) -> str:
    """``path`` relative to ``root`` as a POSIX string; either may be relative to the
    working directory (Snakemake names outputs relative to it) or absolute."""
    return Path(path).absolute().relative_to(Path(root).absolute()).as_posix()


def stable_root(root: Path, records: dict[Path, dict[str, Any]]) -> str:
    """Digest over records' stable views (run-specific fields removed), keyed by path
    relative to ``root``: equal for two runs that computed the same things, however they
    were scheduled or interrupted."""
    return digest_obj({relative_posix(f, root): digest_obj(stable_view(r))
                       for f, r in sorted(records.items())})


def build_manifest(kind: str, root: Path, files: list[Path], extra: dict[str, Any] | None = None,
                   base: str = ".") -> dict[str, Any]:
    """A manifest of ``files`` (paths relative to ``root``) with their digests and a root
    digest over the sorted (path, digest) list and ``extra``. ``base`` is ``root`` as seen
    from the directory the manifest will be written to (e.g. ``".."``)."""
    entries = {relative_posix(f, root): digest_file(f) for f in sorted(files)}
    body = {"kind": kind, "schema_version": SCHEMA_VERSION, "base": base, "files": entries, **(extra or {})}
    return {**body, "root_digest": digest_obj(body)}


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    write_text(Path(path), json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def verify_manifest(path: Path) -> list[str]:
    """Re-hash every file a manifest lists (relative to the manifest's directory).

    Returns one line per problem: mismatched, missing, or a bad root digest. Files
    under the directory that the manifest does not list are reported as extra.
    """
    path = Path(path)
    problems: list[str] = []
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        return [f"{path}: unreadable manifest ({e})"]
    root = path.parent / manifest.get("base", ".")
    body = {k: v for k, v in manifest.items() if k != "root_digest"}
    if digest_obj(body) != manifest.get("root_digest"):
        problems.append(f"{path}: root digest mismatch; the manifest itself was altered")
    listed = manifest.get("files", {})
    for rel, digest in sorted(listed.items()):
        f = root / rel
        if f.is_symlink() or not f.is_file():
            problems.append(f"{f}: missing (listed in {path})")
        elif (actual := digest_file(f)) != digest:
            problems.append(f"{f}: digest {actual} differs from {digest} listed in {path}")
    return problems


__all__ = [
    "build_manifest",
    "canonical_json",
    "check_video",
    "digest_bytes",
    "read_record",
    "seal",
    "stable_view",
    "verify_manifest",
    "write_manifest",
    "write_record",
]
