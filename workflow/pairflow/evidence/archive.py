"""Promote compact evidence from scratch to work storage, and verify trees later.

Records, manifests, statistics, tables and logs are copied (never videos: pixels stay
on scratch and are referenced by digest), each copy byte-verified, and listed in an
archive manifest with a root digest. Archived files are immutable: promoting other
bytes under an archived name is refused naming both digests; identical bytes are a
no-op; a complete snapshot is made read-only. Symlinks are never followed out of the
evidence tree.

What is evidence (``evidence_files``): not the caches on scratch (the plan-time check's
memo ``checks/evidence.json`` and the jobs' stat vouchers ``checks/vouched/``: inode
signatures that mean nothing off this file system, rewritten by any plan, and a plan
without them checks in full), and not the archive job's own log, account and benchmark
(each run of the archive rule writes new ones; for the same reason the ledger does not
bill the archive rule's jobs, ``budget.ledger``), and not the claim card's results part and
page (``card-results.json``, ``card.md``: written after the archive, they name its root, so
archiving them would change the root they name). The sealed card itself (``card.json``,
sealed before generation and never rewritten) is evidence: every generation record names
its seal, and ``pairflow verify`` checks it against the snapshot. So a snapshot's id is a
function of the evidence it seals alone: a rerun after a kill computes the same id and
finishes the interrupted snapshot.

Layout of ``work/<study>/``::

    packs/<root>.pfpack    a panel's files of one part (generation, score, timing: the
                           timing records, telemetry, the panel jobs' logs, benchmarks and
                           accounts), a replicate panel's the same, and the other job
                           accounts, packed (``packs``); named by the digest of the files
                           they hold and shared by every snapshot that holds the same files
    snapshots/<id>/        one snapshot per distinct evidence: the study-level files
                           (tables, statistics, plots, study manifests, study jobs' logs)
                           as plain files, and ``archive.json`` (written last); a
                           study-level file over ``CHUNKED_OVER`` is stored instead as
                           content-defined chunks in chunk packs (``packs/``, group
                           ``chunks``) shared between snapshots, listed under ``packing``
                           (a long list of chunks through an index, itself in chunks:
                           ``INDEXED_OVER``); so is a pack listing over that size
                           (``load_manifest``)
    latest.json            the newest complete, non-retired snapshot
    retired/<id>.json      sealed retirement notes (why, who, when, what was found)
    .pairflow.lock         held while a promotion runs (``locks.hold``)

So a snapshot has three packs per panel and a constant number of plain files, whatever
the number of candidates or panels, and promoting again after one panel was rerun writes
only that panel's packs, the accounts pack and the study-level files. ``archive.json``
lists the plain files' digests (``files``) and each pack's root (``packs``: the digest
over its files' own digests); its ``root_digest`` covers both and not ``packing``
(which pack file holds which group), so the snapshot's identity is its evidence, not its
container. Snapshots written before packing (every file plain, no ``packs``) verify as
they always did.

A promotion's steps, each logged with its name (``archive_step``): ``hashed`` (the
evidence hashed, the snapshot id chosen), ``copied`` (the plain files), ``packed
<group>`` (each pack, written or found), ``packed`` (every pack and chunk), ``sealed``
(``archive.json``), ``read-only``, ``latest`` (``latest.json``), ``swept``. A kill at
any point leaves a snapshot without ``archive.json`` at most; the next promotion, under
the same lock, finishes it when the evidence is the same and otherwise removes it, with
every pack no complete snapshot lists, once its own snapshot is sealed.

A damaged snapshot is never repaired or deleted: ``retire`` records why it is set
aside, and the next promotion of the same evidence lands in a new snapshot id (a damaged
pack is kept too; its files are packed again beside it, as ``<root>-2.pfpack``).
"""

from __future__ import annotations

import datetime
import getpass
import json
import logging
import os
import re
import shutil
import socket
import stat
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, cast

from ..atomic import TMP_PREFIX, atomic_path, sweep_temps, write_text
from ..errors import ArchiveError, IntegrityError, PairFlowError
from ..identity import digest_bytes, digest_file, digest_obj
from ..layout import SEALING_RULES, Layout
from ..locks import hold
from ..records.packs import SUFFIX, Pack, files_root, split_chunks, write_pack
from ..records.store import (
    SCHEMA_VERSION,
    check_manifest,
    check_video,
    parse_record,
    read_record,
    verify_manifest,
    write_manifest,
    write_record,
)
from ..records.types import Manifest
from ..report.card import PAGE_NAME as CARD_PAGE
from ..report.card import RESULTS_NAME as CARD_RESULTS
from .verification import Report, links, temp_files

