"""The ``archive`` section of ``benchmarks/run.py``: a packed snapshot against the
unpacked layout (every file plain, as PairFlow archived before packs) on the same
synthetic finished study (``sections.common.write_evidence``, the ``plan`` section's factory).

Per point: files and bytes (apparent and allocated) per snapshot, bytes per candidate,
promotion and full-verify wall time and peak RSS (each in its own process, under
``/usr/bin/time``), and what a re-promotion adds after one panel was rerun (its prompts
changed: every record of that panel, its manifests and the study-level files differ).
Beside the evidence, the tree holds what a real run leaves on scratch (``bookkeeping``):
each panel job's log, benchmark and job account, the study jobs' accounts, the plan's
memo and the archive job's own log and account. Every file of a snapshot is counted
(its folder, every pack it lists, its chunk packs): the goal is at most three packs a
panel plus ``STUDY_FILES`` others, whatever the number of panels.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sections.common import ROOT, scale_project, write_evidence  # the synthetic study (the plan section's)

os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "workflow"), *filter(None, [os.environ.get("PYTHONPATH")])])

ARCHIVE_SIZES = {"31k": 500, "100k": 1613}
"""Panels of 31 prompts x 1 seed x 2 arms, as the ``plan`` section: 31,000 and 100,006 candidates."""
STUDY_FILES = 16
"""Files a snapshot may hold besides three packs a panel, whatever the panel count (its
``archive.json``, the study-level plain files, the accounts pack, the chunk packs)."""
STUDY_JOBS = ("check_arms", "calibrate", "timed_pass", "study_stats", "plots", "gallery", "utilisation")


def bookkeeping(scratch: Path, panels: list[str], run: int) -> None:
    """What run ``run`` of the workflow leaves on scratch beside the evidence: each of
    ``panels``' job log, benchmark and job account, an account per study-level job, the
    plan-time memo, and the archive job's own log and account (the last two are not
    evidence and must not be archived)."""
    def put(rel: str, text: str) -> None:
        (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
        (scratch / rel).write_text(text)

    ms = 1796425200000 + run * 10_000_000
    account = {"kind": "job-account", "status": "ok", "run": run, "notes": {}}
    for i, panel in enumerate(panels):
        put(f"logs/generate-score/{panel}.log", f"run {run}: generate and score {panel}\n" * 20)
        put(f"benchmarks/generate_score_panel/{panel}.tsv", f"s\th:m:s\n{run}.0\t0:00:0{run}\n")
        put(f"accounts/job-generate_score_panel-panel={panel}-{ms + i}-{1000 + i}.json",
            json.dumps({**account, "job": f"generate_score_panel-panel={panel}"}, indent=1) + "\n")
    for i, rule in enumerate(STUDY_JOBS):
        put(f"accounts/job-{rule}-{ms + 9_000_000 + i}-{900 + i}.json", json.dumps({**account, "job": rule}) + "\n")
        put(f"logs/{rule}.log", f"run {run}: {rule}\n")
    put("checks/evidence.json", json.dumps({"version": 3, "run": run, "panels": {p: {} for p in panels}}) + "\n")
    put("logs/archive.log", f"run {run}: archive\n")
    put(f"accounts/job-archive-{ms + 9_999_999}-99.json", json.dumps({**account, "job": "archive"}) + "\n")

PLAIN = """
import json, shutil, sys
from pathlib import Path
from pairflow.evidence.archive import REGENERATE, evidence_files, make_read_only
from pairflow.atomic import atomic_path, write_text
from pairflow.identity import digest_file, digest_obj
from pairflow.records.store import build_manifest, write_manifest
# The promotion as PairFlow did it before packs: every file copied plain (temp, fsync,
# rename), byte-verified, listed with the videos in archive.json.
src, dest = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
files = evidence_files(src)
digests = {f.relative_to(src).as_posix(): digest_file(f) for f in files}
snap = dest / "snapshots" / digest_obj(digests).split(":", 1)[1][:16]
for rel, want in digests.items():
    with atomic_path(snap / rel) as tmp:
        shutil.copyfile(src / rel, tmp)
        assert digest_file(tmp) == want
videos = {}
for rel in digests:
    if "/records/" in rel:
        rec = json.loads((src / rel).read_text())
        videos[(Path(rel).parents[2] / rec["video"]["path"]).as_posix()] = rec["video"]["digest"]
