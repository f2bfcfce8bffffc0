"""What a job vouches for when it writes a manifest, so the first plan after a run
need not re-derive it (the plan-time check, ``healing.plan_check``, through the
``verification.Shortcuts`` it gives ``verification.check_results``).

A job writes a panel's generation or score manifest (or the timing manifest) only after
every record it lists was checked in that job: written through ``write_record``
(schema-checked on write) or read back through ``read_record`` (self-digest and schema),
and every generation record's video hashed against its recorded digest. Right after the
manifest, the job writes a voucher beside the plan's memo
(``scratch/checks/vouched/<manifest>.json``) naming the manifest's root digest, the
record schemas it checked against and, for a generation manifest, each video's
(inode, size, mtime, ctime) signature taken before it was hashed and found to match.

The plan's check of a panel it has no memo for then trusts a record whose bytes hash to
the digest a vouched manifest lists for it (it is the record the job checked: only
``json.loads`` is left, for the identity, recipe, link and score checks), and a video
whose signature is the vouched one (as it trusts the videos its own memo signed). A
voucher counts only while its manifest's root digest is the manifest's current one and
the schemas are today's; anything else (no voucher, a rewritten manifest, an edited
record, a touched video) is checked in full as before. ``healing.drop_memo`` removes the
vouchers with the memo, so after a failed ``pairflow verify`` the next plan checks and
re-hashes everything. Vouchers (and the memo) are caches of this file system, never
evidence: the archive leaves them out (``evidence.archive.NOT_EVIDENCE``).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..atomic import write_text
from ..identity import digest_file, digest_obj
from ..layout import Layout
from .store import SCHEMA_VERSION, load_schema
from .types import RECORD_KINDS

VOUCH_VERSION = 1


def stat_key(st: os.stat_result) -> str:
    """A file's (inode, size, mtime, ctime) signature, as the plan's memo writes it."""
    return f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


@functools.cache
def schemas_digest() -> str:
    """Digest of every record kind's schema and the schema version: a voucher written
    against other schemas vouches for nothing."""
    return digest_obj([SCHEMA_VERSION, [load_schema(f"record.{k}") for k in sorted(RECORD_KINDS)]])


def voucher_path(scratch: Path, manifest_path: Path) -> Path:
    """Where the voucher of ``manifest_path`` (inside ``scratch``) lives."""
    rel = os.path.relpath(manifest_path, scratch).replace(os.sep, "--")
    return Layout(scratch).vouchers / f"{rel}"


def vouch(scratch: Path, manifest_path: Path, manifest: Mapping[str, Any],
          generation: Mapping[Path, Mapping[str, Any]] | None = None) -> None:
    """Write the voucher of ``manifest`` (just written to ``manifest_path`` by a job that
    checked every record it lists, see the module docstring). ``generation``: the
    generation records the manifest lists, by record path; each video is signed by its
    stat, then hashed, and signed only when its bytes match the record (about 1 ms per
    MB: a panel's videos once more at the end of its job). A video that does not match
    is left out (the plan re-hashes it and reports it)."""
    videos: dict[str, list[str]] = {}
    for path, rec in (generation or {}).items():
        rel = rec["video"]["path"]
        video = Path(path).parents[2] / rel  # records/<arm>/<file> -> the panel directory
        try:
            key = stat_key(os.stat(video))
            if not video.is_symlink() and digest_file(video) == rec["video"]["digest"]:
                videos[rel] = [key, rec["video"]["digest"]]
        except OSError:
            continue
    write_text(voucher_path(scratch, manifest_path), json.dumps(
        {"version": VOUCH_VERSION, "schemas": schemas_digest(), "root": manifest["root_digest"],
         "videos": videos}, sort_keys=True) + "\n")


def vouched(scratch: Path, manifest_path: Path) -> tuple[dict[str, str], dict[str, list[str]]]:
    """What the voucher of ``manifest_path`` vouches for while it holds (its root is the
    manifest's current root, the manifest's body hashes to that root, and its schemas are
    today's): the listed files' digests by path (as ``str(manifest_path.parent / base /
    entry)`` normalised) and the videos' signatures by their records' ``video.path``.
    Two empty dicts otherwise."""
    try:
        voucher = json.loads(voucher_path(scratch, manifest_path).read_text())
        manifest = json.loads(Path(manifest_path).read_text())
        body = {k: v for k, v in manifest.items() if k != "root_digest"}
        if (not isinstance(voucher, dict) or voucher.get("version") != VOUCH_VERSION
                or voucher.get("schemas") != schemas_digest() or voucher.get("root") != manifest["root_digest"]
                or digest_obj(body) != manifest["root_digest"]):
            return {}, {}
        base = os.path.normpath(os.path.join(os.path.dirname(manifest_path), manifest.get("base", ".")))
        files = {f"{base}/{rel}": d for rel, d in manifest["files"].items()}
        videos = voucher.get("videos")
        return files, videos if isinstance(videos, dict) else {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}, {}


def drop_vouchers(scratch: Path) -> None:
    """Remove every voucher (with the plan's memo, see ``healing.drop_memo``)."""
    folder = Layout(scratch).vouchers
    if folder.is_dir():
        for f in os.listdir(folder):
            (folder / f).unlink(missing_ok=True)
