"""Shared fixtures: a tiny model built once per session, small configs, encoder specs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pairflow.arms import arms_check_key
from pairflow.fleet.orphans import start_time  # re-exported: tests/test_study.py imports it from here
from pairflow.layout import Layout
from pairflow.plan.config import EncoderSpec, study_from_raw

ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Heaviest test files first, each file's tests in their own order: with ``--dist
    loadfile`` and ``--no-loadscope-reorder`` (pyproject.toml) xdist hands files out in this
    order, so two workers finish close together (longest-first scheduling). The weights are
    one CI run's seconds per file (tests/data/file_seconds.json; refresh from a run's
    ``--junitxml`` when files change much). A file not listed goes first, as if heaviest:
    a light file run early costs nothing, a heavy one run last costs its whole length."""
    seconds = json.loads((ROOT / "tests" / "data" / "file_seconds.json").read_text())
    first_seen: dict[str, int] = {}
    for i, item in enumerate(items):
        first_seen.setdefault(item.nodeid.split("::", 1)[0], i)

    def weight(item: pytest.Item) -> tuple[float, int]:
        path = item.nodeid.split("::", 1)[0]
        return -seconds.get(path, float("inf")), first_seen[path]

    items.sort(key=weight)  # stable: a file's tests keep their order


@pytest.fixture(scope="session", autouse=True)
def _private_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Processes the tests start (Snakemake, Parsl workers, ffmpeg) put their temporary
    files under pytest's own temp folder, not the system one: workers that a fault test
    kills leave multiprocessing's ``pymp-*`` folders behind, and pytest removes its own
    folder (``tmp_path_retention_policy``)."""
    os.environ["TMPDIR"] = str(tmp_path_factory.mktemp("tmp"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded tiny Wan pipeline, built once (shared with the default config if built)."""
    from pairflow.generation.tinymodel import build_tiny_model

    out = tmp_path_factory.mktemp("model") / "tiny-wan"
    return build_tiny_model(out)


@pytest.fixture
def encoder_spec() -> EncoderSpec:
    return EncoderSpec(ffmpeg="", codec="libx264", crf=18, preset="medium", pix_fmt="yuv420p",
                       gop=9, threads=1, lossless=False, fail_on_flat=False)


def small_config(tmp: Path, model: Path, **over: object) -> dict:
    """A study config for tests: one panel of 2 prompts x 1 seed, control + 1 treatment."""
    sheet = tmp / "config" / "panels" / "t.tsv"
    sheet.parent.mkdir(parents=True, exist_ok=True)
    sheet.write_text("prompt_id\tprompt\na1\ta red fox in snow\na2\twaves on a beach\n")
    cfg = {
        "study": "test",
        "storage": {"scratch": str(tmp / "results" / "scratch"), "work": str(tmp / "results" / "work")},
        "model": {"kind": "embedded-tiny", "path": str(model)},
        "arms": {"control": {"cache": None},
                 "pab": {"cache": {"class": "PyramidAttentionBroadcastConfig",
                                   "params": {"spatial_attention_block_skip_range": 2,
                                              "spatial_attention_timestep_skip_range": [-1, 1000]}}}},
        "panels": {"t": {"sheet": str(sheet), "seeds": [0]}},
        "generation": {"frames": 5, "height": 32, "width": 32, "steps": 3},
        "fleet": {"cpu_workers": 1, "retries": 1},
        "stats": {"resamples": 200},
    }
    cfg.update(over)
    # Test studies skip calibration (about a minute each on a loaded 2-core machine) unless
    # a test asks for it (fleet/calibrate) or sets a budget, which needs it.
    if "budget_gpu_hours" not in cfg["fleet"]:
        cfg["fleet"] = {"calibrate": False, **cfg["fleet"]}
    return cfg


def write_config(tmp: Path, cfg: dict) -> Path:
    path = tmp / "config" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return path


_ARMS_CHECKS: dict[str, Path] = {}
"""Rule check_arms's outputs made this session, by their key (``arms_check_key``)."""