m = build_manifest("archive", snap, [snap / r for r in digests], {"videos_on_scratch": videos, "regenerate": REGENERATE})
write_manifest(snap / "archive.json", m)
make_read_only(snap)
write_text(dest / "latest.json", json.dumps({"snapshot": f"snapshots/{snap.name}", "root_digest": m["root_digest"]}))
"""
PACKED = "import sys; from pathlib import Path; from pairflow.evidence.archive import promote; promote(Path(sys.argv[1]), Path(sys.argv[2]))"
VERIFY = ("import sys; from pathlib import Path; from pairflow.evidence.archive import verify_archive; "
          "r = verify_archive(Path(sys.argv[1])); print(len(r.problems)); sys.exit(0 if r.ok else 1)")


def _tree(paths: list[Path]) -> dict[str, int]:
    """Files, apparent bytes and allocated bytes (st_blocks) under ``paths``."""
    n = size = alloc = 0
    for root in paths:
        found = ([str(root)] if root.is_file() else  # one file, or every file under a folder
                 [os.path.join(d, name) for d, _dirs, names in os.walk(root) for name in names])
        for f in found:
            st = os.lstat(f)
            n, size, alloc = n + 1, size + st.st_size, alloc + st.st_blocks * 512
    return {"files": n, "bytes": size, "allocated_bytes": alloc}


def _snapshot_paths(work: Path, snap: Path) -> list[Path]:
    """The snapshot directory and, for a packed one, the packs it lists (the panels' and
    the chunk packs of its large study-level files)."""
    from pairflow.evidence.archive import load_manifest, snapshot_files

    manifest = load_manifest(snap)
    return [snap, *(snapshot_files(snap, manifest)[0].values() if "packs" in manifest else []),
            *_chunk_packs(snap)]


def _chunk_packs(snap: Path) -> list[Path]:
    manifest = json.loads((snap / "archive.json").read_text())
    return [Path(os.path.normpath(snap / p)) for p in (manifest.get("packing") or {}).get("chunk_packs", [])]


def _latest(work: Path) -> Path:
    return work / json.loads((work / "latest.json").read_text())["snapshot"]


def _py(code: str, *args: Path) -> tuple[float, float, float]:
    """Wall seconds, peak RSS (MiB) and CPU seconds (user + system) of ``code`` in a child
    process: on a shared machine the CPU time is what the work costs, the wall time what
    it took beside the other load."""
    t = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "%M %U %S", sys.executable, "-c", code, *map(str, args)],
                          capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    rss_kb, user, system = proc.stderr.strip().splitlines()[-1].split()
    return wall, int(rss_kb) / 1024, float(user) + float(system)


def _layout(code: str, scratch: Path, work: Path, candidates: int) -> dict[str, Any]:
    promote_s, promote_rss, promote_cpu = _py(code, scratch, work)
    snap = _latest(work)
    size = _tree(_snapshot_paths(work, snap))
    load = os.getloadavg()[0]  # the machine is shared: say how loaded it was beside the wall time
    verify_s, verify_rss, verify_cpu = _py(VERIFY, work)
    return {**size, "bytes_per_candidate": size["bytes"] / candidates,
            "allocated_bytes_per_candidate": size["allocated_bytes"] / candidates,
            "promote_s": promote_s, "promote_peak_rss_mib": promote_rss, "promote_cpu_s": promote_cpu,
            "verify_s": verify_s, "verify_peak_rss_mib": verify_rss, "verify_cpu_s": verify_cpu,
            "verify_load_average": (load + os.getloadavg()[0]) / 2}


def archive_point(panels: int, prompts: int, plain: bool = True) -> dict[str, Any]:
    """Both layouts on one synthetic finished study of ``panels`` x ``prompts`` x 1 seed x
    2 arms, then a one-panel rerun re-promoted into each. Without ``plain`` the plain
    layout is not run (its fsync per file takes most of an hour at 100,000 candidates
    on a shared disk): its files and bytes are those of the evidence it would copy, and
    each re-promotion would add all of them again."""
    proj = scale_project(panels, prompts)
    t = time.perf_counter()
    write_evidence(proj)
    scratch, n = proj / "results" / "scratch", panels * prompts * 2
    bookkeeping(scratch, [f"p{i:03d}" for i in range(panels)], 1)
    write_s = time.perf_counter() - t
    src = _tree([scratch])
    tmp = Path(tempfile.mkdtemp())
    point: dict[str, Any] = {"candidates": n, "panels": panels, "write_tree_s": write_s,
                             "scratch_evidence": src}
    if plain:
        point["plain"] = _layout(PLAIN, scratch, tmp / "plain", n)
    else:  # counted, not run: one plain copy of every evidence file (archive.json not counted)
        from pairflow.evidence.archive import evidence_files

        ev = _tree(evidence_files(scratch))
        point["plain"] = {**ev, "counted_not_run": True, "bytes_per_candidate": ev["bytes"] / n,
                          "allocated_bytes_per_candidate": ev["allocated_bytes"] / n,
                          "repromote_added_files": ev["files"], "repromote_added_bytes": ev["bytes"]}
    point["packed"] = _layout(PACKED, scratch, tmp / "packed", n)
    # Rerun one panel: new prompt texts give it new candidates, records and manifests.
    sheet = proj / "config" / "panels" / "p000.tsv"
    sheet.write_text(sheet.read_text().replace("prompt 0 ", "prompt 0 rerun "))
    write_evidence(proj)
    bookkeeping(scratch, ["p000"], 2)  # the panel's job, the study jobs after it, a new plan and archive job
    for name, code in (("plain", PLAIN), ("packed", PACKED))[0 if plain else 1:]:
        work = tmp / name
        before = _tree([work])
        wall, _rss, _cpu = _py(code, scratch, work)
        after = _tree([work])
        point[name]["repromote_s"] = wall
        point[name]["repromote_added_files"] = after["files"] - before["files"]
        point[name]["repromote_added_bytes"] = after["bytes"] - before["bytes"]
    snap = _latest(tmp / "packed")
    from pairflow.evidence.archive import load_manifest, snapshot_files

    packing = snapshot_files(snap, load_manifest(snap))[0]
    panel_packs = [p for g, p in packing.items() if g.startswith("panels/p000/")]
    point["packed"]["rerun_panel_packed_bytes"] = sum(p.stat().st_size for p in panel_packs)
    point["packed"]["repromote_added_over_panel_packed"] = (point["packed"]["repromote_added_bytes"]
                                                            / point["packed"]["rerun_panel_packed_bytes"])
    every = _tree(_snapshot_paths(tmp / "packed", snap))  # every file: its folder, its packs, its chunk packs
    point["packed"]["files_after_repromotion"] = every["files"]
    point["packed"]["files_beyond_panel_packs"] = every["files"] - 3 * panels
    point["packed"]["panel_packs"] = sum(1 for g in packing if g.startswith("panels/"))
    point["packed"]["largest_study_level_files"] = {  # what a re-promotion writes besides the panel's packs
        f.relative_to(snap).as_posix(): f.stat().st_size
        for f in sorted((f for f in snap.rglob("*") if f.is_file()), key=lambda f: -f.stat().st_size)[:4]}
    for p in (tmp, proj):
        for dirpath, dirs, _names in os.walk(p):  # promoted snapshots are read-only
            for d in dirs:
                os.chmod(os.path.join(dirpath, d), 0o755)
        shutil.rmtree(p)
    return point


def bench_archive(runs: int, quick: bool = False) -> dict[str, Any]:
    """Packed against plain snapshots at 31,000 and 100,006 candidates (plain counted, not
    run, at 100,006); quick: 10 panels of 5 prompts. One run per point (minutes each)."""
    if quick:
        return {"points": {"quick": archive_point(10, 5)}}
    return {"points": {k: archive_point(p, 31, plain=k == "31k") for k, p in ARCHIVE_SIZES.items()}}


def render(a: dict[str, Any] | None) -> list[str]:
    """The BENCHMARKS.md section for these figures ([] when not measured)."""
    if not a or "skipped" in a:
        return []
    out = ["## Archive: packed against plain snapshots (issue 29)", "",
           "A synthetic finished study (the `plan` section's factory: panels of 31 prompts x 1 seed x 2 arms, "
           "compact JSON records from the test suite's factories) promoted into each layout, then verified in full "
           "(`verify_archive`: every record's digest and schema, every manifest). Each step runs in its own process "
           "under `/usr/bin/time`. Plain: the layout before packs (every file copied, fsynced and listed in "
           "`archive.json`). Re-promotion: one panel rerun (new prompts: all its records, its manifests and the "
           "study-level files change), promoted again into the same archive.", "",
           "| candidates | layout | files | MB | bytes per candidate (allocated) | promote wall s (peak RSS MiB, CPU s) | "
           "full verify wall s (peak RSS MiB, CPU s, load average) | re-promotion adds: files, MB (x the panel's packs) |",
           "|---|---|---|---|---|---|---|---|"]
    for x in sorted(a["points"].values(), key=lambda x: x["candidates"]):
        for name in ("plain", "packed"):
            y = x[name]
            ratio = (f" ({y['repromote_added_over_panel_packed']:.2f}x of {y['rerun_panel_packed_bytes'] / 1e3:.0f} KB)"
                     if name == "packed" else "")
            if y.get("counted_not_run"):
                out.append(f"| {x['candidates']} | plain (counted, not run) | {y['files']} | {y['bytes'] / 1e6:.1f} | "
                           f"{y['bytes_per_candidate']:.0f} ({y['allocated_bytes_per_candidate']:.0f}) | - | - | "
                           f"{y['repromote_added_files']}, {y['repromote_added_bytes'] / 1e6:.2f} |")
                continue
            cpu = {k: f", CPU {y[f'{k}_cpu_s']:.1f}" if f"{k}_cpu_s" in y else "" for k in ("promote", "verify")}
            if "verify_load_average" in y:
                cpu["verify"] += f", load {y['verify_load_average']:.1f}"
            out.append(f"| {x['candidates']} | {name} | {y['files']} | {y['bytes'] / 1e6:.1f} | "
                       f"{y['bytes_per_candidate']:.0f} ({y['allocated_bytes_per_candidate']:.0f}) | "
                       f"{y['promote_s']:.1f} ({y['promote_peak_rss_mib']:.0f}{cpu['promote']}) | {y['verify_s']:.1f} "
                       f"({y['verify_peak_rss_mib']:.0f}{cpu['verify']}) | {y['repromote_added_files']}, "
                       f"{y['repromote_added_bytes'] / 1e6:.2f}{ratio} |")
    rows = []
    for k, x in sorted(a["points"].items(), key=lambda kv: kv[1]["candidates"]):
        y, n = x["packed"], x["candidates"]
        beyond = y["files"] - 3 * x["panels"]  # every file of the snapshot counted, none called study-level
        rows += [(f"files ({n}: {x['panels']} panels)", f"<= 3 x panels + {STUDY_FILES}",
                  f"{y['files']} = 3 x {x['panels']} + {beyond}", beyond <= STUDY_FILES),
                 (f"bytes per candidate ({n})", "<= 1.5 KB", f"{y['bytes_per_candidate']:.0f} B",
                  y["bytes_per_candidate"] <= 1536),
                 (f"one-panel re-promotion adds ({n})", "< 2x the panel's packs",
                  f"{y['repromote_added_over_panel_packed']:.2f}x", y["repromote_added_over_panel_packed"] < 2)]
        if k == "31k":
            cpu = f" wall, {y['verify_cpu_s']:.1f} s CPU" if "verify_cpu_s" in y else ""
            cpu += f", load average {y['verify_load_average']:.1f}" if "verify_load_average" in y else ""
            rows.append(("full verify at 31,000", "< 60 s", f"{y['verify_s']:.1f} s{cpu}", y["verify_s"] < 60))
    out += ["", "| goal | target | measured | met |", "|---|---|---|---|",
            *[f"| {g} | {t} | {m} | {'yes' if ok else '**no**'} |" for g, t, m, ok in rows]]
    out += ["", "Files: every file of the snapshot is counted (its folder, every pack it lists, its chunk packs); "
            "the synthetic tree holds, beside the evidence, what a run leaves on scratch: each panel job's log, "
            "benchmark and job account, the study jobs' accounts, the plan-time memo `checks/evidence.json`, the "
            "stat vouchers `checks/vouched/` (two a panel) and the archive job's own log and account. Packed: three "
            "packs per panel (a panel job's log, benchmark and account go into its timing pack) plus "
            + ", ".join(f"{x['packed']['files'] - 3 * x['panels']} other files at {x['candidates']}"
                        for x in sorted(a["points"].values(), key=lambda x: x["candidates"])) + " (`archive.json`, "
            "the study-level plain files, the accounts pack, the chunk packs); the memo, the vouchers and the "
            "archive job's own files are not evidence and are not archived. "
            "A one-panel re-promotion writes that panel's three packs and nothing else of the panels; beside them "
            "it writes what the workflow itself rewrites after any panel rerun: the accounts pack (the rerun's "
            "study-level jobs), the study-level files over 16 KiB "
            "(the timing manifest `study/timing.json` lists every timing record, about 95 bytes a candidate; the "
            "study manifest lists every panel's files) are stored as content-defined chunks shared between "
            "snapshots (about 32 lines a chunk), so only the chunks around the rerun panel's lines are new (one "
            "chunk pack); the smaller study-level files are stored whole; the listing of every pack's root (one line "
            "a pack, about 72 bytes) is chunked the same way once it is over 16 KiB; a file of more than 32 chunks "
            "is listed in `archive.json` by an index (its chunks' digests, one a line, in chunks of their own), so "
            "`archive.json` holds a few KB of digests and a rerun panel changes one or two index chunks. "
            "Largest plain files in the snapshot after the re-promotion (bytes; chunked files are not "
            "among them): " + "; ".join(
                f"{x['candidates']}: " + ", ".join(f"`{k}` {v}" for k, v in x["packed"]["largest_study_level_files"].items())
                for x in sorted(a["points"].values(), key=lambda x: x["candidates"])
                if "largest_study_level_files" in x["packed"]) + ". "
            "Full verify reads every pack once (in a pool of min(CPUs, 4) processes), and digest- and "
            "schema-checks every record in both layouts; the wall times were taken on a shared 2-core machine "
            "under other load (load average beside), so CPU seconds (where given) say what verify costs on an "
            "idle machine (the pool's workers' CPU included)"
            + (f" ({a['note']})" if a.get("note") else "") + ".", ""]
    return out
