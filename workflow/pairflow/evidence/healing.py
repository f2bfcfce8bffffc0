"""What a plain rerun must recompute so the results tree verifies: the plan-time check
and its memo, and the heal stamps that make Snakemake rerun a stale output.

When the workflow builds its plan it runs ``verification.check_results`` (videos
re-hashed only when they changed, see below) and forces the outputs whose rerun heals
what it finds (``heal_targets``, ``mark_stale``), so a plain rerun sees what is missing.
Imports without numpy: planning a study imports this module for its stamps.

The plan-time check remembers what it found clean (``scratch/checks/evidence.json``): per
panel, the digest of what the config implies for it and a signature of every file its
check reads, with the roots it found. A panel whose signature and expectations are
unchanged since is not read again. The signature holds each file's (inode, size, mtime,
ctime): every record, video, score, timing and failure record and the panel's two
manifests (one ``stat`` a file, no file read). The kernel sets ctime on every write,
rename, chmod or copy and no call sets it back (``touch -r``, ``os.utime`` and
``rsync -t`` restore mtime only), so an edit of any file through the filesystem changes
the signature even when its size and mtime are put back (ctime moves in the kernel's
timestamp tick, a few ms: an edit within the same tick as the file's last write, with the
plan in between, is the one it cannot see), and a file renamed over another has another
inode. In a panel
checked in full, each video is re-hashed unless its (inode, size, mtime, ctime) and the
digest its record names are the ones it had when it was last hashed and matched
(``videos`` in the memo). A panel with no memo entry yet (the first plan after a run)
starts from what its jobs vouched for when they wrote its manifests (``vouch``): records
whose bytes hash to a vouched manifest's digests are only parsed, videos whose stat is the
vouched one are not re-hashed; a copied tree (new inodes) hashes every video once.

The bound: a file whose bytes change without any write through the filesystem (media
bit rot under an unchanged inode) is seen only by a full re-hash, which ``pairflow
verify`` (``deep``, never the memo nor the vouchers) always does; a verify that finds any
problem drops the memo and the vouchers, so the next plain run checks every panel in full
and re-hashes every video. (Before memo version 3 the signature held the records'
contents: about 17 us a file, most of a no-op plan at 100k candidates; a record's
changed bytes with no write are the same bound as a video's.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import xxhash

from ..atomic import write_text
from ..identity import digest_file, digest_obj
from ..layout import Layout
from ..plan.config import StudySpec
from ..records.vouch import drop_vouchers, stat_key, vouched

if TYPE_CHECKING:
    from .verification import Problem, Report

MEMO_VERSION = 3
PANEL_READS = ("records", "videos", "scores", "timing", "failures")
"""A panel's folders the check reads (besides its two manifests): its memo signature."""


def _signature(files: tuple[Path, ...], folders: tuple[Path, ...] = ()) -> str:
    """Digest of the (inode, size, mtime, ctime) of ``files`` and of every file below
    ``folders`` (one ``scandir`` per folder: no per-candidate paths are built), with
    each symlink's target and each absent path named as such (see the module docstring
    for why a stat is enough). Entries in the order the directory lists them: a
    directory listed in another order without a change signs differently, which costs
    a full check of its panel, never a missed change. Measured: about 5 us per file."""
    h = xxhash.xxh3_128()

    def walk(folder: str) -> None:
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            h.update(f"{folder}\0absent\n".encode())
            return
        lines = [f"{folder}\0dir\n"]
        below = []
        for e in entries:
            try:
                if e.is_symlink():
                    lines.append(f"{e.name}\0link\0{os.readlink(e.path)}\n")
                elif e.is_dir():
                    below.append(e.path)
                else:
                    st = e.stat()
                    lines.append(f"{e.name}\0{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}\n")
            except FileNotFoundError:  # renamed away since the listing (a job's temp file): signed as gone
                lines.append(f"{e.name}\0absent\n")
        h.update("".join(lines).encode("utf-8", "surrogateescape"))
        for sub in below:
            walk(sub)

    for f in files:
        try:
            if os.path.islink(f):
                h.update(f"{f}\0link\0{os.readlink(f)}\n".encode("utf-8", "surrogateescape"))
            h.update(f"{f}\0{stat_key(os.stat(f))}\n".encode("utf-8", "surrogateescape"))
        except FileNotFoundError:
            h.update(f"{f}\0absent\n".encode("utf-8", "surrogateescape"))
    for folder in folders:
        walk(str(folder))
    return f"xxh3_128:{h.hexdigest()}"