def reuse_arms_check(project: Path, cfg: dict) -> None:
    """Give ``project`` (its config ``cfg``, written) the output of rule ``check_arms``
    that an earlier project of this session with the same arms and model made (the key
    inside it is the rule's ``params``), so that job, ~10 s each for importing diffusers,
    runs once per set of arms and not once per project. The first project of a key runs
    the real rule itself (the rule as the one target); the others get a copy, mtime kept, so
    Snakemake finds the output newer than the model it was checked against."""
    study = study_from_raw(cfg, project)
    key = arms_check_key(study.arms, study.model)
    marker = Layout(study.scratch).arms_check
    if key not in _ARMS_CHECKS:
        subprocess.run([str(Path(sys.executable).with_name("snakemake")), "check_arms", "--cores", "1",
                        "--configfile", "config/config.yaml"], cwd=project, check=True, capture_output=True,
                       timeout=600)
        kept = Path(os.environ["TMPDIR"]) / "arms-checks" / f"{len(_ARMS_CHECKS)}.json"  # the session's temp
        kept.parent.mkdir(exist_ok=True)
        _ARMS_CHECKS[key] = Path(shutil.copy2(marker, kept))  # a passing test's tmp_path is removed
    elif not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(_ARMS_CHECKS[key], marker)
    assert json.loads(marker.read_text())["key"] == key


@pytest.fixture(scope="module")
def slurm() -> None:
    """A Slurm cluster answers (``bash .ci/slurm-up`` starts the CI's two-node one); else
    skip, or fail under ``PAIRFLOW_REQUIRE_SLURM=1`` (set by ``.ci/run``)."""
    from pairflow.fleet.sites.slurm import cluster_unavailable

    why = cluster_unavailable()
    if why is not None:
        if os.environ.get("PAIRFLOW_REQUIRE_SLURM") == "1":
            pytest.fail(f"PAIRFLOW_REQUIRE_SLURM=1 but {why}")
        pytest.skip(why)


def slurm_env() -> dict[str, str]:
    """The environment a test submits Slurm work in: this venv's tools first on PATH, and
    no SLURM_CONF (jobs read /etc/slurm/slurm.conf; the plugin strips SLURM_CONF)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env.pop("SLURM_CONF", None)
    return env


def copy_project(dest: Path) -> Path:
    """Copy the workflow files (not results, not config) into ``dest`` for a test run."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("Snakefile", "workflow", "envs", "profiles"):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, dest / name)
    return dest


SHARED_ARMS = {
    "mix": {"cache": {"class": "FirstBlockCacheConfig", "params": {"threshold": 0.2}}, "steps": 2,
            "attention_backend": "_native_math"},
    "best2": {"search": {"n": 2, "verifier": "temporal_flickering"}},
    "vae16": {"vae_dtype": "float16"},
}
"""The shared study's arms besides control, pab (``small_config``) and the student: one of
every kind (a cache with overrides and an attention backend, a search, a VAE precision)."""