EVIDENCE_SUFFIXES = (".json", ".md", ".log", ".tsv", ".csv", ".png", ".svg", ".html")
ARCHIVE_MANIFEST = "archive.json"
SKIP_DIRS = ("run", "videos")
"""Parsl's run directories (internal interchange/worker logs) and pixels are not evidence."""
SKIP_NAMES = ("archived.json",)
"""The archive rule's own marker is written after promotion."""
_HERE = Layout(Path("."))
NOT_EVIDENCE = (
    _HERE.evidence_memo.as_posix(), f"{_HERE.vouchers.as_posix()}/",  # the plan-time check's caches
    # the archive job's and (after it) the card job's own bookkeeping
    *((_HERE.logs / f"{rule}.log").as_posix() for rule in SEALING_RULES),
    *(f"{_HERE.benchmark(rule, 'study').parent.as_posix()}/" for rule in SEALING_RULES),
    *((_HERE.accounts / f"job-{rule}-").as_posix() for rule in SEALING_RULES),
    *((_HERE.card.parent / n).as_posix() for n in (CARD_RESULTS, CARD_PAGE)))
"""Paths (relative to scratch; a trailing ``/`` names a folder, ``job-archive-`` every
account of the archive rule) that are never evidence: see the module docstring."""
ACCOUNTS_GROUP = "accounts"
"""The pack of the job accounts that belong to no panel (study-level jobs, Slurm submissions)."""
_ACCOUNT = re.compile(r"job-[a-z_]+-(?:rep=(?P<rep>[A-Za-z0-9_-]+?)-)?panel=(?P<panel>[A-Za-z0-9_-]+?)"
                      r"(?:-[a-z_]+=[^/]*)?-\d+-\d+\.json")
"""A panel job's account (``jobaccount``: ``job-<rule>-<wildcard>=<value>...-<start ms>-<pid>.json``)."""
_REPLICATE_LOG = re.compile(r"(?P<rep>r\d+)-(?P<panel>[A-Za-z0-9_-]+)\.log")
"""A replicate panel job's log (``logs/replicates/<rep>-<panel>.log``)."""
log = logging.getLogger(__name__)
PACKS = "packs"
PACK_FORMAT = "pairflow-pack 1"
RECORD_DIRS = ("records", "scores", "timing")


def is_record_path(rel: str) -> bool:
    """Whether ``rel`` (a path relative to a results tree or snapshot) names a record: a
    ``.json`` below one of ``RECORD_DIRS`` and not below a job's ``run/`` folder (worker
    logs and heartbeats)."""
    parts = rel.split("/")[:-1]
    return rel.endswith(".json") and "run" not in parts and any(d in parts for d in RECORD_DIRS)
MANIFEST_NAMES = (ARCHIVE_MANIFEST, "generation.json", "scores.json", "manifest.json", "timing.json")
PARALLEL_OVER = 32
"""Verify checks more uncached packs than this in a process pool of min(cpus, 4)."""
PACKS_KEY = "archive.json#packs"
"""Where ``packing.chunks`` lists the chunks of a long pack listing (``load_manifest``)."""
CHUNKED_OVER = 1 << 14
"""Study-level files larger than this (bytes) are stored as content-defined chunks in
chunk packs shared between snapshots, not plain in each snapshot (``split_chunks``)."""
INDEXED_OVER = 32
"""A file cut into more chunks than this is listed in ``archive.json`` by an index, not by
its chunks: the list of its chunks' digests (one a line) is itself cut into
content-defined chunks and stored with them, and ``packing.chunks[file]`` is ``{"index":
[those chunks' digests]}``. So archive.json holds about one digest per ``CHUNK_LINES``²
lines (30 for a 31,000-candidate timing manifest, not 970), and a rerun panel, whose
changed lines are a run of chunks, changes one or two index chunks, not a list that
grows with the panels. (A tree of indexes, as content-defined B-trees have, would go one
level further; one level keeps archive.json a few KB up to millions of candidates.)"""
REGENERATE = ("Videos are not archived. Each generation record lists its video's path and xxh3 digest; "
              "to regenerate them bit-for-bit on the same stack (same code commit, environment "
              "digest, model weights, encoder fingerprint and torch threads), check out the "
              "recorded commit and run this archive's `regenerate_command` (the config file(s) the run used).")


def evidence_files(root: Path) -> list[Path]:
    """Compact evidence under ``root``: regular files with an evidence suffix, no symlinks,
    no temporary files, nothing under ``NOT_EVIDENCE``. Raises ArchiveError for a symlink
    that leaves ``root``."""
    root = Path(root).resolve()
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        here = os.path.relpath(dirpath, root).replace(os.sep, "/")
        here = "" if here == "." else f"{here}/"
        if here.startswith(NOT_EVIDENCE):
            dirnames[:] = []
            continue
        filenames = [n for n in filenames if not f"{here}{n}".startswith(NOT_EVIDENCE)]
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


