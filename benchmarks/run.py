"""PairFlow benchmark suite. One command: ``.venv/bin/python benchmarks/run.py``; one
section: ``.venv/bin/python benchmarks/run.py metrics`` (others keep their last figures).

Writes ``benchmarks/results.json`` with the machine, versions and commit. Timings are
medians over several runs; every ratio is measured side by side in one run. Sections:
encode/decode (writer vs bare ffmpeg), hashing (xxh3 vs sha256), planning at 31,000
candidates, model loads (once per worker vs per candidate), Parsl slot busy share and
no-op task rate, metric throughput, the default study's time by stage, (``stats``) the
coverage and false-positive rate of the statistics at 3 to 30 prompts, and (``archive``,
in ``archive_bench.py``) packed against plain archive snapshots at 31,000 and 100,000
candidates.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import resource
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))


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


def bench_video(runs: int, quick: bool = False) -> dict[str, Any]:
    """Writer (guards + encode + probe + digest + fsync + rename) vs the bare ffmpeg CLI on
    the same raw frames and recipe, alternated in one run; decode throughput likewise."""
    from pairflow.config import EncoderSpec
    from pairflow.video import _output_args, encode, ffmpeg_binary, prepare_frames, read_video

    spec = EncoderSpec("", "libx264", 18, "medium", "yuv420p", 9, 1, False, False)
    u8 = frames(9, 64, 64) if quick else frames(33, 480, 832)  # Wan2.1's 480p frame size
    f, h, w, _ = u8.shape
    tmp = Path(tempfile.mkdtemp())
    args = []
    for k, v in _output_args(spec, 8).items():
        args += [f"-{k}", str(v)]
    bare = [ffmpeg_binary(spec), "-hide_banner", "-nostdin", "-loglevel", "error", "-y", "-f", "rawvideo",
            "-pix_fmt", "rgb24", "-s", f"{w}x{h}", "-framerate", "8/1", "-i", "pipe:", *args, str(tmp / "bare.mp4")]
    writer_t, bare_t = [], []
    for _ in range(runs):
        t = time.perf_counter()
        prepared, _ = prepare_frames(u8, spec)
        encode(prepared, tmp / "w.mp4", spec, 8)
        writer_t.append(time.perf_counter() - t)
        t = time.perf_counter()
        subprocess.run(bare, input=u8.tobytes(), check=True)
        bare_t.append(time.perf_counter() - t)
    dec = median_time(lambda: read_video(tmp / "w.mp4", spec, frames=f, height=h, width=w, fps=8), runs)
    bare_dec_cmd = [ffmpeg_binary(spec), "-hide_banner", "-loglevel", "error", "-i", str(tmp / "w.mp4"),
                    "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:"]
    bare_dec = median_time(lambda: subprocess.run(bare_dec_cmd, check=True, capture_output=True), runs)
    shutil.rmtree(tmp)
    wm, bm = statistics.median(writer_t), statistics.median(bare_t)
    return {"frames": f, "size": f"{w}x{h}", "runs": runs,
            "writer_median_s": wm, "bare_ffmpeg_median_s": bm, "writer_over_bare": wm / bm,
            "writer_fps": f / wm, "bare_fps": f / bm,
            "decode_read_video_fps": f / dec, "decode_bare_fps": f / bare_dec, "read_video_over_bare": dec / bare_dec}


def bench_hash(runs: int, quick: bool = False) -> dict[str, Any]:
    import xxhash

    from pairflow.identity import digest_file

    tmp = Path(tempfile.mkdtemp()) / "blob.bin"
    size = (8 if quick else 256) << 20
    tmp.write_bytes(np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes())
    data = tmp.read_bytes()
    xx = median_time(lambda: xxhash.xxh3_128_hexdigest(data), runs)
    sha = median_time(lambda: hashlib.sha256(data).hexdigest(), runs)
    f = median_time(lambda: digest_file(tmp), runs)
    shutil.rmtree(tmp.parent)
    mb = size / 1e6
    return {"bytes": size, "xxh3_128_MBps": mb / xx, "sha256_MBps": mb / sha, "sha256_over_xxh3": sha / xx,
            "digest_file_MBps": mb / f}


def _scale_project(panels: int, prompts: int) -> Path:
    proj = Path(tempfile.mkdtemp())
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
    (proj / "model").mkdir()
    (proj / "model" / "model_index.json").write_text("{}")
    (proj / "config" / "config.yaml").write_text(yaml.safe_dump(cfg))
    return proj


def _timed_cmd(cmd: list[str], cwd: Path) -> tuple[float, float, str]:
    """Wall seconds and peak RSS (MiB) of a child process."""
    t = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    rss_kb = int(proc.stderr.strip().splitlines()[-1])
    return wall, rss_kb / 1024, proc.stdout


PLAN_SIZES = {"31k": 500, "100k": 1613}
VIDEO_DIGEST = "xxh3_128:" + xxhash.xxh3_128(b"\0" * 64).hexdigest()
"""The digest of the placeholder videos ``_write_evidence`` writes."""
"""Panels of 31 prompts x 1 seed x 2 arms: 31,000 and 100,006 candidates."""


def _slurm_probe_s() -> float | None:
    """Seconds ``scontrol show config`` takes here, or None without Slurm's client. The
    Slurm executor plugin runs it when Snakemake imports its plugins, in every Snakemake
    process whatever the executor; where a Slurm client is installed but no controller
    answers, it waits about 10 s (a fixed cost of every invocation, not of planning)."""
    if shutil.which("scontrol") is None:
        return None
    t = time.perf_counter()
    try:
        subprocess.run(["scontrol", "show", "config"], capture_output=True, timeout=10)
    except subprocess.TimeoutExpired:
        pass
    return time.perf_counter() - t


def _write_evidence(proj: Path) -> int:
    """A finished study's evidence, valid for the plan-time check (``evidence``): per
    candidate a sealed generation record, a video with the recorded digest (64 bytes:
    the first plan hashes every video once, later ones only those whose stat changed), a
    score record per expected metric and a timing record, each naming its generation
    record; the panel, timing and study manifests over them, and the statistics'
    provenance. Written directly (no fsync).
    Returns the files written."""
    import yaml

    from pairflow.candidates import candidates, expected_scores, record_path, score_path, timing_path, video_path
    from pairflow.config import study_from_raw
    from pairflow.layout import Layout
    from pairflow.records import build_manifest, seal
    from pairflow.video import recipe_digest

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
        gens, scores = [], []
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
            roots[f"{kind}:{panel.name}"] = m["root_digest"]
    m = build_manifest("timing", study.scratch, timing_files,
                       base=os.path.relpath(study.scratch, layout.timing_manifest.parent))
    put_manifest(layout.timing_manifest, m)
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


def _finish(proj: Path, snake: str) -> tuple[list[str], int, float]:
    """Give the project a finished study: valid evidence (``_write_evidence``), then every
    other output Snakemake lists for it (``--summary``, so the list cannot fall behind the
    rules) as a placeholder, all outputs with one mtime later than every source (sheets,
    config, model). That is what Snakemake's up-to-date check reads (no input newer than
    its output; jobs without metadata records have no params/code triggers to fire), as
    ``--touch`` would leave it, at a fraction of the cost. Returns the outputs, the
    evidence files written and the seconds spent."""
    _, _, summary = _timed_cmd([snake, "--summary", "--cores", "2", "all"], proj)
    tick = time.perf_counter()
    files = _write_evidence(proj)
    outs = [line.split("\t", 1)[0] for line in summary.splitlines()[1:] if "\t" in line]
    for rel in outs:
        path = proj / rel
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("{}")
    done = time.time() + 1  # after every source, also on filesystems with coarse mtimes
    for rel in outs:
        os.utime(proj / rel, (done, done))
    return outs, files, time.perf_counter() - tick


def _plan_point(panels: int, prompts: int, runs: int) -> dict[str, Any]:
    """Dry run and no-op rerun of a study of ``panels`` x ``prompts`` x 1 seed x 2 arms:
    the dry run over an empty tree, the no-op rerun over one whose every output exists."""
    proj = _scale_project(panels, prompts)
    snake = str(Path(sys.executable).with_name("snakemake"))
    probe = _slurm_probe_s()
    dry = [_timed_cmd([snake, "-n", "--cores", "2", "--quiet", "all"], proj) for _ in range(runs)]
    n = panels * prompts * 2
    point: dict[str, Any] = {
        # One job per panel (fleet.panel_jobs: combined, the default config's) and seven
        # study-level ones: build_tiny_model, check_arms, timed_pass, study_stats, plots,
        # utilisation, archive (rule all counts as a job too, the model is built: 7 net).
        "candidates": n, "panels": panels, "snakemake_jobs": panels + 7,
        "slurm_probe_s": probe,
        "dry_runs": [{"s": d[0], "peak_rss_mib": d[1]} for d in dry],
        "dry_run_median_s": statistics.median(d[0] for d in dry),
        "dry_run_peak_rss_mib": max(d[1] for d in dry),
        "dry_run_after_first_peak_rss_mib": max((d[1] for d in dry[1:]), default=None),
        "planning_ms_per_candidate": statistics.median(d[0] for d in dry) / n * 1e3}
    outs, files, write_s = _finish(proj, snake)
    # The first plan over the finished tree checks every record and hashes every video (the
    # plan-time evidence check) and remembers what it found clean: a real run, since a dry
    # run writes nothing (so would check everything every time). Later plans hash the
    # records and stat the videos, and read in full only what changed since.
    noop = [_timed_cmd([snake, *([] if i == 0 else ["-n"]), "--cores", "2", "all"], proj) for i in range(runs + 1)]
    # Count what the check made the plan redo instead of pretending it planned nothing.
    planned = 0 if "Nothing to be done" in noop[-1][2] else int(
        next((ln.split()[-1] for ln in noop[-1][2].splitlines() if ln.startswith("total")), "-1"))
    shutil.rmtree(proj)
    return {**point, "outputs": len(outs), "evidence_files": files, "write_tree_s": write_s,
            "noop_first_s": noop[0][0], "noop_first_peak_rss_mib": noop[0][1],
            "noop_runs": [{"s": d[0], "peak_rss_mib": d[1]} for d in noop[1:]],
            "noop_rerun_median_s": statistics.median(d[0] for d in noop[1:]),
            "noop_rerun_peak_rss_mib": max(d[1] for d in noop),
            "noop_rerun_planned_jobs": planned}


def bench_plan(runs: int, quick: bool = False) -> dict[str, Any]:
    """Planning (dry run, no-op rerun, peak RSS) at 31,000 and 100,006 candidates; quick:
    10 panels of 5 prompts, one run."""
    if quick:
        return {"points": {"quick": _plan_point(10, 5, 1)}}
    return {"points": {k: _plan_point(p, 31, runs) for k, p in PLAN_SIZES.items()}}


def _payload_study(panels: int, prompts: int) -> Any:
    """A typed study of ``panels`` x ``prompts`` x 1 seed x 2 arms, without files on disk
    beyond its panel sheets."""
    from pairflow.config import study_from_raw

    proj = _scale_project(panels, prompts)
    import yaml

    raw = yaml.safe_load((proj / "config" / "config.yaml").read_text())
    return proj, study_from_raw(raw, proj, source="benchmark")


def bench_payload(runs: int, quick: bool = False) -> dict[str, Any]:
    """Bytes and dill serialise time of one generation task's payload, as Parsl ships it,
    at several study sizes: before (the task carried the study and provenance) and now
    (the candidate and a reference to the job's context file)."""
    import dill

    from pairflow.candidates import candidates, task_identity
    from pairflow.context import write_context
    from pairflow.provenance import provenance

    sizes = {"100": (2, 25), "1k": (16, 31)} if quick else {"1k": (16, 31), "31k": (500, 31), "100k": (1613, 31)}
    out = {}
    for label, (panels, prompts) in sizes.items():
        proj, study = _payload_study(panels, prompts)
        prov = provenance(study)
        c = candidates(study, study.panels[-1])[-1]
        ref = write_context(study.scratch, {"study": study, "provenance": prov})
        old = {"study": study, "candidate": c, "provenance": prov, "identity": task_identity(c)}
        new = {"context": ref, "candidate": c, "identity": task_identity(c)}
        row: dict[str, Any] = {"candidates": panels * prompts * 2,
                               "context_file_bytes": Path(ref.path).stat().st_size}
        for name, payload in (("old", old), ("new", new)):
            row[f"{name}_bytes"] = len(dill.dumps(payload))
            row[f"{name}_serialize_ms"] = median_time(lambda p=payload: dill.dumps(p), runs) * 1e3
        # Driver CPU per stage: every task serialised once.
        row["old_driver_s_per_stage"] = row["old_serialize_ms"] * row["candidates"] / 1e3
        row["new_driver_s_per_stage"] = row["new_serialize_ms"] * row["candidates"] / 1e3
        out[label] = row
        shutil.rmtree(proj)
        print(f"  {label}: old {row['old_bytes']} B {row['old_serialize_ms']:.2f} ms, new {row['new_bytes']} B "
              f"{row['new_serialize_ms']:.3f} ms", flush=True)
    return {"points": out}


def _sample_record() -> dict[str, Any]:
    """A generation record of the default study's shape and size (about 5 KB), for a tree
    that has no study run: every field its schema requires, digests of the right form."""
    from pairflow.identity import digest_obj

    d = [digest_obj(i) for i in range(16)]
    gen = {"frames": 9, "height": 64, "width": 64, "steps": 6, "guidance": 5.0, "fps": 8, "dtype": "float32",
           "threads": 1, "negative_prompt": "", "max_text_tokens": None}
    return {
        "kind": "generation",
        "candidate": {"study": "tiny-default", "panel": "smoke", "prompt_id": "p01", "prompt_digest": d[0], "seed": 0,
                      "arm": "fbcache", "arm_digest": d[1], "model_digest": d[2], "candidate_id": d[3],
                      "stream_seed": 3675252085612072994, "prompt": "a red fox trotting through fresh snow at dawn"},
        "arm": {"name": "fbcache", "kinds": ["cache"], "cache_class": "FirstBlockCacheConfig",
                "cache_params": {"threshold": 1.2}, "digest": d[1]},
        "generation": gen, "effective_generation": dict(gen),
        "pipeline": {"class": "WanPipeline", "family": "wan", "transformer": "WanTransformer3DModel",
                     "max_text_tokens": 64},
        "compute": {"attention_computed": 48, "attention_skipped": 0, "blocks_computed": 24, "blocks_skipped": 24,
                    "counter": "torch.utils.flop_counter.FlopCounterMode", "generations": 1,
                    "latent_shape": [16, 3, 8, 8], "total_flops": 124043776, "transformer_calls": 12,
                    "transformer_flops": 20888064, "verifier_flops": 0, "work_flops": 20888064},
        "video": {"path": "videos/fbcache/p01-s0.mp4", "digest": d[4], "bytes": 28792, "frames": 9, "height": 64,
                  "width": 64, "fps": "8/1", "pix_fmt": "yuv420p", "raw_digest": d[5]},
        "frames": {"mean": 138.2, "std": 56.7, "flags": []},
        "timing": {"pass": "bulk", "import_s": 0.0, "load_s": 0.0, "generate_s": 1.27, "encode_s": 0.034,
                   "peak_rss_mb": 1159.0},
        "worker": {"host": "vm", "pid": 1, "rank": "1", "slot": "1", "device": "cpu", "threads": 1,
                   "model_loads": {"resources/tiny-wan": 1}, "warm_up": {"import_s": 2.9, "load_s": 3.8}},
        "code": {"commit": "0" * 40, "dirty": False},
        "environment": {"packages": {f"package{i}": "1.0" for i in range(13)}, "python": "3.11.7"},
        "model": {"kind": "embedded-tiny", "id": "tiny-wan", "revision": None,
                  "weights": {f"part{i}/model.safetensors": d[6 + i] for i in range(10)}},
        "encoder": {"recipe": {"argv": ["-f", "rawvideo", "-pix_fmt", "rgb24"] * 12, "filter_graph": "scale"},
                    "recipe_digest": d[6], "fingerprint": {"version": "ffmpeg version n9.0.2", "digest": d[7]}},
        "config_digest": d[8], "site": {"model_path": "resources/tiny-wan", "scratch": "results/scratch"},
    }


def bench_records(runs: int, quick: bool = False) -> dict[str, Any]:
    """Per-candidate cost of sealing, validating (the kind's JSON Schema) and writing a
    generation record, of reading and verifying it, and of a 62-record manifest; the
    schema check's own share is measured alone."""
    from pairflow.records import build_manifest, check_schema, read_record, write_record

    found = sorted((ROOT / "results" / "scratch").glob("panels/*/records/*/*.json"))
    sample = json.loads(found[0].read_text()) if found else _sample_record()
    tmp = Path(tempfile.mkdtemp())
    w = median_time(lambda: [write_record(tmp / f"r{i}.json", sample) for i in range(62)], runs) / 62
    r = median_time(lambda: [read_record(tmp / f"r{i}.json") for i in range(62)], runs) / 62
    sealed = read_record(tmp / "r0.json")
    v = median_time(lambda: [check_schema(sealed, "r.json", "read") for _ in range(62)], runs) / 62
    m = median_time(lambda: build_manifest("panel-generation", tmp, [tmp / f"r{i}.json" for i in range(62)]),
                    runs) / 62
    shutil.rmtree(tmp)
    return {"write_record_ms": w * 1e3, "read_verify_record_ms": r * 1e3, "schema_check_ms": v * 1e3,
            "manifest_ms_per_record": m * 1e3, "sample": "results/scratch record" if found else "synthetic"}


def bench_loads(runs: int, quick: bool = False) -> dict[str, Any]:
    """Load once per worker vs once per candidate, on the tiny model (8 candidates)."""
    from pairflow import generate as g
    from pairflow.config import ArmSpec, GenerationSpec, ModelSpec
    from pairflow.tinymodel import build_tiny_model

    model = ModelSpec("embedded-tiny", build_tiny_model(Path(tempfile.mkdtemp()) / "tiny"))
    gen = GenerationSpec(5, 32, 32, 3, 5.0, 8, "float32", 1) if quick else GenerationSpec(9, 64, 64, 6, 5.0, 8,
                                                                                          "float32", 1)
    arm = ArmSpec("control", None)

    def load() -> Any:
        g._PIPELINES.clear()
        return g.load_pipeline(model, "float32", 1)

    load()  # imports and file cache warm
    load_s = median_time(load, runs)
    pipe = load()
    gen_s = median_time(lambda: g.generate(pipe, "a fox", 0, arm, gen, 64), runs)
    n = 2 if quick else 8
    return {"candidates": n, "load_median_s": load_s, "generate_median_s": gen_s,
            "once_per_worker_s": load_s + n * gen_s, "per_candidate_s": n * (load_s + gen_s),
            "saved_share": 1 - (load_s + n * gen_s) / (n * (load_s + gen_s)),
            "loads_once_per_worker": 1, "loads_per_candidate": n}


def bench_compute(runs: int, quick: bool = False) -> dict[str, Any]:
    """Compute accounting on the tiny model at the default study's size (9x64x64, 6
    steps; quick: 5x32x32, 3 steps), side by side in one process: plain generation (the
    timed pass), derived counting (hooks, FLOPs from a measured table: the bulk pass) and
    full counting (hooks + FlopCounterMode: the table's measurement and the cross-check),
    and each default arm's exact compute ratio beside its measured speedup. Plain and
    derived alternate run by run (the overhead goal is 5%, under the shared machine's
    noise otherwise); derived FLOPs are checked equal to full counting's."""
    from pairflow import generate as g
    from pairflow.arms import Verifier, run_arm
    from pairflow.config import ArmSpec, EncoderSpec, GenerationSpec, ModelSpec, SearchSpec
    from pairflow.tinymodel import build_tiny_model

    model = ModelSpec("embedded-tiny", build_tiny_model(Path(tempfile.mkdtemp()) / "tiny"))
    gen = GenerationSpec(5, 32, 32, 3, 5.0, 8, "float32", 1) if quick else GenerationSpec(9, 64, 64, 6, 5.0, 8,
                                                                                          "float32", 1)
    pipe = g.load_pipeline(model, "float32", 1)
    enc = EncoderSpec("", "libx264", 18, "medium", "yuv420p", 9, 1, False, False)
    verifier = Verifier("temporal_flickering", True, enc, None, 16, 8)
    arms = [ArmSpec("control"), ArmSpec("fbcache", "FirstBlockCacheConfig", {"threshold": 1.2}),
            ArmSpec("fewstep", steps=2), ArmSpec("best2", search=SearchSpec(2, "temporal_flickering"))]
    pairs = 1 if quick else max(runs, 5) * 3
    out: dict[str, Any] = {"size": "5x32x32, 3 steps" if quick else "9x64x64, 6 steps", "runs": runs,
                           "pairs": pairs, "arms": {}}
    for arm in arms:
        def plain(arm: Any = arm) -> Any:
            return run_arm(pipe, "a fox", 0, arm, gen, 64, verifier=verifier)

        def counted(arm: Any = arm) -> Any:
            return run_arm(pipe, "a fox", 0, arm, gen, 64, count=True, verifier=verifier, table_key="bench")

        plain()
        full = counted()
        table = full.measured

        def derived(arm: Any = arm, table: Any = table) -> Any:
            return run_arm(pipe, "a fox", 0, arm, gen, 64, count=True, verifier=verifier, table=table, full=False)

        work = derived().compute
        if work["method"] != "derived" or work["work_flops"] != full.compute["work_flops"]:
            raise RuntimeError(f"{arm.name}: derived FLOPs {work['work_flops']} ({work['method']}) differ from "
                               f"full counting's {full.compute['work_flops']}")
        # wall and this thread's CPU seconds (torch runs one thread here): on a shared machine
        # the CPU seconds are what other users' load disturbs least
        times: dict[str, list[float]] = {"plain": [], "derived": [], "plain_cpu": [], "derived_cpu": []}
        for _ in range(pairs):
            for name, fn in (("plain", plain), ("derived", derived)):
                t, c = time.perf_counter(), time.thread_time()
                fn()
                times[f"{name}_cpu"].append(time.thread_time() - c)
                times[name].append(time.perf_counter() - t)
        out["arms"][arm.name] = {"plain_s": statistics.median(times["plain"]),
                                 "derived_s": statistics.median(times["derived"]),
                                 "plain_cpu_s": statistics.median(times["plain_cpu"]),
                                 "derived_cpu_s": statistics.median(times["derived_cpu"]),
                                 "plain_total_s": sum(times["plain"]), "derived_total_s": sum(times["derived"]),
                                 "plain_cpu_total_s": sum(times["plain_cpu"]),
                                 "derived_cpu_total_s": sum(times["derived_cpu"]),
                                 "counted_s": median_time(counted, runs),
                                 "work_flops": work["work_flops"], "blocks_skipped": work["blocks_skipped"],
                                 "blocks_computed": work["blocks_computed"]}
    ctrl = out["arms"]["control"]
    for a in out["arms"].values():
        a["compute_ratio"] = a["work_flops"] / ctrl["work_flops"]
        a["speedup"] = ctrl["plain_s"] / a["plain_s"]
        a["counting_overhead"] = a["counted_s"] / a["plain_s"]
        a["derived_overhead"] = a["derived_s"] / a["plain_s"]
        a["derived_cpu_overhead"] = a["derived_cpu_s"] / a["plain_cpu_s"]
    # the default study runs each arm once per pair: its overhead is total derived over total plain
    arms_ = out["arms"].values()
    out["study_derived_overhead"] = sum(a["derived_total_s"] for a in arms_) / sum(a["plain_total_s"] for a in arms_)
    out["study_derived_cpu_overhead"] = (sum(a["derived_cpu_total_s"] for a in arms_)
                                         / sum(a["plain_cpu_total_s"] for a in arms_))
    out["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return out


def _sleep_task(payload: dict[str, Any]) -> dict[str, Any]:
    import time as _t

    _t.sleep(payload["s"])
    return {}


def bench_slots(runs: int, quick: bool = False) -> dict[str, Any]:
    """Share of slot time spent running tasks on a heterogeneous synthetic workload, and
    no-op task throughput, through the project's own fleet config and its telemetry."""
    from pairflow.config import FleetSpec
    from pairflow.fleet import Grant, TaskHooks, noop, run_tasks
    from pairflow.telemetry import slot_key

    requested = 4
    rng = np.random.default_rng(0)
    durations = rng.uniform(0.05, 1.0, 8 if quick else 240).round(3).tolist()
    run_dir = Path(tempfile.mkdtemp())
    run_tasks(_sleep_task, [{"s": d} for d in durations], run_dir, FleetSpec(requested, 0), Grant(), "slots",
              TaskHooks(telemetry_out=run_dir / "tel.json"))
    t = json.loads((run_dir / "tel.json").read_text())
    spans = t["spans"]
    # Parsl caps workers at the cores it sees (cores_per_worker=1), so count the slots that
    # really ran tasks rather than trusting the request.
    slots = {slot_key(s) for s in spans}
    first, last = min(s["started"] for s in spans), max(s["finished"] for s in spans)
    busy = sum(s["finished"] - s["started"] for s in spans)
    per_slot_end: dict[str, float] = {}
    for s in spans:
        per_slot_end[slot_key(s)] = max(per_slot_end.get(slot_key(s), 0.0), s["finished"])
    n = 50 if quick else 2000
    tick = time.perf_counter()
    run_tasks(noop, [{}] * n, run_dir, FleetSpec(requested, 0), Grant(), "noop", TaskHooks(telemetry_out=run_dir / "noop.json"))
    noop_wall = time.perf_counter() - tick
    noop = json.loads((run_dir / "noop.json").read_text())
    noop_first = min(s["started"] for s in noop["spans"])
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"slots_requested": requested, "slots": len(slots), "tasks": len(durations),
            "task_seconds": sum(durations), "busy_share_of_makespan": busy / (len(slots) * (last - first)),
            "busy_share_of_window": busy / (len(slots) * (t["window"]["end"] - t["window"]["start"])),
            "tail_idle_slot_s": sum(last - e for e in per_slot_end.values()),
            "startup_s": first - t["window"]["start"], "noop_tasks": n,
            "noop_tasks_per_s_incl_startup": n / noop_wall,
            "noop_tasks_per_s_after_startup": n / (noop["window"]["end"] - noop_first)}


def _no_cluster() -> str | None:
    """Why the Slurm sections cannot run here (``pairflow.slurm.cluster_unavailable``:
    also where sbatch is installed but no cluster answers), None when they can. Raises
    RuntimeError under ``PAIRFLOW_REQUIRE_SLURM=1`` (CI), where a skip would hide a
    cluster that failed to start."""
    from pairflow.slurm import cluster_unavailable

    why = cluster_unavailable()
    if why is not None and os.environ.get("PAIRFLOW_REQUIRE_SLURM") == "1":
        raise RuntimeError(f"PAIRFLOW_REQUIRE_SLURM=1 but {why}")
    return why


def bench_slurm(runs: int, quick: bool = False) -> dict[str, Any]:
    """Per-task overhead inside a Slurm allocation: ``pairflow probe-slots`` in an sbatch
    job granted two GPUs (srun starts the pool; one worker per GPU). Needs a cluster
    (``bash .ci/slurm-up``)."""
    if (why := _no_cluster()) is not None:
        return {"skipped": why}
    out_dir = Path(tempfile.mkdtemp())
    out = out_dir / "probe.json"
    n = 50 if quick else 2000
    cmd = f"{Path(sys.executable).with_name('pairflow')} probe-slots --tasks {n} --out {out}"
    subprocess.run(["sbatch", "--wait", "--quiet", "--gres=gpu:2", "--cpus-per-task=2", "--time=10",
                    f"--output={out_dir / 'probe.log'}", "--wrap", cmd], check=True, timeout=900)
    t = json.loads(out.read_text())
    shutil.rmtree(out_dir, ignore_errors=True)
    return {"slots": sorted(t["slots"]), "launcher": "SrunLauncher (srun --overlap)", **t["probe"],
            "allocation": t["allocation"]}


def bench_slurm_study(runs: int, quick: bool = False) -> dict[str, Any]:
    """The default study through ``snakemake --profile profiles/slurm`` (the shipped
    profile, unchanged) in a fresh project copy: wall time and the slot busy share its
    utilisation report computes from per-task spans. Needs a cluster (``.ci/slurm-up``)."""
    if (why := _no_cluster()) is not None:
        return {"skipped": why}
    if quick:  # measured: 147 s at 6 candidates on the CI VM, almost all of it per-job start-up
        return {"skipped": "quick: a study through Slurm takes minutes at any size (job start-up dominates); "
                           "tests/test_slurm.py runs this study through profiles/slurm in CI"}
    project = Path(tempfile.mkdtemp()) / "project"
    project.mkdir()
    for name in ("Snakefile", "workflow", "envs", "profiles", "config"):
        src = ROOT / name
        (shutil.copytree(src, project / name, ignore=shutil.ignore_patterns("__pycache__")) if src.is_dir()
         else shutil.copy(src, project / name))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    tick = time.perf_counter()
    subprocess.run([str(Path(sys.executable).with_name("snakemake")), "--profile", "profiles/slurm"], cwd=project,
                   env=env, check=True, capture_output=True, timeout=1800)
    wall = time.perf_counter() - tick
    u = json.loads((project / "results/scratch/study/utilisation.json").read_text())
    shutil.rmtree(project.parent, ignore_errors=True)
    return {"wall_s": wall, "busy_share": u["busy_share"], "allocated_slot_s": u["allocated_slot_s"],
            "jobs": {j["job"]: {"window_s": j["window_s"], "tasks": j["tasks"],
                                "slots": {k: v["share"] for k, v in j["slots"].items()}} for j in u["jobs"]}}


QUICK_METRICS = ("psnr", "ssim", "temporal_flickering", "motion_smoothness_proxy")
"""Metrics without weights: the quick mode measures these only (no 2 GB test mirror)."""


def bench_metrics(runs: int, quick: bool = False, mirror: Path | None = None) -> dict[str, Any]:
    """Every registered metric on 8 frames of 256x256 on this CPU (1 torch thread):
    frames per second, the cold load of its scorer (weight verification included), and
    load time against scoring one video. Weighted metrics use ``mirror`` or a
    random-initialised test mirror (same architectures, so the same cost)."""
    from pairflow import weights
    from pairflow.metrics import METRICS, ScoreContext, metric_spec, models, score
    from pairflow.metrics import fidelity as fid

    tmp = None
    if mirror is None and not quick:
        tmp = Path(tempfile.mkdtemp())
        weights.build_test_mirror(tmp)
        mirror = tmp
    f = 8
    a, b = frames(f, 256, 256), frames(f, 256, 256)[::-1].copy()
    if quick:
        a, b = a[:, :64, :64].copy(), b[:, :64, :64].copy()
    ctx = ScoreContext(mirror=mirror, batch=8, fps=8)
    out = {}
    scorer_models = {"subject_consistency": ["dino"], "background_consistency": ["clip_b32"],
                     "aesthetic_quality": ["clip_l14", "aesthetic_head"], "imaging_quality": ["musiq_spaq"],
                     "dynamic_degree": ["raft_large"], "lpips": ["lpips"]}
    for name in (QUICK_METRICS if quick else METRICS):
        spec = metric_spec(name)
        models.load.cache_clear()
        fid._metric.cache_clear()
        weights._verified.cache_clear()
        t = time.perf_counter()  # cold build of the scorer, as a worker does once (weights verified first)
        for m in scorer_models.get(name, []):
            models.load(m, str(mirror))
        if name == "psnr":  # ssim and ms_ssim (metrics/structural.py) build nothing
            fid._metric(name)
        load = time.perf_counter() - t
        ref = b if spec.kind == "FR" else None
        score(name, a[:3], None if ref is None else ref[:3], ctx)  # warm-up
        s = median_time(lambda n=name, r=ref: score(n, a, r, ctx), runs if not spec.needs else min(runs, 2))
        out[name] = {"kind": spec.kind, "weights": list(spec.needs), "frames": f, "fps_256x256": f / s,
                     "load_s": load, "score_one_video_s": s, "load_over_one_video": load / s}
        print(f"  {name}: {f / s:.1f} fps, load {load:.2f} s, one video {s:.2f} s", flush=True)
    origin = weights.read_lock(mirror).origin if mirror is not None else "none (quick: metrics without weights)"
    if tmp is not None:
        shutil.rmtree(tmp)
    return {"mirror_origin": origin, "threads": 1, "metrics": out}


def _lognormal(rng: np.random.Generator, shape: tuple[int, int], skew: float) -> np.ndarray:
    """Standardised lognormal draws (mean 0, sd 1) of population skewness ``skew`` (> 0)."""
    from scipy.optimize import brentq

    v = brentq(lambda s: (math.exp(s * s) + 2) * math.sqrt(math.exp(s * s) - 1) - skew, 1e-4, 3.0)
    x = rng.lognormal(0.0, v, shape)
    return (x - math.exp(v * v / 2)) / math.sqrt((math.exp(v * v) - 1) * math.exp(v * v))


def _cell_diffs(rng: np.random.Generator, reps: int, n: int, shape: str) -> tuple[np.ndarray, float]:
    """Per-prompt values of ``reps`` synthetic studies at ``n`` prompts, and their true mean.
    normal / t3: sd 1 (t3 scaled to sd 1); skew+-k: standardised lognormal of skewness +-k
    (skew-: a few prompts lose a lot, the cache-regression shape); binary: a 0/1 metric on 2
    seeds per prompt, control 0.5 and treatment 0.6 (per-prompt differences in steps of 0.5);
    clustered: 2 seeds per prompt correlated 0.92; latency: log of control / treatment
    latency ratio, lognormal latencies with per-prompt sd 0.3 and run noise 0.05."""
    if shape == "normal":
        return rng.normal(0, 1, (reps, n)), 0.0
    if shape == "t3":
        return rng.standard_t(3, (reps, n)) / math.sqrt(3.0), 0.0
    if shape.startswith("skew"):
        k = float(shape[5:])
        return (1.0 if shape[4] == "+" else -1.0) * _lognormal(rng, (reps, n), k), 0.0
    if shape == "binary":
        c = rng.random((reps, n, 2)) < 0.5
        t = rng.random((reps, n, 2)) < 0.6
        return (t.astype(float) - c.astype(float)).mean(axis=-1), 0.1
    if shape == "clustered":
        prompt = rng.normal(0, 1, (reps, n, 1))
        seeds = math.sqrt(0.92) * prompt + math.sqrt(0.08) * rng.normal(0, 1, (reps, n, 2))
        return seeds.mean(axis=-1), 0.0
    if shape == "latency":
        base = rng.normal(0, 0.3, (reps, n, 2))
        ctrl = np.exp(base + rng.normal(0, 0.05, (reps, n, 2)))
        treat = np.exp(base + math.log(0.5) + rng.normal(0, 0.05, (reps, n, 2)))
        return np.log(ctrl / treat).mean(axis=-1), math.log(2.0)
    raise ValueError(shape)


STAT_SHAPES = ("normal", "t3", "skew+0.5", "skew+1", "skew+2", "skew-1", "skew-2", "skew+4", "binary", "clustered",
               "latency")


def bench_stats(runs: int, quick: bool = False) -> dict[str, Any]:
    """Coverage and false-positive rate of the union test PairFlow reports
    (``inference.union_p``: max of Student t, Hall's skew-corrected t and the exact
    sign-flip test) against the plain t-test it replaced, per shape and prompt count
    (``reps`` synthetic studies per cell). Coverage: the true mean is accepted (studies
    drawn with their true mean); false positive: a null study (shifted to mean 0) is
    rejected; power: a study shifted by 0.8 sd (normal) is rejected."""
    from pairflow.inference import signflip_min_p, signflip_signs, union_p
    from pairflow.stats import t_procedure

    reps = 300 if quick else 6000
    rng = np.random.default_rng(20261201)
    rows = []
    t0 = time.perf_counter()
    for shape in (("normal", "skew+2") if quick else STAT_SHAPES):
        for n in ((3, 10) if quick else (3, 4, 5, 7, 10, 15, 30)):
            signs = signflip_signs(n, 2000, 0)
            x, mu = _cell_diffs(rng, reps, n, shape)
            x0, mu0 = _cell_diffs(rng, reps, n, shape)
            x0 = x0 - mu0  # a true null: mean 0
            _lo, _hi, p_t = t_procedure(x - mu, 0.95)
            _lo0, _hi0, p_t0 = t_procedure(x0, 0.95)
            row = {"shape": shape, "prompts": n, "reps": reps,
                   "coverage_union": float(np.mean(union_p(x, mu, signs) >= 0.05)),
                   "coverage_t": float(np.mean(p_t >= 0.05)),
                   "false_positive_union": float(np.mean(union_p(x0, 0.0, signs) < 0.05)),
                   "false_positive_t": float(np.mean(p_t0 < 0.05)),
                   "signflip_min_p": signflip_min_p(n)}
            if shape == "normal":
                _l, _h, p_tp = t_procedure(x + 0.8, 0.95)
                row["power_t"] = float(np.mean(p_tp < 0.05))
                row["power_union"] = float(np.mean(union_p(x + 0.8, 0.0, signs) < 0.05))
            rows.append(row)
            print(f"  {shape} n={n}: coverage union {row['coverage_union']:.3f} t {row['coverage_t']:.3f}; "
                  f"false pos. union {row['false_positive_union']:.3f} t {row['false_positive_t']:.3f}", flush=True)
    return {"machine": {k: v for k, v in machine().items() if k in ("platform", "cpus", "date", "code")},
            "rows": rows, "level": 0.95, "procedure": "union", "seconds": time.perf_counter() - t0}


PANEL_RULES = {"generate_score_panel": "generate-score", "generate_panel": "generate", "score_panel": "score"}
"""The rules whose jobs generate and score panels (one job per panel, or one per stage),
and the name of each one's telemetry record."""


def bench_e2e(runs: int, quick: bool = False, scratch: Path | None = None) -> dict[str, Any]:
    """Where the default study's time goes, from its records, telemetry and Snakemake's
    per-job benchmark files (``scratch``, default results/scratch of the last run):
    per-video work (generation, encoding, scoring) against the jobs' wall time (the work
    share), and per worker the one-time costs split into import, model load and warm-up."""
    scratch = scratch or ROOT / "results" / "scratch"
    recs = [json.loads(p.read_text()) for p in scratch.glob("panels/*/records/*/*.json")]
    scores = [json.loads(p.read_text()) for p in scratch.glob("panels/*/scores/*/*.json")]
    if not recs:
        return {"skipped": f"no study run under {scratch}: run snakemake --profile profiles/local first"}
    jobs: dict[str, float] = {}
    panel_slot_s = 0.0  # the panel jobs' wall time x the slots each ran (its telemetry's slots)
    for tsv in (scratch / "benchmarks").rglob("*.tsv"):
        rows = tsv.read_text().splitlines()
        rule = tsv.parent.name
        jobs[rule] = jobs.get(rule, 0.0) + float(rows[1].split("\t")[0])
        tel = scratch / "panels" / tsv.stem / "telemetry" / f"{PANEL_RULES.get(rule)}.json"
        if tel.exists():
            panel_slot_s += float(rows[1].split("\t")[0]) * len(json.loads(tel.read_text())["slots"])
    # One-time costs per worker process: its warm-up task's figures, else what its tasks
    # paid importing and loading (a worker of a combined panel job serves both kinds once).
    workers: dict[tuple[str, int], dict[str, float]] = {}
    for rs in (recs, scores):
        for r in rs:
            w = workers.setdefault((r["worker"]["host"], r["worker"]["pid"]), {"import_s": 0.0, "load_s": 0.0})
            warm = r["worker"].get("warm_up") or {}
            t = r["timing"]
            w["import_s"] = max(w["import_s"], warm.get("import_s", 0.0), t.get("import_s", 0.0))
            w["load_s"] = max(w["load_s"], warm.get("load_s", 0.0), t.get("load_s", 0.0))
    warm_spans = []
    for tel in scratch.glob("panels/*/telemetry/*.json"):
        warm_spans += [s for s in json.loads(tel.read_text()).get("spans", []) if s.get("kind") == "warm-up"]
    mbps = json.loads((ROOT / "benchmarks" / "results.json").read_text()).get("hash", {}).get("digest_file_MBps",
                                                                                            5000.0) \
        if (ROOT / "benchmarks" / "results.json").exists() else 5000.0
    video_bytes = sum(r["video"]["bytes"] for r in recs)
    raw_bytes = sum(r["video"]["frames"] * r["video"]["height"] * r["video"]["width"] * 3 for r in recs)
    rec_bytes = sum(p.stat().st_size for p in scratch.rglob("*.json"))
    # Hashing share: every video is hashed when written, when its candidate is checked for
    # completeness, before scoring and at archive verification (4 passes, bounded above);
    # raw frames once; records a few times. Time from digest_file's measured throughput.
    hash_s = (4 * video_bytes + raw_bytes + 4 * rec_bytes) / (mbps * 1e6)
    gen_s = sum(r["timing"]["generate_s"] for r in recs)
    enc_s = sum(r["timing"]["encode_s"] for r in recs)
    score_s = sum(s["timing"]["score_s"] for s in scores)
    total = sum(jobs.values())
    panel_jobs = sum(v for k, v in jobs.items() if k in PANEL_RULES)
    util = scratch / "study" / "utilisation.json"
    busy = json.loads(util.read_text()).get("busy_share") if util.exists() else None
    return {"candidates": len(recs), "hash_s_estimate": hash_s,
            # Other users' load slows the per-video work and so moves every share: say what it was.
            "load_average": " ".join(f"{x:.1f}" for x in os.getloadavg()),
            "panel_jobs": "combined" if "generate_score_panel" in jobs else "per-stage",
            "panel_jobs_wall_s": panel_jobs,
            "work_share_of_panel_jobs": (gen_s + enc_s + score_s) / panel_jobs if panel_jobs else None,
            # Per-video seconds are summed over parallel workers: against slot time (job
            # wall x its slots) the share cannot pass 100%.
            "panel_jobs_slot_s": panel_slot_s,
            "work_share_of_panel_slot_time": (gen_s + enc_s + score_s) / panel_slot_s if panel_slot_s else None,
            # What the panel jobs' slots spent on anything but per-video work (start-up,
            # imports, loads, verification, manifests, idle tails): less sensitive than the
            # shares to how fast this machine ran the videos during the run.
            "panel_overhead_slot_s": panel_slot_s - (gen_s + enc_s + score_s) if panel_slot_s else None,
            "slot_busy_share": busy,
            "hash_share": hash_s / max(1e-9, total),
            "generate_s_sum": gen_s, "encode_s_sum": enc_s, "score_s_sum": score_s,
            "work_s": gen_s + enc_s + score_s, "job_wall_s": total,
            "work_share": (gen_s + enc_s + score_s) / total if total else None,
            "workers": len(workers),
            "import_s_sum": sum(w["import_s"] for w in workers.values()),
            "model_load_s_sum": sum(w["load_s"] for w in workers.values() if w["load_s"] > 0),
            "warm_up_tasks": len(warm_spans),
            "warm_up_s_sum": sum(s["finished"] - s["started"] for s in warm_spans),
            "job_wall_s_by_rule": jobs}


def machine() -> dict[str, Any]:
    from pairflow.envinfo import code_version, environment

    return {"platform": platform.platform(), "cpus": os.cpu_count(), "python": sys.version.split()[0],
            "packages": environment()["packages"], "code": code_version(str(ROOT)),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def bench_archive(runs: int, quick: bool = False) -> dict[str, Any]:
    """Packed against plain archive snapshots (``archive_bench``: files, bytes, promotion,
    verify, one-panel re-promotion) at 31,000 and 100,006 candidates."""
    from archive_bench import bench_archive as archive

    return archive(runs, quick)


SECTIONS = {"video": bench_video, "hash": bench_hash, "plan": bench_plan, "payload": bench_payload,
            "records": bench_records, "loads": bench_loads, "compute": bench_compute,
            "slots": bench_slots, "metrics": bench_metrics,
            "slurm": bench_slurm, "slurm_study": bench_slurm_study, "stats": bench_stats, "e2e": bench_e2e,
            "archive": bench_archive}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("sections", nargs="*", default=list(SECTIONS), help=f"any of {', '.join(SECTIONS)}")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes, one run: checks every section still runs (the test suite does this)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results.json")
    ap.add_argument("--mirror", type=Path, default=None,
                    help="weight mirror for the metrics section (default: a random-init test mirror)")
    ap.add_argument("--scratch", type=Path, default=None,
                    help="the study run the e2e section reads (default: results/scratch)")
    ap.add_argument("--key", default=None,
                    help="with one section: where its figures go in the results instead of its name, to render "
                         "side by side (e2e_per_stage: a run with fleet.panel_jobs: per-stage; e2e_before, "
                         "slurm_study_before: an earlier commit's runs)")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.sections) - set(SECTIONS))
    if unknown:
        ap.error(f"unknown section(s) {unknown}; sections: {', '.join(SECTIONS)}")
    if args.key and len(args.sections) != 1:
        ap.error("--key names where one section's figures go: give exactly one section")
    import torch

    torch.set_num_threads(1)
    runs = 1 if args.quick else args.runs
    # Sections not rerun keep their last figures (rerun everything for a new machine).
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    results.update({"machine": machine(), "runs": runs, "quick": args.quick})
    for name in args.sections:
        t = time.perf_counter()
        section, name = name, args.key or name
        if section == "e2e":
            results[name] = bench_e2e(runs, args.quick, args.scratch)
        elif section == "metrics":
            results[name] = bench_metrics(runs, args.quick, args.mirror)
        else:
            results[name] = SECTIONS[section](runs if section != "plan" else min(runs, 3), args.quick)
        results[name]["section_s"] = time.perf_counter() - t
        print(f"{name}: {time.perf_counter() - t:.1f}s {json.dumps(results[name])[:400]}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out} (peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB)")


if __name__ == "__main__":
    main()
