"""What the benchmark sections share: the project root, a median timer, synthetic frames,
a scaled study project and its finished evidence, a timed child process, the machine."""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "workflow"))
# Parsl workers import the sections' task functions (slots) by module name, and the
# package from this checkout: they inherit the environment.
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "workflow"), str(ROOT / "benchmarks"),
                                            *filter(None, [os.environ.get("PYTHONPATH")])])


def median_time(fn: Callable[[], Any], runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def frames(f: int = 49, h: int = 256, w: int = 256) -> np.ndarray:
    t = np.arange(f)[:, None, None, None] / f
    y = np.linspace(0, 1, h)[None, :, None, None]
    x = np.linspace(0, 1, w)[None, None, :, None]
    full = np.ones((f, h, w, 1))
    rgb = np.concatenate([(0.5 + 0.5 * np.sin(6.28 * (x + t))) * full, y * full, (x * y) * full], axis=3)
    return np.clip(np.rint(rgb * 255), 0, 255).astype(np.uint8)


def scale_project(panels: int, prompts: int, allocation: str = "per-panel", where: Path | None = None) -> Path:
    """A project of ``panels`` sheets of ``prompts`` prompts x 1 seed x 2 arms, with this
    checkout's workflow, in ``where`` (created) or a new temporary folder;
    ``allocation``: its ``fleet.allocation``."""
    proj = Path(tempfile.mkdtemp()) if where is None else where
    proj.mkdir(parents=True, exist_ok=True)
    for name in ("Snakefile", "workflow", "envs"):
        shutil.copytree(ROOT / name, proj / name, ignore=shutil.ignore_patterns("__pycache__")) \
            if (ROOT / name).is_dir() else shutil.copy(ROOT / name, proj / name)
    (proj / "config" / "panels").mkdir(parents=True)
    pan = {}
    for i in range(panels):
        sheet = proj / "config" / "panels" / f"p{i:03d}.tsv"
        sheet.write_text("prompt_id\tprompt\n" + "".join(f"q{j:02d}\tprompt {i} {j}\n" for j in range(prompts)))
        pan[f"p{i:03d}"] = {"sheet": f"config/panels/p{i:03d}.tsv", "seeds": [0]}
    import yaml

    cfg = {"study": "scale", "arms": {"control": {"cache": None},
                                      "fb": {"cache": {"class": "FirstBlockCacheConfig", "params": {"threshold": 0.1}}}},
           "panels": pan, "model": {"kind": "local", "path": "model"}}
    if allocation != "per-panel":
        cfg["fleet"] = {"allocation": allocation}
    (proj / "model").mkdir()
    (proj / "model" / "model_index.json").write_text("{}")
    (proj / "config" / "config.yaml").write_text(yaml.safe_dump(cfg))
    return proj


def timed_cmd(cmd: list[str], cwd: Path) -> tuple[float, float, str]:
    """Wall seconds and peak RSS (MiB) of a child process."""
    t = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    rss_kb = int(proc.stderr.strip().splitlines()[-1])
    return wall, rss_kb / 1024, proc.stdout


VIDEO_DIGEST = "xxh3_128:" + xxhash.xxh3_128(b"\0" * 64).hexdigest()
"""The digest of the placeholder videos ``write_evidence`` writes."""


def write_evidence(proj: Path) -> int:
    """A finished study's evidence, valid for the plan-time check (``evidence``): per
    candidate a sealed generation record, a video with the recorded digest (64 bytes:
    the first plan hashes every video once, later ones only those whose stat changed), a
    score record per expected metric and a timing record, each naming its generation
    record; the panel, timing and study manifests over them, and the statistics'
    provenance, and the vouchers a panel or timing job writes beside its manifests
    (``pairflow.records.vouch``). Written directly (no fsync).
    Returns the files written."""
    import yaml

    from pairflow.layout import Layout
    from pairflow.media.video import recipe_digest
    from pairflow.plan.candidates import candidates, expected_scores, record_path, score_path, timing_path, video_path
    from pairflow.plan.config import study_from_raw
    from pairflow.records.store import build_manifest, seal
    from pairflow.records.vouch import vouch

    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import generation_record, metric_spec, score_record, timing_record

    study = study_from_raw(yaml.safe_load((proj / "config" / "config.yaml").read_text()), proj, source="benchmark")
    layout, rdigest, n = Layout(study.scratch), recipe_digest(study.encoder, study.generation.fps), 0

    def put(path: Path, obj: dict[str, Any] | bytes, indent: int | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(obj if isinstance(obj, bytes) else
                         (json.dumps(obj, indent=indent, sort_keys=indent is not None) + "\n" * bool(indent)).encode())

    def put_manifest(path: Path, obj: dict[str, Any]) -> None:
        # Manifests and statistics as the workflow writes them (write_manifest, _write_stats:
        # one entry per line), which is what lets the archive share their unchanged chunks.
        put(path, obj, indent=1)

    roots: dict[str, str] = {}
    timing_files = []
    for panel in study.panels:
        pdir = layout.panel(panel.name)
        gens, scores, recs = [], [], {}
        for c in candidates(study, panel):
            video = video_path(Layout(study.scratch), c)
            put(video, b"\0" * 64)
            # Complete records (they must fit their kinds' schemas, as real ones do), built by
            # the test suite's factories and bound to this candidate's identity and files.
            body = generation_record(panel.name, c.key.prompt_id, c.key.seed, c.arm.name, c.key.stream_seed, "v")
            body["candidate"] = {**body["candidate"], "candidate_id": c.key.candidate_id}
            body["encoder"] = {**body["encoder"], "recipe_digest": rdigest}
            body["video"] = {**body["video"], "path": video.relative_to(pdir).as_posix(), "bytes": 64,
                             "digest": VIDEO_DIGEST}
            gen = seal(body)
            put(record_path(Layout(study.scratch), c), gen)
            recs[record_path(Layout(study.scratch), c)] = gen
            spec = metric_spec("temporal_flickering")
            put(score_path(Layout(study.scratch), c), seal(score_record(gen, gen, {m: (0.0, spec)
                                                                   for m in expected_scores(study, c.arm)})))
            put(timing_path(Layout(study.scratch), c), seal(timing_record(gen, 1.0)))
            gens.append(record_path(Layout(study.scratch), c))
            scores.append(score_path(Layout(study.scratch), c))
            timing_files.append(timing_path(Layout(study.scratch), c))
            n += 4
        for kind, files, out in (("generation", gens, layout.generation_manifest(panel.name)),
                                 ("scores", scores, layout.score_manifest(panel.name))):
            m = build_manifest(f"panel-{kind}", pdir, files)
            put_manifest(out, m)
            vouch(study.scratch, out, m, recs if kind == "generation" else None)  # as the panel job does
            roots[f"{kind}:{panel.name}"] = m["root_digest"]
    m = build_manifest("timing", study.scratch, timing_files,
                       base=os.path.relpath(study.scratch, layout.timing_manifest.parent))
    put_manifest(layout.timing_manifest, m)
    vouch(study.scratch, layout.timing_manifest, m)
    roots["timing"] = m["root_digest"]
    stats = [layout.study_stats, layout.study_table(), layout.study_table(".html")]
    put_manifest(layout.study_stats, {"provenance": roots})
    for p in study.panels:
        put_manifest(layout.panel_stats(p.name), {"provenance": {k: roots[k] for k in (f"generation:{p.name}",
                                                                              f"scores:{p.name}")}})
        stats += [layout.panel_stats(p.name), layout.panel_table(p.name), layout.panel_table(p.name, ".html")]
    for f in stats:
        if not f.exists():
            put(f, b"table\n")
    put_manifest(layout.study_manifest, build_manifest("study", study.scratch, stats, extra={"panel_roots": roots},
                                              base=os.path.relpath(study.scratch, layout.study_manifest.parent)))

    return n + len(stats) + 2 * len(study.panels) + 2


def no_cluster() -> str | None:
    """Why the Slurm sections cannot run here (``pairflow.fleet.sites.slurm.cluster_unavailable``:
    also where sbatch is installed but no cluster answers), None when they can. Raises
    RuntimeError under ``PAIRFLOW_REQUIRE_SLURM=1`` (CI), where a skip would hide a
    cluster that failed to start."""
    from pairflow.fleet.sites.slurm import cluster_unavailable

    why = cluster_unavailable()
    if why is not None and os.environ.get("PAIRFLOW_REQUIRE_SLURM") == "1":
        raise RuntimeError(f"PAIRFLOW_REQUIRE_SLURM=1 but {why}")
    return why


def machine() -> dict[str, Any]:
    from pairflow.envinfo import code_version, environment

    return {"platform": platform.platform(), "cpus": os.cpu_count(), "python": sys.version.split()[0],
            "packages": environment()["packages"], "code": code_version(str(ROOT)),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