def pack_group(rel: str, panels: set[str]) -> str | None:
    """The pack a file of the evidence goes to, ``panels/<panel>/<part>`` (a replicate
    panel's: ``replicates/<rep>/panels/<panel>/<part>``), ``accounts`` for a job account
    of no panel, or None for a study-level file (kept plain). Parts: ``generation`` (the
    generation records and manifest), ``timing`` (timing records, telemetry, and the
    panel jobs' logs, benchmarks and accounts: ``logs/<rule>/<panel>.log``,
    ``benchmarks/<rule>/<panel>.tsv``, ``accounts/job-<rule>-panel=<panel>-...``),
    ``score`` (the rest: score records and manifest, the panel's statistics and tables).
    The grouping only decides what is shared between snapshots; identity never depends
    on it."""
    parts = rel.split("/")
    prefix = ""
    if parts[0] == "replicates" and len(parts) >= 5 and parts[2] == "panels":
        prefix, parts = f"replicates/{parts[1]}/", parts[2:]
    if parts[0] == "panels" and len(parts) >= 3:
        part = ("generation" if parts[2] in ("records", "generation.json")
                else "timing" if parts[2] in ("timing", "telemetry") else "score")
        return f"{prefix}panels/{parts[1]}/{part}"
    if prefix or len(parts) < 2:
        return None
    if parts[0] in ("logs", "benchmarks") and len(parts) == 3:
        if parts[2].rsplit(".", 1)[0] in panels:
            return f"panels/{parts[2].rsplit('.', 1)[0]}/timing"
        rep = _REPLICATE_LOG.fullmatch(parts[2]) if parts[1] == "replicates" else None
        if rep and rep["panel"] in panels:
            return f"replicates/{rep['rep']}/panels/{rep['panel']}/timing"
    if parts[0] == "accounts" and len(parts) == 2:
        job = _ACCOUNT.fullmatch(parts[1])
        if job and job["panel"] in panels:
            where = f"replicates/{job['rep']}/" if job["rep"] else ""
            return f"{where}panels/{job['panel']}/timing"
        return ACCOUNTS_GROUP
    return None


def promote(src: Path, dest: Path, extra: dict[str, Any] | None = None) -> Manifest:
    """Copy the compact evidence under ``src`` into an immutable snapshot under ``dest``.

    The snapshot's name is derived from the evidence itself
    (``dest/snapshots/<first 16 hex of the evidence digest>``), so the same evidence
    always lands in the same place (a killed promotion is finished by the next) and a
    changed study (a rerun panel) lands in a new one; ``dest/latest.json`` points at the
    newest. A panel's files go into three packs under ``dest/packs`` (written only where
    no intact pack of the same files exists), study-level files are copied plain; every
    copy is byte-verified and the snapshot gets an ``archive.json`` manifest. Then what
    interrupted promotions left is removed (``sweep_interrupted``). Runs under
    ``dest``'s lock; each step is logged by name (module docstring). Returns the manifest.
    Raises ArchiveError when an archived name already holds other bytes or a file
    changes while it is promoted, LockError while another promotion holds ``dest``.
    """
    with hold(Path(dest), f"promoting {src} to {dest}"):
        return _promote(Path(src).resolve(), Path(dest), extra)


def step(name: str, detail: str = "") -> None:
    """Log that a promotion reached step ``name`` (module docstring), with ``archive_step``
    set on the record: the archive rule's log says how far a killed run got."""
    log.info("archive step %s%s", name, f": {detail}" if detail else "", extra={"archive_step": name})


