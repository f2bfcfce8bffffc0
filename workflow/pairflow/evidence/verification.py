"""Completeness and consistency of a results tree: what ``pairflow verify`` proves.

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

What a finished candidate is, is decided once, by the checks the stages use on typed
records (``candidates.generation_stale`` and ``scores_stale``, ``records.stale_link`` and
``timing_frames_differ``); this module applies them to the whole tree.

``check_results`` returns one ``Problem`` per violation, each naming its file and the
output whose rerun heals it. The workflow runs the same check when it builds its plan,
through ``healing`` (its memo lets the check skip what it found clean before, the
``Shortcuts`` below), and forces those outputs, so a plain rerun sees what is missing.
Imports without torch.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..atomic import TMP_PREFIX
from ..errors import ConfigError, PairFlowError
from ..generation.provenance import study_from_snapshot
from ..identity import digest_bytes, digest_file, digest_obj
from ..layout import Layout
from ..media.recipe import recipe_digest
from ..plan.candidates import (
    Candidate,
    candidates,
    generation_stale,
    panel_dir,
    scores_stale,
)
from ..plan.config import PanelSpec, StudySpec
from ..records.store import parse_record, read_record, stale_link, timing_frames_differ

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
    "card": "the claim card (altered after sealing, or records generated under another card)",
}
"""Problem kinds, in the order ``pairflow verify`` groups them."""
NOTE_KINDS = {"temp": "temporary files left by an interrupted write (safe to delete)",
              "retired": "retired snapshots (kept, excluded from latest.json)",
              "declared": "generation records made before the workflow sealed claim cards",
              "deviation": "what the records say ran that differs from what the claim card declared"}
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
    roots: dict[str, str] = field(default_factory=dict)
    """The manifests' roots the check read (``generation:<panel>``, ``scores:<panel>``,
    ``timing``), what the study manifest must bind; not part of the verdict."""

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


class Shortcuts(Protocol):
    """What the plan-time check (``healing``'s memo) lets ``check_results`` skip."""

    def panel_roots(self, panel: str) -> dict[str, str] | None:
        """The manifest roots of ``panel`` when it is unchanged since it was found clean
        (then it is not read), else None."""

    def video_digest(self, panel: str, rel: str, video: str, recorded: str) -> str:
        """The digest of ``video`` (``rel`` to its panel), trusted or re-hashed."""

    def timing_root(self) -> str | None:
        """The timing manifest's root when it and every panel are unchanged since found
        clean, else None. Asked after ``panel_roots`` of every panel."""

    def vouched_records(self, manifest: Path) -> dict[str, str]:
        """The digests, by path, of the records the job that wrote ``manifest`` checked
        and vouched for (``vouch``): a record whose bytes hash to it is only parsed as
        JSON. Asked once per manifest of a panel checked in full (after its
        ``panel_roots``) and once for the timing manifest."""


def check_results(study: StudySpec, deep: bool = True, shortcuts: Shortcuts | None = None) -> Report:
    """Completeness and consistency of ``study``'s results tree (see the module docstring).
    ``deep`` (``pairflow verify``) re-hashes every video and lists symlinks anywhere
    (without it, everywhere but inside the per-candidate folders, whose links the checks
    of their panel name); without it, ``shortcuts`` (the plan-time memo, see ``healing``) skips the panels and
    videos it vouches for, and temporary files, which heal nothing, are not collected."""
    report = Report()
    layout = Layout(study.scratch)
    quick = None if deep else shortcuts
    rdigest = recipe_digest(study.encoder, study.generation.fps)
    timing = _Timing(study, report, quick)
    # Panel by panel, nothing of a checked panel is kept past it but its timing records'
    # digests (for the timing manifest's check) and the report: at 100k candidates the
    # candidates and their current records held for a study-wide timing pass cost ~100 MB.
    for panel in study.panels:
        roots = quick.panel_roots(panel.name) if quick is not None else None
        if roots is not None:
            report.roots.update(roots)
            continue
        cands = candidates(study, panel)
        current: dict[str, str] = {}  # the panel's current generation records' digests, by candidate id
        seen: dict[str, str] = {}  # digests of the records read, by path (the manifest check reuses them)
        _check_generation(study, panel, cands, rdigest, current, report, quick, seen)
        _check_scores(study, panel, cands, current, report, quick, seen)
        timing.records(cands, current)
    timing.manifest()
    _check_study(study, layout.study_manifest, report.roots, report)
    _check_panel_folders(study, layout, report)
    # Symlinks anywhere (deep), or (the plan) everywhere but inside the per-candidate
    # folders, where each link is already a problem of a panel checked in full, and a
    # panel the memo skips had none when it was found clean (its signature names links).
    named = {p.file for p in report.problems}
    for link in links(study.scratch, candidates=deep):
        if str(link) not in named:
            what = "folder" if os.path.isdir(link) else "file"
            report.add("symlink", link, f"a symlink (to {os.readlink(link)}); evidence is a regular file inside "
                       f"its tree and the archive refuses links. Replace it with the {what} itself or remove it: "
                       f"rm {shlex.quote(str(link))}")
    # Temp files are notes, which heal nothing: the plan (``shortcuts``) does not walk the tree for them.
    for t in temp_files(study.scratch) if quick is None else []:
        report.add("temp", t, "left by an interrupted write; safe to delete")
    return report


def named(layout: Layout, panel: str, kind: str, cands: list[Candidate]) -> list[str]:
    """``str(layout.output(panel, kind, arm, stem))`` of each of ``cands`` (one panel's),
    built as strings: pathlib per file dominated the check at scale (names are validated:
    no separators)."""
    base, suffix = str(layout.panel(panel)), (".mp4" if kind == "videos" else ".json")
    return [f"{base}/{kind}/{c.arm.name}/{c.stem}{suffix}" for c in cands]


def _check_generation(study: StudySpec, panel: PanelSpec, cands: list[Candidate], rdigest: str,
                      current: dict[str, str], report: Report, quick: Shortcuts | None,
                      seen: dict[str, str]) -> None:
    """A panel's generation records and videos, its generation manifest, its extra files
    and its failure records. Fills ``current`` with each current record's digest and
    ``seen`` with the digests of the records read."""
    layout = Layout(study.scratch)
    pdir = panel_dir(layout, panel.name)
    gm, sm = layout.generation_manifest(panel.name), layout.score_manifest(panel.name)
    vouched = quick.vouched_records(gm) if quick is not None else {}
    # Each candidate's files named once (pathlib per file dominated the check at scale).
    files = list(zip(cands, named(layout, panel.name, "records", cands), strict=True))
    for c, path in files:
        rec = _read(path, report, gm, vouched, seen)
        if rec is None:
            continue
        why = generation_stale(rec, c, rdigest)
        if why:
            report.add("stale", path, why, gm)
            continue
        current[c.key.candidate_id] = rec["record_digest"]  # not the record
        named_video = os.path.join(pdir, rec["video"]["path"])  # a string: a Path only when reported
        if os.path.islink(named_video):
            report.add("symlink", Path(named_video), f"video of {path} is a symlink (to {os.readlink(named_video)}); "
                       "delete the link, the next plain run regenerates the video", gm)
            continue
        if not os.path.isfile(named_video):
            report.add("missing", Path(named_video), f"video of {path} is missing", gm)
            continue
        recorded = rec["video"]["digest"]
        actual = (digest_file(Path(named_video)) if quick is None
                  else quick.video_digest(panel.name, rec["video"]["path"], named_video, recorded))
        if actual != recorded:
            report.add("altered", Path(named_video), f"digest {actual} differs from {recorded} recorded in {path}", gm)
    m = _manifest(gm, [path for _, path in files], report, gm, seen)
    if m is not None:
        report.roots[f"generation:{panel.name}"] = m.get("root_digest", "")
    _extras(pdir, {f for kind in ("records", "videos", "scores", "timing")
                   for f in named(layout, panel.name, kind, cands)}, report)
    for stage, heals in (("generate", gm), ("score", sm)):
        for f in sorted(layout.failures(panel.name, stage).rglob("*.json")):
            if f.name.startswith(TMP_PREFIX):
                continue
            report.add("failure", f, _failure_text(f), heals)


def _check_scores(study: StudySpec, panel: PanelSpec, cands: list[Candidate], current: dict[str, str],
                  report: Report, quick: Shortcuts | None, seen: dict[str, str]) -> None:
    """A panel's score records (bound to the current generation record, the metrics the
    config implies) and its score manifest."""
    layout = Layout(study.scratch)
    sm = Layout(study.scratch).score_manifest(panel.name)
    vouched = quick.vouched_records(sm) if quick is not None else {}
    files = list(zip(cands, named(layout, panel.name, "scores", cands), strict=True))
    for c, path in files:
        rec = _read(path, report, sm, vouched, seen)
        if rec is None:
            continue
        _check_link(path, rec, current.get(c.key.candidate_id), report, sm)
        why = scores_stale(study, c, rec)
        if why:
            report.add("stale", path, why, sm)
    m = _manifest(sm, [path for _, path in files], report, sm, seen)
    if m is not None:
        report.roots[f"scores:{panel.name}"] = m.get("root_digest", "")


class _Timing:
    """The timing records of the checked panels' candidates, panel by panel
    (``records``), then the timing manifest (``manifest``: every panel's candidates),
    unless ``quick`` vouches for the manifest."""

    def __init__(self, study: StudySpec, report: Report, quick: Shortcuts | None) -> None:
        self.study, self.report, self.quick = study, report, quick
        self.layout = Layout(study.scratch)
        self.path = self.layout.timing_manifest
        self.vouched: dict[str, str] | None = None  # asked of ``quick`` before the first record
        self.seen: dict[str, str] = {}

    def records(self, cands: list[Candidate], current: dict[str, str]) -> None:
        if self.vouched is None:
            self.vouched = self.quick.vouched_records(self.path) if self.quick is not None else {}
        paths = named(self.layout, cands[0].key.panel, "timing", cands) if cands else []
        for c, path in zip(cands, paths, strict=True):
            rec = _read(path, self.report, self.path, self.vouched, self.seen)
            if rec is None:
                continue
            _check_link(path, rec, current.get(c.key.candidate_id), self.report, self.path)
            if timing_frames_differ(rec):
                self.report.add("frames", path, "the timed run computed other frames than the bulk run; its "
                                "latency is not reported", self.path)

    def manifest(self) -> None:
        root = self.quick.timing_root() if self.quick is not None else None
        if root is not None:
            self.report.roots["timing"] = root
            return
        self.vouched = None
        every = [f for p in self.study.panels for f in named(self.layout, p.name, "timing", candidates(self.study, p))]
        m = _manifest(self.path, every, self.report, self.path, self.seen)
        if m is not None:
            self.report.roots["timing"] = m.get("root_digest", "")


def _check_panel_folders(study: StudySpec, layout: Layout, report: Report) -> None:
    """Every panel folder belongs to a configured panel."""
    if not layout.panels.is_dir():
        return
    names = {p.name for p in study.panels}
    for d in sorted(layout.panels.iterdir()):
        if d.name not in names and not d.name.startswith(TMP_PREFIX):
            report.add("extra", d, f"panel {d.name!r} is not in the config; its evidence is no longer implied. "
                       f"Remove it: rm -r {shlex.quote(str(d))}")


def _read(path: Path | str, report: Report, heals: Path, vouched: dict[str, str] | None = None,
          seen: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The record at ``path``, checked as ``read_record`` does (else a problem, None).
    ``vouched``: digests a job vouched for (``vouch``); a record whose bytes hash to its
    vouched digest is the one the job checked, so only its JSON is read. ``seen``
    receives the digest of the bytes read (the manifest check reuses it)."""
    p = str(path)
    try:
        st = os.lstat(p)
        if stat.S_ISREG(st.st_mode):
            with open(p, "rb") as fh:
                data = fh.read()
        elif not os.path.isfile(p):  # a folder, a dangling link
            report.add("missing", path, "record is missing", heals)
            return None
        else:
            return read_record(Path(p))  # a link: refused (raises), with the message naming it
    except FileNotFoundError:
        report.add("missing", path, "record is missing", heals)
        return None
    except PairFlowError as e:
        report.add("altered", path, str(e).removeprefix(f"{p}: "), heals)
        return None
    digest = digest_bytes(data)
    if seen is not None:
        seen[p] = digest
    if vouched and vouched.get(p) == digest:
        rec: dict[str, Any] = json.loads(data)
        return rec
    try:
        return parse_record(data, p)  # type: ignore[no-any-return]
    except PairFlowError as e:
        report.add("altered", path, str(e).removeprefix(f"{p}: "), heals)
        return None


def _check_link(path: Path | str, rec: dict[str, Any], gen: str | None, report: Report, heals: Path) -> None:
    """A score or timing record must name its candidate's current generation record
    (``gen``: its digest)."""
    why = stale_link(rec, {"record_digest": gen}) if gen is not None else None
    if why:
        report.add("link", path, why, heals)


def _manifest(path: Path, expected: list[Path] | list[str], report: Report, heals: Path,
              seen: dict[str, str] | None = None) -> dict[str, Any] | None:
    """Check a manifest exists, is unaltered, and lists exactly ``expected`` with their
    current digests (``seen``: digests of files this check read already, by path).
    Returns it (None when missing or unreadable)."""
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
    base = os.path.normpath(path.parent / manifest.get("base", "."))
    # Most files lie below the base (every panel record): cut the prefix instead of relpath's
    # two abspath calls per file.
    want = {(s[len(base) + 1:] if s.startswith(base + os.sep) else os.path.relpath(s, base)): s
            for s in map(str, expected)}
    absent, extra = sorted(set(want) - set(listed)), sorted(set(listed) - set(want))
    if absent or extra:
        report.add("root", path, f"lists {len(listed)} file(s), the config implies {len(want)}"
                   + (f"; not listed: {', '.join(absent[:3])}" if absent else "")
                   + (f"; not implied: {', '.join(extra[:3])}" if extra else ""), heals)
    seen = seen or {}
    for rel in sorted(set(want) & set(listed)):
        f = want[rel]
        actual = seen.get(f) or (digest_file(Path(f)) if os.path.isfile(f) else None)
        if actual is not None and actual != listed[rel]:
            report.add("root", path, f"its root does not match its records: {rel} changed after it was written",
                       heals)
    return manifest


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


def _extras(pdir: Path, implied: set[str], report: Report) -> None:
    """Report every file (or link) in ``pdir``'s per-candidate folders that no current
    candidate implies (``implied``: their paths as strings, below ``str(pdir)``; a
    candidate the config no longer has), with the command that removes it. Temporary
    files are left to ``temp_files``."""
    for kind in EXTRA_READS:
        for dirpath, dirnames, filenames in os.walk(f"{pdir}/{kind}"):
            for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                if name.startswith(TMP_PREFIX) or f"{dirpath}/{name}" in implied:
                    continue
                f = Path(dirpath) / name
                what = f"a symlink (to {os.readlink(f)}) " if f.is_symlink() else ""
                report.add("extra", f, f"{what}not implied by the config (no current candidate is named so); "
                           f"remove it: rm {shlex.quote(str(f))}")


def links(root: Path, candidates: bool = True) -> list[Path]:
    """Symlinks under ``root`` (Parsl run directories skipped), never followed. Without
    ``candidates``, the contents of each panel's per-candidate folders (``EXTRA_READS``,
    hundreds of thousands of files at scale) are not listed, the folders themselves
    are: the plan-time walk costs O(panels), not O(candidates)."""
    out: list[Path] = []
    panels = os.path.join(root, "panels")

    def walk(folder: str) -> None:
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            return
        skip = not candidates and os.path.dirname(folder) == panels
        for e in entries:
            if e.is_symlink():
                out.append(Path(e.path))
            elif e.is_dir() and e.name != "run" and not (skip and e.name in EXTRA_READS):
                walk(e.path)

    walk(str(root))
    return sorted(out)


def temp_files(root: Path) -> list[Path]:
    """``.tmp-*`` files and directories under ``root`` (Parsl run directories skipped)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        out += [Path(dirpath) / n for n in filenames + dirnames if n.startswith(TMP_PREFIX)]
        dirnames[:] = [d for d in dirnames if d != "run" and not d.startswith(TMP_PREFIX)]
    return sorted(out)


def write_verify_json(report: Report, path: Path) -> str:
    return json.dumps({"path": str(path), **report.asdict()}, indent=1, sort_keys=True)