def _read_memo(path: Path) -> dict[str, Any]:
    try:
        memo = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return memo if isinstance(memo, dict) and memo.get("version") == MEMO_VERSION else {}


def drop_memo(scratch: Path) -> None:
    """Forget what the plan-time check found clean and what jobs vouched for
    (``pairflow verify`` does when it finds a problem), so the next plain run checks every
    panel in full and re-hashes every video. A tree this process cannot write is left as
    it is."""
    try:
        Layout(scratch).evidence_memo.unlink(missing_ok=True)
        drop_vouchers(scratch)
    except OSError:
        pass


class _Videos:
    """A panel's videos checked at plan time: trusted when (inode, size, mtime, ctime)
    and the recorded digest are the ones seen when the video was last hashed and
    matched, else re-hashed. ``seen`` is what to remember."""

    def __init__(self, old: Any) -> None:
        self.old: dict[str, Any] = old if isinstance(old, dict) else {}
        self.seen: dict[str, list[str]] = {}

    def digest(self, rel: str, video: str, recorded: str) -> str:
        key = stat_key(os.stat(video))
        old = self.old.pop(rel, None)  # asked once per video: what is done is let go
        if old == [key, recorded]:
            self.seen[rel] = old
            return recorded
        actual = digest_file(Path(video))
        if actual == recorded:
            self.seen[rel] = [key, recorded]
        return actual


class _Memo:
    """The ``verification.Shortcuts`` of one plan-time check: what the memo found clean,
    still valid while each panel's signature and expectations (``keys``) are unchanged,
    and what this check finds clean, to remember."""

    def __init__(self, study: StudySpec, expect: str) -> None:
        self.study, self.layout = study, Layout(study.scratch)
        self.old = _read_memo(self.layout.evidence_memo)
        old_videos = self.old.get("videos")
        self.old_videos: dict[str, Any] = old_videos if isinstance(old_videos, dict) else {}
        self.keys = {p.name: digest_obj([study.panel_digest(p.name), expect]) for p in study.panels}
        self.timing_key = digest_obj(sorted(self.keys.values()))
        self.timing_sig = _signature((self.layout.timing_manifest,))
        self.hits: dict[str, dict[str, Any]] = {}
        self.pending: dict[str, dict[str, Any]] = {}
        self.videos: dict[str, _Videos] = {}
        self.vouched: dict[str, dict[str, str]] = {}  # per manifest of a panel checked in full, until asked

    def panel_roots(self, panel: str) -> dict[str, str] | None:
        layout = self.layout
        gm, sm = layout.generation_manifest(panel), layout.score_manifest(panel)
        entry = self.old.get("panels", {}).get(panel)
        sig = _signature((gm, sm), tuple(layout.panel(panel) / kind for kind in PANEL_READS))
        if isinstance(entry, dict) and entry.get("key") == self.keys[panel] and entry.get("files") == sig:
            self.hits[panel] = entry
            return dict(entry["roots"])
        self.pending[panel] = {"key": self.keys[panel], "files": sig}
        # Checked in full: what its jobs vouched for when they wrote its manifests (records
        # and videos they checked); the memo's own video signatures take precedence.
        g_vouched, v_vouched = vouched(self.study.scratch, gm)
        self.vouched[str(gm)], self.vouched[str(sm)] = g_vouched, vouched(self.study.scratch, sm)[0]
        old = self.old_videos.get(panel)
        self.videos[panel] = _Videos({**v_vouched, **(old if isinstance(old, dict) else {})})
        return None

    def vouched_records(self, manifest: Path) -> dict[str, str]:
        if Path(manifest) == self.layout.timing_manifest:
            return vouched(self.study.scratch, manifest)[0]
        return self.vouched.pop(str(manifest), {})  # asked once: let it go (100k records: tens of MB)

    def video_digest(self, panel: str, rel: str, video: str, recorded: str) -> str:
        return self.videos[panel].digest(rel, video, recorded)

    def timing_root(self) -> str | None:
        t_old = self.old.get("timing")
        if (len(self.hits) == len(self.study.panels) and isinstance(t_old, dict)
                and t_old.get("key") == self.timing_key and t_old.get("files") == self.timing_sig):
            return str(t_old["root"])
        return None

    def write(self, report: Report) -> None:
        seen = {name: self.old_videos[name] for name in self.hits if name in self.old_videos}
        seen.update({name: v.seen for name, v in self.videos.items()})
        _write_memo(self.layout, self.study, report, self.old, self.hits, self.pending, report.roots,
                    self.timing_key, self.timing_sig, seen)