def _promote(src: Path, dest: Path, extra: dict[str, Any] | None) -> Manifest:
    started = time.time()
    files = evidence_files(src)
    digests = {f.relative_to(src).as_posix(): digest_file(f) for f in files}
    snapshot = dest / "snapshots" / snapshot_id(dest, digest_obj(digests).split(":", 1)[1][:16])
    path = snapshot / ARCHIVE_MANIFEST
    step("hashed", f"{len(digests)} files, snapshot {snapshot.name}")
    legacy = path.is_file() and not {"packs", "packing"} & set(json.loads(path.read_text()))
    tree = Layout(src).panels
    panels = {p.name for p in tree.iterdir() if p.is_dir()} if tree.is_dir() else set()
    groups: dict[str, dict[str, str]] = {}
    loose: dict[str, str] = {}
    for rel, want in digests.items():
        group = None if legacy else pack_group(rel, panels)
        (groups.setdefault(group, {}) if group else loose)[rel] = want
    chunked = {rel: want for rel, want in loose.items()
               if not legacy and (src / rel).stat().st_size > CHUNKED_OVER}
    for rel, want in loose.items():
        if rel in chunked:
            continue
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
    step("copied", f"{len(loose) - len(chunked)} plain files")
    chunks: dict[str, list[str] | dict[str, list[str]]] = {}
    if legacy:  # the same evidence, archived plain by an earlier version: nothing to add
        manifest: Manifest = json.loads(path.read_text())
    else:
        stored = {}
        for g, members in sorted(groups.items()):
            stored[g] = store_pack(dest, g, members, src)
            step(f"packed {g}")
        # Only packs not under their root's own name (written again beside a damaged one).
        packing = {g: os.path.relpath(p, snapshot) for g, p in stored.items()
                   if p.name != _pack_name(files_root(groups[g]))}
        roots = {g: files_root(m) for g, m in sorted(groups.items())}
        blobs = {rel: _read_checked(src / rel, want) for rel, want in sorted(chunked.items())}
        listing = json.dumps(roots, indent=1, sort_keys=True).encode()
        if len(listing) > CHUNKED_OVER:  # one line a pack: a rerun panel changes a chunk or two
            blobs[PACKS_KEY] = listing
        chunks, chunk_packs = store_chunks(dest, snapshot, blobs)
        # The same body and root as build_manifest over the plain files, chunked ones included.
        body = {"kind": "archive", "schema_version": SCHEMA_VERSION, "base": ".",
                "files": {rel: loose[rel] for rel in sorted(loose)}, **(extra or {}), "packs": roots,
                "videos_on_scratch": sum(1 for rel in digests if "/records/" in rel), "regenerate": REGENERATE}
        manifest = cast(Manifest, {**body, "root_digest": digest_obj(body)})
        manifest["packing"] = {"format": PACK_FORMAT, "files": packing,  # type: ignore[typeddict-unknown-key]
                               **({"chunks": chunks, "chunk_packs": chunk_packs} if chunks else {})}
    step("packed", f"{len(groups)} packs")
    if not path.exists():
        # A killed promotion's half-copies (.tmp-*) are never sealed into the snapshot.
        sweep_temps([Path(d) for d, _, _ in os.walk(snapshot)], older_than=time.time())
        # written last: a snapshot without it is incomplete; a long pack listing is in chunks (load_manifest)
        on_disk = {k: v for k, v in manifest.items() if k != "packs" or PACKS_KEY not in chunks}
        write_manifest(path, cast(Manifest, on_disk))
    step("sealed", str(snapshot))
    if os.stat(snapshot).st_mode & 0o222:  # the snapshot's own folder is the last made read-only
        make_read_only(snapshot)
    step("read-only")
    sweep_temps([dest / PACKS], older_than=started)
    pointer = {"snapshot": snapshot.relative_to(dest).as_posix(), "root_digest": manifest["root_digest"]}
    write_text(dest / "latest.json", json.dumps(pointer, indent=1, sort_keys=True) + "\n")
    step("latest", pointer["snapshot"])
    sweep_interrupted(dest)
    step("swept")
    return manifest


def sweep_interrupted(dest: Path) -> list[Path]:
    """Remove what killed promotions left under ``dest`` (call with ``dest``'s lock held,
    after a snapshot was sealed): every snapshot without ``archive.json`` that is not
    retired (an interrupted promotion of evidence that has changed since; the same
    evidence would have finished it), and every pack that no complete snapshot lists
    (retired ones included). When any complete snapshot's listing cannot be read, no pack
    is removed (its packs could not be told apart). Returns what was removed."""
    snaps = sorted((dest / "snapshots").iterdir()) if (dest / "snapshots").is_dir() else []
    notes = {p.stem for p in (dest / RETIRED).glob("*.json")} if (dest / RETIRED).is_dir() else set()
    removed = []
    for sdir in snaps:
        if sdir.name not in notes and not (sdir / ARCHIVE_MANIFEST).exists():
            for dirpath, _dirs, _files in os.walk(sdir):  # an unsealed snapshot is writable, unless odd
                os.chmod(dirpath, stat.S_IMODE(os.lstat(dirpath).st_mode) | 0o700)
            shutil.rmtree(sdir)
            removed.append(sdir)
    listed: set[Path] = set()
    for sdir in snaps:
        if sdir in removed or not (sdir / ARCHIVE_MANIFEST).exists():
            continue
        try:
            manifest = load_manifest(sdir)
            listed.update(snapshot_files(sdir, manifest)[0].values() if "packs" in manifest else [])
            listed.update(Path(os.path.normpath(sdir / p))
                          for p in (manifest.get("packing") or {}).get("chunk_packs", []))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IntegrityError):
            return removed  # verify names the unreadable snapshot; its packs stay
    keep = {os.path.normpath(p) for p in listed}
    for pack in _stored_packs(dest):
        if os.path.normpath(pack) in keep:
            continue
        pack.unlink()
        removed.append(pack)
    if removed:
        log.info("removed what interrupted promotions left: %s", ", ".join(str(p) for p in removed))
    return removed


def _read_checked(path: Path, want: str) -> bytes:
    body = path.read_bytes()
    if digest_bytes(body) != want:
        raise ArchiveError(f"{path} changed while it was promoted ({want}, now {digest_bytes(body)}); "
                           "rerun when no job writes the results tree")
    return body


