"""Completeness and consistency of a results tree: what ``pairflow verify`` proves and
what the workflow heals.

A results tree is complete and consistent when every candidate the study's config
implies has its generation record (current candidate id and encoder recipe), its video,
a score record per configured scorer and a timing record; every record names the
current generation record of its candidate; every panel manifest and the timing
manifest list exactly those records with their current digests; the study manifest's
panel roots are the current manifests' roots and the statistics were computed from
them; no failure record is left; no timed run computed other frames than the bulk run;
every file in a panel's per-candidate folders belongs to a current candidate and every
panel folder to a configured panel (else ``extra``, with the ``rm`` that removes it: no
rerun deletes evidence); nothing in the tree is a symlink (evidence is a regular file
inside its tree, what the archive demands; a linked record or video is regenerated).

``check_results`` returns one ``Problem`` per violation, each naming its file and the
output whose rerun heals it. The workflow runs the same check (videos re-hashed only
when they changed, see below) when it builds its plan and forces those outputs, so a
plain rerun sees what is missing (``heal_targets``). Imports without torch.

The plan-time check remembers what it found clean (``scratch/checks/evidence.json``): per
panel, the digest of what the config implies for it and a signature of every file its
check reads, with the roots it found. A panel whose signature and expectations are
unchanged since is not read again. The signature holds the *contents* (xxh3) of every
record, score, timing and failure record and of the panel's two manifests, so an edit
is seen whatever its size and mtime (``touch -r``, ``rsync -t``, bit rot in a record);
for videos it holds (inode, size, mtime, ctime). The kernel sets ctime on every write,
rename, chmod or copy and no call sets it back, so an edit of a video's bytes through
the filesystem changes the signature even when size and mtime are restored. In a panel
checked in full, each video is re-hashed unless its (inode, size, mtime, ctime) and the
digest its record names are the ones it had when it was last hashed and matched
(``videos`` in the memo): the first plan over a new tree hashes every video once.

The bound: a video whose bytes change without any write through the filesystem (media
bit rot under an unchanged inode) is seen only by a full re-hash, which ``pairflow
verify`` (``deep``, never the memo) always does; a verify that finds any problem drops
the memo, so the next plain run checks every panel in full and re-hashes every video.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .atomic import TMP_PREFIX
from .config import StudySpec
from .errors import ConfigError, PairFlowError
from .identity import digest_file, digest_obj
from .layout import Layout
from .records import read_record, stale_link

KINDS = {
    "missing": "missing files",
    "altered": "altered files (digest differs from the one recorded)",
    "stale": "stale records (another candidate, encoder recipe or scorer set than the config implies)",
    "link": "broken links (a record names a generation record that is not current)",
    "root": "manifests that do not match their records",
    "frames": "timed runs whose frames differ from the bulk run (latency dropped for the pair)",
    "failure": "failure records (tasks that failed after their retries)",
    "extra": "extra files (not implied by the config; no rerun removes them)",
    "symlink": "symlinks (evidence is a regular file inside its tree; the archive refuses links)",
    "snapshot": "incomplete or damaged snapshots",
    "latest": "latest.json",
    "config": "study config",
}
"""Problem kinds, in the order ``pairflow verify`` groups them."""
NOTE_KINDS = {"temp": "temporary files left by an interrupted write (safe to delete)",
              "retired": "retired snapshots (kept, excluded from latest.json)"}
"""Findings that do not fail verification."""


@dataclass(frozen=True)
class Problem:
    """One finding: its kind (``KINDS`` or ``NOTE_KINDS``), the file and what is wrong.
    ``heals`` is the workflow output whose rerun repairs it (None: no rerun does)."""

    kind: str
    file: str
    message: str
    heals: str | None = None

    def line(self) -> str:
        return f"{self.kind}: {self.file}: {self.message}"


@dataclass
class Report:
    """What a check found: problems fail verification, notes do not."""

    problems: list[Problem] = field(default_factory=list)
    notes: list[Problem] = field(default_factory=list)

    def add(self, kind: str, file: Path | str, message: str, heals: Path | str | None = None) -> None:
        p = Problem(kind, str(file), message, None if heals is None else str(heals))
        (self.notes if kind in NOTE_KINDS else self.problems).append(p)

    @property
    def ok(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        """Problems grouped by kind (``KINDS`` order), then notes; sorted by file within a kind."""
        order = {k: i for i, k in enumerate([*KINDS, *NOTE_KINDS])}
        items = sorted(self.problems, key=lambda p: (order.get(p.kind, 99), p.file, p.message))
        notes = sorted(self.notes, key=lambda p: (order.get(p.kind, 99), p.file, p.message))
        return [p.line() for p in items] + [f"note: {p.line()}" for p in notes]

    def asdict(self) -> dict[str, Any]:
        return {"ok": self.ok, "problems": [asdict(p) for p in self.problems],
                "notes": [asdict(p) for p in self.notes]}


def recorded_study(scratch: Path) -> StudySpec:
    """The study config recorded in a results tree: the study manifest's snapshot, else
    any panel generation manifest's. Raises ConfigError naming the fix when none is found."""
    scratch = Path(scratch)
    layout = Layout(scratch)
    candidates = [layout.study_manifest, *sorted(layout.panels.glob("*/generation.json"))]
    for path in candidates:
        try:
            snap = json.loads(path.read_text())["config"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        return study_from_snapshot(snap, scratch)
    raise ConfigError(f"{scratch}: no manifest records the study config (looked in {candidates[0]} and "
                      "panels/*/generation.json); pass the study's config: pairflow verify "
                      f"{scratch} --configfile config/config.yaml")


# ---------------------------------------------------------------------------- results tree

def _read(path: Path, report: Report, heals: Path) -> dict[str, Any] | None:
    if not path.is_file():
        report.add("missing", path, "record is missing", heals)
        return None
    try:
        return read_record(path)
    except PairFlowError as e:
        report.add("altered", path, str(e).removeprefix(f"{path}: "), heals)
        return None


def _check_link(path: Path, rec: dict[str, Any], gen: dict[str, Any] | None, report: Report, heals: Path) -> None:
    """A score or timing record must name its candidate's current generation record."""
    why = stale_link(rec, gen) if gen is not None else None
    if why:
        report.add("link", path, why, heals)


def _manifest(path: Path, expected: list[Path], report: Report, heals: Path) -> dict[str, Any] | None:
    """Check a manifest exists, is unaltered, and lists exactly ``expected`` with their
    current digests. Returns it (None when missing or unreadable)."""
    if not path.is_file():
        report.add("missing", path, "manifest is missing", heals)
        return None
    try:
        manifest: dict[str, Any] = json.loads(path.read_text())
        body = {k: v for k, v in manifest.items() if k != "root_digest"}
        listed = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        report.add("altered", path, f"unreadable manifest ({e})", heals)
        return None
    if digest_obj(body) != manifest.get("root_digest"):
        report.add("altered", path, "root digest mismatch: the manifest itself was altered", heals)
    base = path.parent / manifest.get("base", ".")
    want = {os.path.relpath(f, base): f for f in expected}
    absent, extra = sorted(set(want) - set(listed)), sorted(set(listed) - set(want))
    if absent or extra:
        report.add("root", path, f"lists {len(listed)} file(s), the config implies {len(want)}"
                   + (f"; not listed: {', '.join(absent[:3])}" if absent else "")
                   + (f"; not implied: {', '.join(extra[:3])}" if extra else ""), heals)
    for rel in sorted(set(want) & set(listed)):
        f = want[rel]
        if f.is_file() and digest_file(f) != listed[rel]:
            report.add("root", path, f"its root does not match its records: {rel} changed after it was written",
                       heals)
    return manifest


MEMO_VERSION = 2
PANEL_READS = ("records", "videos", "scores", "timing", "failures")
"""A panel's folders the check reads (besides its two manifests): its memo signature."""
STAT_READS = ("videos",)
"""Folders signed by (inode, size, mtime, ctime) instead of content (see the module docstring)."""


def _stat_key(st: os.stat_result) -> str:
    return f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def _signature(files: tuple[Path, ...], folders: tuple[Path, ...] = ()) -> str:
    """Digest of the contents of ``files`` and of every file below ``folders`` (one
    ``scandir`` per folder: no per-candidate paths are built), except below a
    ``STAT_READS`` folder, whose files are signed by (inode, size, mtime, ctime).
    Measured: about 17 us per record file (open, read, xxh3), 5 us per stat."""
    import xxhash

    h = xxhash.xxh3_128()

    def content(path: str) -> None:
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            h.update(f"{path}\0absent\n".encode())
            return
        h.update(f"{path}\0{len(data)}\0".encode())
        h.update(data)

    def walk(folder: str, by_stat: bool) -> None:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except FileNotFoundError:
            h.update(f"{folder}\0absent\n".encode())
            return
        for e in entries:
            if e.is_symlink():
                h.update(f"{e.path}\0link\0{os.readlink(e.path)}\n".encode())
            elif e.is_dir():
                walk(e.path, by_stat)
            elif by_stat:
                h.update(f"{e.path}\0{_stat_key(e.stat())}\n".encode())
            else:
                content(e.path)

    for f in files:
        content(str(f))
    for folder in folders:
        walk(str(folder), folder.name in STAT_READS)
    return f"xxh3_128:{h.hexdigest()}"


def _read_memo(path: Path) -> dict[str, Any]:
    try:
        memo = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return memo if isinstance(memo, dict) and memo.get("version") == MEMO_VERSION else {}


def drop_memo(scratch: Path) -> None:
    """Forget what the plan-time check found clean (``pairflow verify`` does when it finds
    a problem), so the next plain run checks every panel in full and re-hashes every
    video. A tree this process cannot write is left as it is."""
    try:
        Layout(scratch).evidence_memo.unlink(missing_ok=True)
    except OSError:
        pass


class _Videos:
    """A panel's videos checked at plan time: trusted when (inode, size, mtime, ctime)
    and the recorded digest are the ones seen when the video was last hashed and
    matched, else re-hashed. ``seen`` is what to remember."""

    def __init__(self, old: Any) -> None:
        self.old: dict[str, Any] = old if isinstance(old, dict) else {}
        self.seen: dict[str, list[str]] = {}

    def digest(self, rel: str, video: Path, recorded: str) -> str:
        key = _stat_key(video.stat())
        if self.old.get(rel) == [key, recorded]:
            actual = recorded
        else:
            actual = digest_file(video)
        if actual == recorded:
            self.seen[rel] = [key, recorded]
        return actual


def check_results(study: StudySpec, deep: bool = True, memo: bool = False, write: bool = True) -> Report:
    """Completeness and consistency of ``study``'s results tree (see the module docstring).
    ``deep`` re-hashes every video; without it (what the workflow does when it plans a
    run) a video is re-hashed only when it changed since it was last hashed and matched
    (the memo's ``videos``; every one when ``memo`` is off). ``memo`` (only without
    ``deep``) skips panels unchanged since this check last found them clean and, when
    ``write``, records what it finds clean now (see the module docstring); it collects
    problems only, not notes (temporary files), which heal nothing."""
    from .candidates import candidates, expected_scores, panel_dir, record_path, score_path, timing_path, video_path
    from .video import recipe_digest

    report = Report()
    scratch = study.scratch
    layout = Layout(scratch)
    timing_manifest, study_manifest = layout.timing_manifest, layout.study_manifest
    rdigest = recipe_digest(study.encoder, study.generation.fps)
    roots: dict[str, str] = {}
    all_cands = []
    current: dict[str, dict[str, Any]] = {}
    use_memo = memo and not deep
    old = _read_memo(layout.evidence_memo) if use_memo else {}
    old_videos: dict[str, Any] = old["videos"] if isinstance(old.get("videos"), dict) else {}
    videos: dict[str, _Videos] = {}
    expect = digest_obj({"recipe": rdigest, "scores": {a.name: expected_scores(study, a) for a in study.arms}})
    keys = {p.name: digest_obj([study.panel_digest(p.name), expect]) for p in study.panels} if use_memo else {}
    pending: dict[str, dict[str, Any]] = {}
    hits: dict[str, dict[str, Any]] = {}
    timing_sig = _signature((timing_manifest,)) if use_memo else ""
    for panel in study.panels:
        pdir = panel_dir(study, panel.name)
        gm, sm = layout.generation_manifest(panel.name), layout.score_manifest(panel.name)
        if use_memo:
            entry = old.get("panels", {}).get(panel.name)
            sig = _signature((gm, sm), tuple(pdir / kind for kind in PANEL_READS))
            if isinstance(entry, dict) and entry.get("key") == keys[panel.name] and entry.get("files") == sig:
                roots.update(entry["roots"])
                hits[panel.name] = entry
                continue
            pending[panel.name] = {"key": keys[panel.name], "files": sig}
        vids = videos[panel.name] = _Videos(old_videos.get(panel.name))
        cands = candidates(study, panel)
        all_cands += cands
        for c in cands:
            path = record_path(study, c)
            rec = _read(path, report, gm)
            if rec is None:
                continue
            if rec.get("candidate", {}).get("candidate_id") != c.key.candidate_id:
                report.add("stale", path, f"names candidate {rec.get('candidate', {}).get('candidate_id')}, the config "
                           f"implies {c.key.candidate_id}", gm)
                continue
            if rec.get("encoder", {}).get("recipe_digest") != rdigest:
                report.add("stale", path, f"written with encoder recipe {rec.get('encoder', {}).get('recipe_digest')}, "
                           f"the recipe that runs now is {rdigest}", gm)
                continue
            current[c.key.candidate_id] = {"record_digest": rec["record_digest"]}  # not the record: 100k of them
            video = pdir / rec["video"]["path"]
            if video.is_symlink():
                report.add("symlink", video, f"video of {path} is a symlink (to {os.readlink(video)}); delete the "
                           "link, the next plain run regenerates the video", gm)
                continue
            if not video.is_file():
                report.add("missing", video, f"video of {path} is missing", gm)
                continue
            recorded = rec["video"]["digest"]
            actual = digest_file(video) if deep else vids.digest(rec["video"]["path"], video, recorded)
            if actual != recorded:
                report.add("altered", video, f"digest {actual} differs from {recorded} recorded in {path}", gm)
        m = _manifest(gm, [record_path(study, c) for c in cands], report, gm)
        if m is not None:
            roots[f"generation:{panel.name}"] = m.get("root_digest", "")
        _extras(pdir, {f for c in cands for f in (record_path(study, c), video_path(study, c), score_path(study, c),
                                                  timing_path(study, c))}, report)
        for stage, heals in (("generate", gm), ("score", sm)):
            for f in sorted(layout.failures(panel.name, stage).rglob("*.json")):
                if f.name.startswith(TMP_PREFIX):
                    continue
                report.add("failure", f, _failure_text(f), heals)
        for c in cands:
            path = score_path(study, c)
            rec = _read(path, report, sm)
            if rec is None:
                continue
            _check_link(path, rec, current.get(c.key.candidate_id), report, sm)
            if sorted(rec.get("scores", {})) != expected_scores(study, c.arm):
                report.add("stale", path, f"scores {sorted(rec.get('scores', {}))}, the config implies "
                           f"{expected_scores(study, c.arm)}", sm)
        m = _manifest(sm, [score_path(study, c) for c in cands], report, sm)
        if m is not None:
            roots[f"scores:{panel.name}"] = m.get("root_digest", "")
    for c in all_cands:
        path = timing_path(study, c)
        rec = _read(path, report, timing_manifest)
        if rec is None:
            continue
        _check_link(path, rec, current.get(c.key.candidate_id), report, timing_manifest)
        if rec.get("sampled", True) and rec.get("matches_bulk_frames") is not True:
            report.add("frames", path, "the timed run computed other frames than the bulk run; its latency is not "
                       "reported", timing_manifest)
    timing_key = digest_obj(sorted(keys.values()))
    t_old = old.get("timing")
    if (use_memo and len(hits) == len(study.panels) and isinstance(t_old, dict)
            and t_old.get("key") == timing_key and t_old.get("files") == timing_sig):
        roots["timing"] = t_old["root"]
    else:
        every = [c for p in study.panels for c in (candidates(study, p) if p.name in hits else [])] + all_cands
        m = _manifest(timing_manifest, [timing_path(study, c) for c in every], report, timing_manifest)
        if m is not None:
            roots["timing"] = m.get("root_digest", "")
    _check_study(study, study_manifest, roots, report)
    if layout.panels.is_dir():
        names = {p.name for p in study.panels}
        for d in sorted(layout.panels.iterdir()):
            if d.name not in names and not d.name.startswith(TMP_PREFIX):
                report.add("extra", d, f"panel {d.name!r} is not in the config; its evidence is no longer implied. "
                           f"Remove it: rm -r {shlex.quote(str(d))}")
    if deep:
        named = {p.file for p in report.problems}
        for link in links(scratch):
            if str(link) not in named:
                report.add("symlink", link, f"a symlink (to {os.readlink(link)}); evidence is a regular file inside "
                           f"its tree and the archive refuses links. Replace it with the file itself or remove it: "
                           f"rm {shlex.quote(str(link))}")
    # Temp files are notes, which heal nothing: the plan (``memo``) does not walk the tree for them.
    for t in temp_files(scratch) if not use_memo else []:
        report.add("temp", t, "left by an interrupted write; safe to delete")
    if use_memo and write:
        seen = {name: old_videos[name] for name in hits if name in old_videos}
        seen.update({name: v.seen for name, v in videos.items()})
        _write_memo(layout, study, report, old, hits, pending, roots, timing_key, timing_sig, seen)
    return report


def _write_memo(layout: Layout, study: StudySpec, report: Report, old: dict[str, Any], hits: dict[str, Any],
                pending: dict[str, dict[str, Any]], roots: dict[str, str], timing_key: str, timing_sig: str,
                videos: dict[str, Any]) -> None:
    """Record the panels this check found clean (no problem on any file below the panel's
    folder) beside the ones it skipped, the timing manifest when every panel is clean
    and nothing is wrong with it or any timing record, and every video hashed (or
    trusted) and matched. Written only when it changed."""
    from .atomic import write_text

    dirty = {Path(p.file).relative_to(layout.panels).parts[0] for p in report.problems
             if Path(p.file).is_relative_to(layout.panels)}
    panels = dict(hits)
    for name, entry in pending.items():
        if name not in dirty:
            panels[name] = {**entry, "roots": {k: roots[k] for k in (f"generation:{name}", f"scores:{name}")
                                               if k in roots}}
    timing_ok = (len(panels) == len(study.panels) and "timing" in roots
                 and not any(p.heals == str(layout.timing_manifest) for p in report.problems))
    memo = {"version": MEMO_VERSION, "panels": panels, "videos": videos,
            "timing": {"key": timing_key, "files": timing_sig, "root": roots["timing"]} if timing_ok else None}
    if memo != old:
        write_text(layout.evidence_memo, json.dumps(memo, sort_keys=True) + "\n")


def _check_study(study: StudySpec, path: Path, roots: dict[str, str], report: Report) -> None:
    """The study manifest binds the current panel roots and the statistics computed from them."""
    layout = Layout(study.scratch)
    stats = [layout.study_stats, layout.study_table(), layout.study_table(".html")]
    for p in study.panels:
        stats += [layout.panel_stats(p.name), layout.panel_table(p.name), layout.panel_table(p.name, ".html")]
    m = _manifest(path, stats, report, path)
    if m is None:
        return
    recorded = m.get("panel_roots", {})
    for name in sorted(set(recorded) | set(roots)):
        if recorded.get(name) != roots.get(name):
            report.add("root", path, f"panel root {name} is {recorded.get(name)}, the current manifest's is "
                       f"{roots.get(name)}", path)
    tables: list[tuple[Path, list[str] | None]] = [(layout.study_stats, None)]
    tables += [(layout.panel_stats(p.name), [f"generation:{p.name}", f"scores:{p.name}"])
               for p in study.panels]
    for stats_json, names in tables:
        try:
            provenance = json.loads(stats_json.read_text()).get("provenance")
        except (OSError, ValueError, AttributeError):
            continue  # reported above as missing or altered
        provenance = provenance if isinstance(provenance, dict) else {}
        # The study's statistics bind every root; a panel's, its own generation and scores roots.
        expected = set(provenance) | set(roots) if names is None else set(names)
        for name in sorted(expected):
            if provenance.get(name) != roots.get(name):
                report.add("root", stats_json, f"computed from panel root {name} {provenance.get(name)}, the "
                           f"current manifest's is {roots.get(name)}", path)


def _failure_text(path: Path) -> str:
    try:
        f = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return f"unreadable failure record ({e})"
    slot = f.get("slot")
    if isinstance(slot, dict):  # a worker's slot identity: host and GPU index or worker rank
        f["slot"] = f"{slot.get('host')}/" + (f"gpu{slot['gpu_index']}" if slot.get("gpu_index")
                                             else f"cpu{slot.get('rank')}")
    who = ", ".join(f"{k} {f[k]}" for k in ("candidate_id", "arm", "prompt_id", "seed", "slot", "attempts") if k in f)
    return f"{f.get('label', '?')} failed [{f.get('class', '?')}] ({who}): {f.get('message', '')[:300]}"


EXTRA_READS = ("records", "videos", "scores", "timing")
"""A panel's per-candidate folders: a file there that no current candidate names is extra."""


def _extras(pdir: Path, implied: set[Path], report: Report) -> None:
    """Report every file (or link) in ``pdir``'s per-candidate folders that no current
    candidate implies (a candidate the config no longer has), with the command that
    removes it. Temporary files are left to ``temp_files``."""
    for kind in EXTRA_READS:
        for dirpath, dirnames, filenames in os.walk(pdir / kind):
            for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                f = Path(dirpath) / name
                if name.startswith(TMP_PREFIX) or f in implied:
                    continue
                what = f"a symlink (to {os.readlink(f)}) " if f.is_symlink() else ""
                report.add("extra", f, f"{what}not implied by the config (no current candidate is named so); "
                           f"remove it: rm {shlex.quote(str(f))}")


def links(root: Path) -> list[Path]:
    """Symlinks under ``root`` (Parsl run directories skipped), never followed."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        out += [Path(dirpath) / n for n in filenames + dirnames if os.path.islink(os.path.join(dirpath, n))]
        dirnames[:] = [d for d in dirnames if d != "run"]
    return sorted(out)


def temp_files(root: Path) -> list[Path]:
    """``.tmp-*`` files and directories under ``root`` (Parsl run directories skipped)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        out += [Path(dirpath) / n for n in filenames + dirnames if n.startswith(TMP_PREFIX)]
        dirnames[:] = [d for d in dirnames if d != "run" and not d.startswith(TMP_PREFIX)]
    return sorted(out)


def heal_targets(study: StudySpec, write: bool = True) -> dict[str, list[Problem]]:
    """The workflow outputs a plain rerun must recompute so the tree verifies, with the
    problems each heals (the plan-time check: the memo, videos re-hashed when they
    changed); under ``""`` the problems no rerun heals (extra files, symlinks). Empty
    when the tree is complete or not started. ``write``: update the
    memo (off in a dry run, which writes nothing)."""
    if not Layout(study.scratch).panels.exists():
        return {}
    out: dict[str, list[Problem]] = {}
    for p in check_results(study, deep=False, memo=True, write=write).problems:
        out.setdefault(p.heals or "", []).append(p)
    return out


def heal_stamp(scratch: Path, output: str | Path, folder: Path | None = None) -> Path:
    """The stamp file of one workflow output (``scratch/heal/<output path with -->.txt``,
    or the same name under ``folder``)."""
    rel = os.path.relpath(output, scratch).replace(os.sep, "--")
    return (Layout(scratch).heal if folder is None else Path(folder)) / f"{rel}.txt"


def mark_stale(study: StudySpec, folder: Path | None = None, unhealed: list[Problem] | None = None) -> dict[str, Path]:
    """Touch the heal stamp of every existing output the check finds stale, writing the
    problems into it. Each rule takes its output's stamp as an input when it exists
    (``stamp_input``), so a stamp newer than the output makes Snakemake rerun that job
    and, through the updated output, everything downstream. Outputs that are missing
    need no stamp: ``rule all`` lists every manifest, so Snakemake rebuilds them.

    ``folder``: a dry run's stamps, outside the results tree (the dry run writes nothing
    there: neither stamps nor the memo); the stamp named there differs from the one a
    real run records as the job's input, so the dry run shows the job. ``unhealed``
    receives the problems no rerun heals (the run names them). Returns the stamps
    written by output."""
    from .atomic import write_text

    written = {}
    for output, problems in sorted(heal_targets(study, write=folder is None).items()):
        if not output:
            if unhealed is not None:
                unhealed += problems
            continue
        if not Path(output).exists():
            continue
        stamp = heal_stamp(study.scratch, output, folder)
        write_text(stamp, f"{output} is recomputed by the next run: it does not match its evidence\n"
                   + "".join(f"{p.line()}\n" for p in problems))
        written[output] = stamp
    return written


def heal_stamps(scratch: Path) -> frozenset[str]:
    """The heal stamps that exist now (one listing, for ``stamp_input``)."""
    folder = Layout(scratch).heal
    return frozenset(str(folder / n) for n in os.listdir(folder)) if folder.is_dir() else frozenset()


def stamp_input(scratch: Path, output: str, stamps: frozenset[str] | None = None,
                stale: dict[str, Path] | None = None) -> list[str]:
    """Input-function helper: ``[stamp]`` when ``output``'s heal stamp exists (in
    ``stamps``, a ``heal_stamps`` listing, when given: a lookup instead of a stat per
    job), else ``[]``; a dry run's stamp (``stale``, from ``mark_stale``) instead when
    there is one."""
    if stale and output in stale:
        return [str(stale[output])]
    stamp = heal_stamp(scratch, output)
    return [str(stamp)] if (str(stamp) in stamps if stamps is not None else stamp.exists()) else []


def write_verify_json(report: Report, path: Path) -> str:
    return json.dumps({"path": str(path), **report.asdict()}, indent=1, sort_keys=True)