def plan_check(study: StudySpec, write: bool = True) -> Report:
    """The plan-time check: ``verification.check_results`` without ``deep``, skipping the
    panels unchanged since it last found them clean and re-hashing a video only when it
    changed since it was last hashed and matched; when ``write``, it records what it
    finds clean now (see the module docstring). Problems only, no notes."""
    # lazy: the check imports numpy (video, metrics); planning imports this module for its
    # stamps and a study with no results tree never runs the check.
    from ..media.recipe import recipe_digest
    from ..plan.candidates import expected_scores
    from .verification import check_results

    rdigest = recipe_digest(study.encoder, study.generation.fps)
    memo = _Memo(study, digest_obj({"recipe": rdigest,
                                    "scores": {a.name: expected_scores(study, a) for a in study.arms}}))
    report = check_results(study, deep=False, shortcuts=memo)
    if write:
        memo.write(report)
    return report


def _write_memo(layout: Layout, study: StudySpec, report: Report, old: dict[str, Any], hits: dict[str, Any],
                pending: dict[str, dict[str, Any]], roots: dict[str, str], timing_key: str, timing_sig: str,
                videos: dict[str, Any]) -> None:
    """Record the panels this check found clean (no problem on any file below the panel's
    folder) beside the ones it skipped, the timing manifest when every panel is clean
    and nothing is wrong with it or any timing record, and every video hashed (or
    trusted) and matched. Written only when it changed."""
    dirty = {(Path(p.file).relative_to(layout.panels).parts or ("",))[0] for p in report.problems
             if Path(p.file).is_relative_to(layout.panels)}
    if "" in dirty:  # the panels folder itself (a symlink): no panel is clean
        dirty = {p.name for p in study.panels}
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


def heal_targets(study: StudySpec, write: bool = True) -> dict[str, list[Problem]]:
    """The workflow outputs a plain rerun must recompute so the tree verifies, with the
    problems each heals (the plan-time check: the memo, videos re-hashed when they
    changed); under ``""`` the problems no rerun heals (extra files, symlinks). Empty
    when the tree is complete or not started. ``write``: update the
    memo (off in a dry run, which writes nothing)."""
    if not Layout(study.scratch).panels.exists():
        return {}
    out: dict[str, list[Problem]] = {}
    for p in plan_check(study, write=write).problems:
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
    if stamps is not None and not stamps:  # no stamp at all (the usual case): no path to build
        return []
    stamp = heal_stamp(scratch, output)
    return [str(stamp)] if (str(stamp) in stamps if stamps is not None else stamp.exists()) else []