def store_chunks(dest: Path, snapshot: Path,
                 files: dict[str, bytes]) -> tuple[dict[str, list[str] | dict[str, list[str]]], list[str]]:
    """Store ``files`` (path -> bytes: large study-level files, and the snapshot's pack
    listing as ``PACKS_KEY``) as content-defined chunks: chunks already held by an intact
    chunk pack of an earlier snapshot are shared, the others go into one new chunk pack
    (a pack of group ``chunks`` whose members are named by their digest's hex). Returns
    ({path: [chunk hex, ...] or {"index": [index chunk hex, ...]}}, [chunk pack path
    relative to ``snapshot``]); see ``INDEXED_OVER``."""
    if not files:
        return {}, []
    chunks: dict[str, list[str] | dict[str, list[str]]] = {}
    data: dict[str, bytes] = {}

    def cut(body: bytes) -> list[str]:
        hexes = []
        for c in split_chunks(body):
            hexes.append(h := digest_bytes(c).split(":", 1)[1])
            data[h] = c
        return hexes

    for rel, body in sorted(files.items()):
        hexes = cut(body)
        chunks[rel] = {"index": cut("".join(f"{h}\n" for h in hexes).encode())} if len(hexes) > INDEXED_OVER else hexes
    held: dict[str, Path] = {}
    for sdir in sorted((dest / "snapshots").iterdir()) if (dest / "snapshots").is_dir() else []:
        try:
            listed = json.loads((sdir / ARCHIVE_MANIFEST).read_text()).get("packing", {}).get("chunk_packs", [])
        except (OSError, ValueError, AttributeError):
            continue
        for rel in listed:
            p = Path(os.path.normpath(sdir / rel))
            if p in held.values() or not set(data) - set(held):
                continue
            try:
                pack = Pack(p)
            except IntegrityError:
                continue
            if not pack.verify():  # a damaged chunk pack is never shared
                held.update({h: p for h in pack.members if h in data and h not in held})
    new = {h: c for h, c in data.items() if h not in held}
    if new:
        path = _store(dest, "chunks", {h: digest_bytes(c) for h, c in new.items()}, new.__getitem__)
        held.update(dict.fromkeys(new, path))
    used = sorted({os.path.relpath(held[h], snapshot) for h in data})
    return chunks, used


def store_pack(dest: Path, group: str, members: dict[str, str], src: Path) -> Path:
    """The pack under ``dest/packs`` holding ``members`` (path -> digest, read from
    ``src``): an intact existing one (content addressed by the members' root), else a new
    one, byte-verified after writing. A damaged pack under that name is kept and the
    files packed again as ``<root>-<n>``. Raises ArchiveError when a file changed since
    it was hashed or the written pack does not verify."""
    return _store(dest, group, members, lambda rel: _read_checked(src / rel, members[rel]))


def _store(dest: Path, group: str, members: dict[str, str], load: Callable[[str], bytes]) -> Path:
    """``store_pack`` with each member's bytes given by ``load(path)``."""
    root = files_root(members)
    n, base = 1, root.split(":", 1)[1]
    while (target := dest / PACKS / (_pack_name(root) if n == 1 else f"{base}-{n}{SUFFIX}")).exists():
        try:
            pack = Pack(target)
            if pack.root == root and not pack.verify():
                return target
        except IntegrityError:
            pass
        n += 1
    write_pack(target, group, [(rel, load(rel)) for rel in members])
    written = Pack(target)
    if written.root != root or written.verify():
        raise ArchiveError(f"pack {target} did not verify after writing; check the work storage")
    return target


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
    """An archive (``work/<study>``) as an ``verification.Report``: every non-retired
    snapshot is complete and verifies, retired ones are notes, and ``latest.json``
    points at a complete, non-retired snapshot with its root digest."""
    dest = Path(dest)
    report = Report()
    try:
        gone = retired(dest)
    except PairFlowError as e:
        report.add("altered", dest / RETIRED, str(e))
        gone = {}
    snaps = sorted(p for p in (dest / "snapshots").iterdir()) if (dest / "snapshots").is_dir() else []
    cache: dict[str, Checked] = {}
    for sdir in snaps:
        if sdir.name in gone:
            n = gone[sdir.name]
            report.add("retired", sdir, f"retired {n['at']} by {n['by']}: {n['why']}")
            continue
        if not (sdir / ARCHIVE_MANIFEST).is_file():
            report.add("snapshot", sdir, f"incomplete snapshot: no {ARCHIVE_MANIFEST} (promotion was interrupted); "
                       "rerun the workflow to finish it (or, if the evidence changed since, remove it), "
                       "or retire it: pairflow archive retire "
                       f"{sdir.name} --why \"...\"")
            continue
        for line in verify_tree(sdir, cache):
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
    for pack in sorted(set(_stored_packs(dest)) - set(_listed_packs(snaps))):
        report.add("temp", pack, "a pack no snapshot lists (its promotion was interrupted before archive.json); "
                   "the next promotion uses it (the same files) or removes it (rerun the workflow), or delete it")
    return report


def _stored_packs(dest: Path) -> list[Path]:
    return (sorted(p for p in (dest / PACKS).glob(f"*{SUFFIX}") if not p.name.startswith(TMP_PREFIX))
            if (dest / PACKS).is_dir() else [])