def run_snakemake(project: Path, *args: str, timeout: float = 1500) -> str:
    """``snakemake --profile profiles/local`` in ``project``; its output, or AssertionError."""
    proc = subprocess.run([str(Path(sys.executable).with_name("snakemake")), "--profile", "profiles/local",
                           "--configfile", "config/config.yaml", *args], cwd=project, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode:
        raise AssertionError(f"snakemake failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
    return proc.stdout + proc.stderr


@pytest.fixture(scope="session")
def finished_study(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's one finished study, built once through the real Snakemake, Parsl,
    diffusers, ffmpeg and pyiqa: an arm of every kind (control, pab, ``SHARED_ARMS`` and a
    student, a byte copy of the tiny model run in bfloat16), two panels (t: a1, a2 x seeds
    0, 1; u: b1 x seed 3), calibration on, one worker, per-panel combined jobs, one timed
    run per candidate. Storage paths are relative, so a copy of the project directory
    (``copy_study``) is a complete study of its own. Returns the project; tests that run
    anything in it (Snakemake, ``pairflow verify``, a rerun) work on a copy, the others
    only read it (its config: ``yaml.safe_load(project / "config/config.yaml")``)."""
    root = tmp_path_factory.mktemp("shared")
    student = Path(shutil.copytree(tiny_model, root / "student"))
    project = copy_project(root / "proj")
    cfg = small_config(project, tiny_model)
    cfg["arms"].update(SHARED_ARMS, student={"model": {"path": str(student)}, "dtype": "bfloat16"})
    (project / "config" / "panels" / "u.tsv").write_text("prompt_id\tprompt\nb1\ta lighthouse at night\n")
    cfg["storage"] = {"scratch": "results/scratch", "work": "results/work"}  # relative: a copy is a study
    cfg["panels"] = {"t": {"sheet": "config/panels/t.tsv", "seeds": [0, 1]},
                     "u": {"sheet": "config/panels/u.tsv", "seeds": [3]}}
    cfg["fleet"]["calibrate"] = True  # the study that checks calibration, estimate and ledger
    cfg["timing"] = {"repeats": 1}  # one timed run per candidate (not 3): latencies are read, not compared
    write_config(project, cfg)
    run_snakemake(project)
    return project


def copy_study(finished: Path, dest: Path) -> Path:
    """A private copy of the finished study ``finished`` at ``dest`` (mtimes kept, so
    Snakemake finds it as finished as the original)."""
    return Path(shutil.copytree(finished, dest, symlinks=True))


def study_config(project: Path) -> dict:
    """The config a study project was run with."""
    return yaml.safe_load((project / "config" / "config.yaml").read_text())


def run_processes(project: Path, root: int | None = None) -> dict[int, int]:
    """Live processes of a run, PID -> start time: descendants of ``root`` (while it lives)
    and the Parsl worker pools working for ``project`` (Parsl's ``process_worker_pool.py``,
    or ``pairflow.fleet.workerpool`` under forkserver; reparented to init by Parsl's launcher)
    with theirs. A PID is alive as the same process while its start time holds."""
    parents = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            text = (d / "stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        if fields[0] not in ("Z", "X"):
            parents[int(d.name)] = int(fields[1])
    tops = {root} & set(parents)
    for pid in parents:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if (b"process_worker_pool" in cmd or b"pairflow.fleet.workerpool" in cmd) and str(project).encode() in cmd:
            tops.add(pid)
    out, frontier = set(), set(tops)
    while frontier:
        out |= frontier
        frontier = {c for c, p in parents.items() if p in frontier} - out
    return {pid: t for pid in sorted(out) if (t := start_time(pid)) is not None}


@pytest.fixture(scope="session")
def test_mirror(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A weight mirror with random-initialised weights for every declared architecture
    (the real layout and lock; built once per session, about 2 GB and 20 s)."""
    from pairflow.metrics.weights import build_test_mirror

    out = tmp_path_factory.mktemp("mirror")
    build_test_mirror(out)
    return out


# ---- complete records, as the stages write them (before sealing) ---------------------

def _d(*parts: object) -> str:
    from pairflow.identity import digest_obj

    return digest_obj([str(p) for p in parts])


def arm_fields(name: str) -> dict:
    """A record's arm: control, or a treatment overriding guidance."""
    if name == "control":
        return {"name": name, "kinds": [], "cache_class": None, "cache_params": {}, "digest": _d("arm", name)}
    return {"name": name, "kinds": ["overrides"], "cache_class": None, "cache_params": {}, "guidance": 4.0,
            "digest": _d("arm", name)}


def candidate_fields(panel: str, prompt_id: str, seed: int, arm: str, stream_seed: int) -> dict:
    return {"study": "s", "panel": panel, "prompt_id": prompt_id, "prompt_digest": _d("prompt", prompt_id),
            "seed": seed, "arm": arm, "arm_digest": _d("arm", arm), "model_digest": _d("model"),
            "candidate_id": _d(panel, prompt_id, seed, arm), "stream_seed": stream_seed, "prompt": f"prompt {prompt_id}"}


GEN_SETTINGS = {"frames": 9, "height": 64, "width": 64, "steps": 6, "guidance": 5.0, "fps": 8, "dtype": "float32",
                "threads": 1, "negative_prompt": "", "max_text_tokens": None}


def generation_record(panel: str, prompt_id: str, seed: int, arm: str, stream_seed: int, video: str) -> dict:
    """A complete generation record (``recordtypes.GenerationRecord``) whose video's
    digests are derived from ``video`` (equal ``video`` = bit-identical videos)."""
    return {
        "kind": "generation", "candidate": candidate_fields(panel, prompt_id, seed, arm, stream_seed),
        "arm": arm_fields(arm), "generation": dict(GEN_SETTINGS), "effective_generation": dict(GEN_SETTINGS),
        "pipeline": {"class": "WanPipeline", "family": "wan", "transformer": "WanTransformer3DModel",
                     "max_text_tokens": 64},
        "compute": None,
        "video": {"path": f"videos/{arm}/{prompt_id}-s{seed}.mp4", "digest": _d("mp4", video), "bytes": 1000,
                  "frames": 9, "height": 64, "width": 64, "fps": "8/1", "pix_fmt": "yuv420p",
                  "raw_digest": _d("raw", video)},
        "frames": {"mean": 120.0, "std": 50.0, "flags": []},
        "timing": {"pass": "bulk", "import_s": 0.0, "load_s": 0.0, "generate_s": 1.0, "encode_s": 0.1,
                   "peak_rss_mb": 900.0},
        "worker": {"host": "h", "pid": 1, "device": "cpu", "warm_up": None},
        "code": {"commit": None, "dirty": None}, "environment": {},
        "model": {"kind": "embedded-tiny", "id": "tiny-wan", "revision": None, "weights": {"w": _d("w")}},
        "encoder": {"recipe": {"argv": []}, "recipe_digest": _d("recipe"),
                    "fingerprint": {"version": "ffmpeg", "digest": _d("ffmpeg")}},
        "config_digest": _d("config"), "site": {},
    }


def metric_spec(name: str, kind: str = "NR", higher_is_better: bool = True) -> dict:
    return {"name": name, "version": "1", "kind": kind, "higher_is_better": higher_is_better, "range": "0, 1",
            "source": "test", "weights": []}


SCORER = {"digest": _d("scorer"), "code_digest": _d("code"), "packages": {}, "weights_lock": None,
          "weights_origin": None, "static_filter": "none", "decode": "bt709", "device": "cpu",
          "precision": "float32", "threads": 1, "batch": 16, "workers": 1, "layout": "test"}


def score_record(gen: dict, control: dict, scores: dict[str, tuple[float, dict]]) -> dict:
    """A complete score record of generation record ``gen`` (``control``: its pair's
    control record); ``scores``: metric name -> (value, spec)."""
    return {
        "kind": "score", "candidate": gen["candidate"], "arm": gen["arm"], "video_digest": gen["video"]["digest"],
        "control_video_digest": control["video"]["digest"],
        "generation_record_digest": gen.get("record_digest", _d("record", gen["candidate"]["candidate_id"])),
        "compared_frames": "decoded lossy video",
        "static_filter": {"temporal_flickering": "none", "meaning": "every video"},
        "scores": {n: {"value": v, "spec": spec, "decoded_with": "bt709"} for n, (v, spec) in scores.items()},
        "scorer": dict(SCORER), "timing": {"score_s": 0.1}, "worker": {"host": "h", "pid": 1},
    }


def timing_record(gen: dict, latency_s: float | None, matches: bool = True, gpu: str | None = None,
                  peak_mb: float = 2048.0) -> dict:
    """A complete timed-pass record of ``gen``: sampled with ``latency_s`` (three repeats
    around it), or not sampled when ``latency_s`` is None. ``gpu``: timed on CUDA on the GPU
    torch names so, with ``peak_mb`` of peak device memory (else on the CPU)."""
    base = {"kind": "timing", "candidate": gen["candidate"], "arm": gen["arm"],
            "generation_record_digest": gen.get("record_digest", _d("record", gen["candidate"]["candidate_id"]))}
    if latency_s is None:
        return {**base, "sampled": False, "matches_bulk_frames": None,
                "timing": {"pass": "timed", "latency_s": None, "pairs": 1, "seed": 0}}
    seconds = [latency_s * 0.99, latency_s, latency_s * 1.01]
    rec = {**base, "sampled": True, "matches_bulk_frames": matches, "gpu": None,
           "worker": {"host": "h", "pid": 1, "device": "cpu", "node": None},
           "timing": {"pass": "timed", "latency_s": latency_s, "pairs": "all", "seed": 0, "seconds": seconds,
                      "rounds": [0, 1, 2], "cv": 0.01, "max_cv": 0.05, "over_max_cv": False,
                      "phases_s": {"denoise": latency_s / 2, "decode": latency_s / 4, "other": latency_s / 4,
                                   "total": latency_s},
                      "clock": "perf_counter", "order": "seeded", "warmup_per_arm": 1, "repeats": 3, "batch": 1,
                      "synchronised": False, "device": "cpu", "threads": 1, "cuda_settings": None,
                      "peak_device_mb": None, "covers": "one generation"}}
    if gpu is not None:
        rec["timing"].update(device="cuda", gpu_name=gpu, peak_device_mb=peak_mb, clock="cuda_events",
                             synchronised=True)
        rec["worker"]["device"] = "cuda"
    return rec


_SPS_COLOUR = {"video_full_range_flag": "full_range", "colour_primaries": "primaries",
               "transfer_characteristics": "transfer", "matrix_coefficients": "matrix"}


def ffmpeg_colour_reading(ffmpeg: str, path: Path) -> tuple[dict[str, set[int]], list[dict[str, int]]]:
    """What ffmpeg's own parsers read of a video's colour tags, independently of PyAV and of
    PairFlow's readers: the H.264 SPS fields (``full_range``, ``primaries``, ``transfer``,
    ``matrix``: every value of every SPS, absent when no SPS has the field) as the
    ``trace_headers`` bitstream filter logs them, and each MP4 ``colr`` box ({'kind',
    'primaries', 'transfer', 'matrix', and 'full_range' for nclx}) as the mov demuxer logs it
    at trace level."""
    import re

    headers = subprocess.run([ffmpeg, "-hide_banner", "-loglevel", "info", "-i", str(path), "-c", "copy", "-bsf:v",
                              "trace_headers", "-f", "null", "-"], check=True, capture_output=True, text=True).stderr
    stream: dict[str, set[int]] = {}
    for field, value in re.findall(r"\] \d+\s+(" + "|".join(_SPS_COLOUR) + r")\s+[01]+ = (\d+)", headers):
        stream.setdefault(_SPS_COLOUR[field], set()).add(int(value))
    log = subprocess.run([ffmpeg, "-hide_banner", "-loglevel", "trace", "-i", str(path), "-frames:v", "1", "-f", "null",
                          "-"], check=True, capture_output=True, text=True, errors="replace").stderr
    boxes = [{"kind": kind, "primaries": int(p), "transfer": int(t), "matrix": int(m),
              **({"full_range": int(full)} if full else {})}
             for kind, p, t, m, full in re.findall(r"(nclx|nclc): pri (\d+) trc (\d+) matrix (\d+)(?: full (\d+))?", log)]
    return stream, boxes


@pytest.fixture
def recipe_video(tmp_path: Path, encoder_spec) -> Path:  # type: ignore[no-untyped-def]
    """A short video written by the recipe (test_h264 reads its SPS, test_mp4 its colr boxes)."""
    import numpy as np

    from pairflow.media.video import encode, prepare_frames

    frames = np.random.default_rng(0).integers(0, 256, (3, 32, 48, 3), dtype=np.uint8)
    u8, _ = prepare_frames(frames, encoder_spec)
    encode(u8, tmp_path / "v.mp4", encoder_spec, 8)
    return tmp_path / "v.mp4"