def _listed_packs(snaps: list[Path]) -> list[Path]:
    """The packs listed by the complete snapshots among ``snaps`` (retired ones too)."""
    out = []
    for sdir in snaps:
        try:
            manifest = load_manifest(sdir)
            out += list(snapshot_files(sdir, manifest)[0].values()) if "packs" in manifest else []
            out += [Path(os.path.normpath(sdir / p)) for p in (manifest.get("packing") or {}).get("chunk_packs", [])]
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IntegrityError):
            continue  # an incomplete or unreadable snapshot is reported as such
    return out


def verify_tree(root: Path, packs: dict[str, Checked] | None = None) -> list[str]:
    """Re-hash everything under an archive snapshot or results tree.

    Every ``archive.json``, ``generation.json``, ``scores.json``, ``timing.json`` and
    ``manifest.json`` found is verified; in an archive, files the manifest does not list
    are reported as extra. Every record's self-digest is checked, and on scratch (where
    the videos are) every video's digest. A packed snapshot's packs are read whole
    (``verify_snapshot``); ``packs`` caches their findings across snapshots. Returns one
    line per problem.
    """
    root = Path(root)
    if (root / ARCHIVE_MANIFEST).is_file():
        try:
            manifest = load_manifest(root)
        except (OSError, ValueError) as e:
            return [f"{root / ARCHIVE_MANIFEST}: unreadable manifest ({e})"]
        except IntegrityError as e:
            return [str(e)]
        if isinstance(manifest, dict) and "packs" in manifest:
            return verify_snapshot(root, manifest, {} if packs is None else packs)
    problems: list[str] = []
    manifests = sorted(p for p in root.rglob("*.json") if ".tmp-" not in p.as_posix() and p.name in MANIFEST_NAMES)
    if not manifests:
        return [f"{root}: no manifest found (archive.json, generation.json, scores.json)"]
    for m in manifests:
        problems += verify_manifest(m)
        if m.name == ARCHIVE_MANIFEST:
            problems += _extra_files(m.parent, set(json.loads(m.read_text()).get("files", {})))
    for rec in sorted(root.rglob("*.json")):
        if not is_record_path(rec.relative_to(root).as_posix()) or rec.name.startswith(".tmp-"):  # .tmp-: a write
            continue
        try:
            record = read_record(rec)
            # Where the pixels are here (scratch, not an archive), they must match too.
            if record.get("kind") == "generation" and (rec.parents[2] / "videos").is_dir():
                check_video(record, rec)
        except PairFlowError as e:
            problems.append(str(e))
    return problems


def _extra_files(sdir: Path, listed: set[str]) -> list[str]:
    out = []
    for f in sorted(sdir.rglob("*")):
        rel = f.relative_to(sdir).as_posix()
        if ((f.is_file() or f.is_symlink()) and rel != ARCHIVE_MANIFEST and rel not in listed
                and not f.name.startswith(TMP_PREFIX)):
            out.append(f"{f}: extra file, not listed in {sdir / ARCHIVE_MANIFEST}")
    return out


Checked = tuple[Pack | None, list[str], dict[str, bytes]]
"""A pack read whole by ``_check_pack``: (pack or None when unreadable, problems, the
bytes of the manifests it holds)."""


def _check_pack(path: Path, sdir: Path) -> Checked:
    """Open and read a whole pack once: its index, every block, every member's digest,
    and every record's self-digest and schema; the manifests' bytes are kept so that
    they are not read again."""
    try:
        pack = Pack(path)
    except IntegrityError as e:
        return None, [str(e)], {}
    problems, failed = [], 0
    first = ""
    manifests = {}
    for member, data in pack.items():
        if isinstance(data, IntegrityError):
            failed += 1
            first = first or f"first failing record {member.path}: {data}"
            continue
        if member.path.rsplit("/", 1)[-1] in MANIFEST_NAMES[1:]:
            manifests[member.path] = data
        elif is_record_path(member.path):
            try:
                parse_record(data, f"{sdir}/{member.path} (in pack {path})")
            except PairFlowError as e:
                problems.append(str(e))
    if failed:
        more = f"; {failed - 1} more member(s) fail" if failed > 1 else ""
        problems.insert(0, f"{path}: {first}{more}")  # verify_archive says which snapshot to retire
    return pack, problems, manifests


def snapshot_files(sdir: Path, manifest: dict[str, Any]) -> tuple[dict[str, Path], dict[str, Path]]:
    """(group -> pack path, listed plain file -> path) of a packed snapshot."""
    packing = (manifest.get("packing") or {}).get("files") or {}
    return ({g: Path(os.path.normpath(sdir / packing.get(g, f"../../{PACKS}/{_pack_name(root)}")))
             for g, root in manifest["packs"].items()},
            {rel: sdir / rel for rel in manifest.get("files", {})})


def _pack_name(root: str) -> str:
    """The file name of the pack whose files have ``root``."""
    return f"{root.split(':', 1)[1]}{SUFFIX}"


def verify_snapshot(sdir: Path, manifest: dict[str, Any],
                    cache: dict[str, Checked]) -> list[str]:
    """A packed snapshot: ``archive.json``'s root digest and plain files, no extra files,
    every pack it lists (index, blocks, members, records; each pack read once per
    ``cache``) holding the files with the root it lists, and every manifest in the
    evidence (plain or packed) matching the files it lists. Returns one line per problem."""
    path = sdir / ARCHIVE_MANIFEST
    if not isinstance(manifest.get("packs"), dict) or not isinstance(manifest.get("files"), dict):
        return [f"{path}: packs or files is not a mapping; the manifest was altered"]
    chunked, problems = read_chunked(sdir, manifest)
    chunked_digests = {rel: digest_bytes(data) for rel, data in chunked.items()}

    def plain_digest(f: Path) -> str | None:
        rel = Path(os.path.normpath(f)).relative_to(sdir).as_posix() if f.is_relative_to(sdir) else ""
        if rel in chunked_digests:
            return chunked_digests[rel]
        return digest_file(f) if f.is_file() and not f.is_symlink() else None

    problems += check_manifest(manifest, path, plain_digest, exclude=("packing",))
    problems += _extra_files(sdir, set(manifest.get("files", {})))
    pack_paths, _ = snapshot_files(sdir, manifest)
    todo = sorted({str(p) for p in pack_paths.values()} - set(cache))
    if len(todo) > PARALLEL_OVER and (workers := min(os.cpu_count() or 1, 4)) > 1:
        # Packs are independent: check them in worker processes (record schema checks are CPU bound).
        with ProcessPoolExecutor(workers) as pool:
            cache.update(zip(todo, pool.map(_check_pack, map(Path, todo), [sdir] * len(todo),
                                            chunksize=max(1, len(todo) // (workers * 8))), strict=True))
    members: dict[str, tuple[Pack, str]] = {}
    inner_bytes: dict[str, bytes] = {}
    for group, root in sorted(manifest["packs"].items()):
        ppath = pack_paths[group]
        if str(ppath) not in cache:
            cache[str(ppath)] = _check_pack(ppath, sdir)
        pack, found, held = cache[str(ppath)]
        problems += found
        inner_bytes.update(held)
        if pack is None:
            continue
        if pack.root != root:
            problems.append(f"{ppath}: holds files with root {pack.root}; {path} lists {root} for {group}")
        for m in pack.members.values():
            members[m.path] = (pack, m.digest)

    prefix = os.path.normpath(sdir) + os.sep

    def digest_of(f: Path) -> str | None:
        # String operations, not pathlib: called once per archived file.
        full = os.path.normpath(f)
        if not full.startswith(prefix):  # a listed path that leaves the snapshot
            return None
        rel = full[len(prefix):].replace(os.sep, "/")
        if rel in members:
            return members[rel][1]
        return plain_digest(f) if rel in manifest["files"] else None

    inner = [rel for rel in [*manifest["files"], *members] if rel.rsplit("/", 1)[-1] in MANIFEST_NAMES[1:]]
    for rel in sorted(inner):
        try:
            data = (inner_bytes[rel] if rel in inner_bytes else members[rel][0].read(rel) if rel in members
                    else chunked[rel] if rel in chunked else (sdir / rel).read_bytes())
            obj = json.loads(data)
        except (OSError, ValueError, IntegrityError) as e:
            problems.append(f"{sdir / rel}: unreadable manifest ({e})")
            continue
        problems += check_manifest(obj, sdir / rel, digest_of)
    for rel in sorted(manifest["files"]):
        if is_record_path(rel):
            try:
                read_record(sdir / rel)
            except PairFlowError as e:
                problems.append(str(e))
    return problems


def read_chunked(sdir: Path, manifest: dict[str, Any]) -> tuple[dict[str, bytes], list[str]]:
    """The study-level files a packed snapshot stores in chunks, reassembled from its chunk
    packs (each read once; every chunk checked against its digest), and one line per
    problem: a damaged or missing chunk pack, and each file that cannot be reassembled,
    naming the file, the chunk and its pack. A file's own digest (``files``) is checked
    by the caller."""
    packing = manifest.get("packing") or {}
    chunks, listed = packing.get("chunks") or {}, packing.get("chunk_packs") or []
    store: dict[str, bytes] = {}
    bad: dict[str, str] = {}
    problems = []
    for rel in listed:
        ppath = Path(os.path.normpath(sdir / rel))
        try:
            pack = Pack(ppath)
        except IntegrityError as e:
            problems.append(str(e))
            continue
        for m, data in pack.items():
            if isinstance(data, IntegrityError):
                bad[m.path] = f"damaged in chunk pack {ppath} ({data})"
            else:
                store[m.path] = data

    def assemble(rel: str, hexes: list[str], what: str) -> bytes | None:
        parts = []
        for i, h in enumerate(hexes):
            if h not in store:
                problems.append(f"{sdir / rel}: {what} {i} of {len(hexes)} (xxh3_128:{h}) is "
                                f"{bad.get(h, 'in none of the chunk packs archive.json lists')}; the file cannot "
                                f"be reassembled, retire the snapshot (pairflow archive retire {sdir.name} --why ...)")
                return None
            parts.append(store[h])
        return b"".join(parts)

    out = {}
    for rel, entry in sorted(chunks.items()):
        if isinstance(entry, dict):  # an index: the chunks' digests, one a line, in chunks (INDEXED_OVER)
            index = assemble(rel, list(entry.get("index") or []), "index chunk")
            body = None if index is None else assemble(rel, index.decode("ascii", "replace").split(), "chunk")
        else:
            body = assemble(rel, entry, "chunk")
        if body is not None:
            out[rel] = body
    return out, problems


def load_manifest(sdir: Path) -> dict[str, Any]:
    """``archive.json`` of snapshot ``sdir`` as written, with its pack listing (``packs``)
    put back where it is stored in chunks (a listing over ``CHUNKED_OVER`` bytes, under
    ``packing.chunks[PACKS_KEY]``): the root digest covers the listing either way.
    Raises OSError or ValueError when archive.json is unreadable, IntegrityError naming
    the chunk when the listing cannot be reassembled."""
    manifest = json.loads((Path(sdir) / ARCHIVE_MANIFEST).read_text())
    packing = manifest.get("packing") if isinstance(manifest, dict) else None
    chunks = packing.get("chunks") if isinstance(packing, dict) else None
    if isinstance(chunks, dict) and PACKS_KEY in chunks and "packs" not in manifest:
        listing = {"packing": {**(packing or {}), "chunks": {PACKS_KEY: chunks[PACKS_KEY]}}}
        found, problems = read_chunked(Path(sdir), listing)
        if PACKS_KEY not in found:
            raise IntegrityError("; ".join(problems))
        manifest["packs"] = json.loads(found[PACKS_KEY])
    return cast("dict[str, Any]", manifest)


def read_file(sdir: Path, rel: str) -> bytes:
    """The bytes of file ``rel`` (as listed in the snapshot's evidence) of a complete
    snapshot, wherever it is stored: plain, in chunks (reassembled) or in a pack.
    Raises ArchiveError when the snapshot does not hold it, IntegrityError when its
    stored bytes do not hash to the listed digest."""
    sdir = Path(sdir)
    manifest = load_manifest(sdir)
    chunks = (manifest.get("packing") or {}).get("chunks") or {}
    if rel in chunks:
        found, problems = read_chunked(sdir, {"packing": {**manifest["packing"], "chunks": {rel: chunks[rel]}}})
        if rel not in found:
            raise IntegrityError("; ".join(problems))
        data = found[rel]
    elif rel in manifest.get("files", {}):
        data = (sdir / rel).read_bytes()
    else:
        for pack in (Pack(p) for p in snapshot_files(sdir, manifest)[0].values()) if "packs" in manifest else []:
            if rel in pack.members:
                return pack.read(rel)
        raise ArchiveError(f"{sdir}: holds no file {rel!r}; paths are as in the results tree, e.g. study/timing.json")
    if digest_bytes(data) != manifest["files"][rel]:
        raise IntegrityError(f"{sdir / rel}: digest {digest_bytes(data)} differs from {manifest['files'][rel]} "
                             f"listed in {sdir / ARCHIVE_MANIFEST}; retire the snapshot")
    return data


def show(sdir: Path, key: str, part: str = "generation") -> bytes:
    """The stored bytes of one record of snapshot ``sdir`` (packed or plain), found by its
    record digest or by a candidate id (then the candidate's ``part`` record:
    generation, score or timing). Reads one pack index per panel and one block. Raises
    ArchiveError when no record matches, IntegrityError when its bytes are damaged."""
    sdir = Path(sdir)
    want = key if ":" in key else f"xxh3_128:{key}"
    try:
        manifest = load_manifest(sdir)
    except (OSError, ValueError) as e:
        raise ArchiveError(f"{sdir}: not a complete snapshot ({e}); give a directory under "
                           "work/<study>/snapshots") from e
    sub = {"generation": "records", "score": "scores", "timing": "timing"}[part]
    if "packs" not in manifest:  # an unpacked snapshot of an earlier version
        for rel in sorted(str(r) for r in manifest.get("files", {})):
            if is_record_path(rel):
                rec = read_record(sdir / rel)
                if rec["record_digest"] == want or (rec.get("candidate", {}).get("candidate_id") == want
                                                    and f"/{sub}/" in f"/{rel}"):
                    return (sdir / rel).read_bytes()
    else:
        pack_paths, _ = snapshot_files(sdir, manifest)
        packs = {g: Pack(p) for g, p in sorted(pack_paths.items())}
        for pack in packs.values():
            for m in pack.members.values():
                if m.record_digest == want:
                    return pack.read(m.path)
                if m.candidate_id == want and f"/{sub}/" in f"/{m.path}":
                    return pack.read(m.path)
    raise ArchiveError(f"{sdir}: no record with digest or candidate id {want} (part {part}); record digests "
                       "are the records' record_digest, candidate ids their candidate.candidate_id")
