"""A panel's work: enumerate its candidates, skip the complete ones, fan out the rest.

Where each file lives is ``layout``'s business; the functions below name a candidate's
files through it.

A candidate is complete when its record verifies (self-digest), names the same
candidate id and encoder recipe, and its video's bytes match the recorded digest. Only
incomplete candidates run, so a rerun after a kill or a deleted video redoes exactly
those.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import ArmSpec, PanelSpec, Prompt, StudySpec
from .context import load_context, write_context
from .errors import IntegrityError, PairFlowError
from .fleet import Grant
from .identity import CandidateKey, digest_obj
from .layout import Layout
from .locks import hold
from .records import build_manifest, check_video, read_record, stable_root, write_manifest, write_record
from .stats import check_streams

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    key: CandidateKey
    prompt: Prompt
    arm: ArmSpec

    @property
    def stem(self) -> str:
        return f"{self.key.prompt_id}-s{self.key.seed}"


def panel_dir(study: StudySpec, panel: str) -> Path:
    return Layout(study.scratch).panel(panel)


def video_path(study: StudySpec, c: Candidate) -> Path:
    return Layout(study.scratch).output(c.key.panel, "videos", c.arm.name, c.stem)


def record_path(study: StudySpec, c: Candidate) -> Path:
    return Layout(study.scratch).output(c.key.panel, "records", c.arm.name, c.stem)


def score_path(study: StudySpec, c: Candidate) -> Path:
    return Layout(study.scratch).output(c.key.panel, "scores", c.arm.name, c.stem)


def candidates(study: StudySpec, panel: PanelSpec) -> list[Candidate]:
    """Every (prompt, seed, arm) of a panel, in a fixed order."""
    model_digest = digest_obj(study.model.identity())
    return [Candidate(CandidateKey(study.study, panel.name, p.prompt_id, p.digest, seed, arm.name,
                                   arm.digest, model_digest), p, arm)
            for p in panel.prompts for seed in panel.seeds for arm in study.arms]


def provenance(study: StudySpec) -> dict[str, Any]:
    """Fields shared by every record of a run (computed once in the driver)."""
    from .envinfo import code_version, environment
    from .generate import model_digests
    from .video import encoder_fingerprint, recipe, recipe_digest

    fingerprint = encoder_fingerprint(study.encoder)
    return {
        "code": code_version(str(study.root)),
        "environment": environment(),
        "model": {**study.model.identity(), "weights": model_digests(study.model)},
        "encoder": {"recipe": recipe(study.encoder, study.generation.fps),
                    "recipe_digest": recipe_digest(study.encoder, study.generation.fps),
                    "fingerprint": {k: fingerprint[k] for k in ("version", "digest")}},
        "config_digest": study.subtree_digest("study", "model", "arms", "generation", "encoder"),
        # Where things were on this site: run-specific, not part of what was computed.
        "site": {"model_path": str(study.model.path), "ffmpeg_binary": fingerprint["binary"],
                 "scratch": str(study.scratch)},
    }


def complete_record(study: StudySpec, c: Candidate, recipe_digest: str) -> dict[str, Any] | None:
    """The candidate's record when it and its video verify and match the candidate's
    identity and encoder recipe; None when the candidate must be (re)generated."""
    path = record_path(study, c)
    if not path.exists():
        return None
    try:
        record = read_record(path)
        check_video(record, path)
    except PairFlowError as e:
        log.warning("will regenerate: %s", e)
        return None
    if (record["candidate"]["candidate_id"] != c.key.candidate_id
            or record["encoder"]["recipe_digest"] != recipe_digest):
        return None
    return record


WARM_UP: dict[str, float] = {}
"""This worker's warm-up task's figures (seconds importing, loading), empty when none ran here."""


def _timed_imports(modules: tuple[str, ...]) -> float:
    """Seconds spent importing ``modules`` now (about 0 when this process already has them)."""
    import importlib

    started = time.perf_counter()
    for m in modules:
        importlib.import_module(m)
    return time.perf_counter() - started


def warm_generation(payload: dict[str, Any]) -> dict[str, Any]:
    """Parsl warm-up task: import torch and diffusers and load the model in this worker
    while the driver still prepares the job's candidates. Returns (and keeps for the
    worker's records) the seconds spent on each."""
    from . import generate as g

    import_s = _timed_imports(("torch", "diffusers"))
    started = time.perf_counter()
    g.load_pipeline(payload["model"], payload["dtype"], payload["threads"])
    WARM_UP.update({"import_s": import_s, "load_s": time.perf_counter() - started})
    return dict(WARM_UP)


def warm_scoring(payload: dict[str, Any]) -> dict[str, Any]:
    """Parsl warm-up task: import torch, pyiqa and the scorers in this worker while the
    driver still verifies the job's records (scorer models load on first use)."""
    import_s = _timed_imports(("torch", "pyiqa", "pairflow.scoring", "pairflow.video"))
    WARM_UP.update({"import_s": import_s})
    return dict(WARM_UP)


def generate_task(payload: dict[str, Any]) -> dict[str, Any]:
    """Parsl task: generate, guard, encode and record one candidate (runs in a worker)."""
    from . import generate as g
    from .arms import arm_model, arm_pipeline, run_arm, verifier_for
    from .fleet import worker_identity
    from .video import encode, prepare_frames

    shared = load_context(payload["context"])
    study: StudySpec = shared["study"]
    c: Candidate = payload["candidate"]
    import_s = _timed_imports(("torch", "diffusers"))
    loaded = time.perf_counter()
    pipe = arm_pipeline(c.arm, study.model, study.generation)
    load_s = time.perf_counter() - loaded
    tokens = g.text_tokens(pipe, study.generation)
    # The bulk pass counts the transformer's work (compute.counting); the timed pass does not.
    result = run_arm(pipe, c.prompt.text, c.key.stream_seed, c.arm, study.generation, tokens, count=True,
                     verifier=verifier_for(c.arm, study))
    frames, stats = prepare_frames(result.frames, study.encoder)
    started = time.perf_counter()
    info = encode(frames, video_path(study, c), study.encoder, study.generation.fps)
    encode_s = time.perf_counter() - started
    record = {
        "kind": "generation",
        "candidate": {**c.key.__dict__, "candidate_id": c.key.candidate_id,
                      "stream_seed": c.key.stream_seed, "prompt": c.prompt.text},
        "arm": arm_record(c.arm),
        "generation": study.generation.__dict__,
        # What this arm ran with: the study's generation settings with its overrides.
        "effective_generation": g.effective_generation(c.arm, study.generation).__dict__,
        "pipeline": g.pipeline_info(pipe, tokens),
        "compute": result.compute,
        # The video's path is relative to the panel directory, so records stay valid when a
        # scratch tree is moved and compare equal across sites.
        "video": {**info.asdict(), "path": video_path(study, c).relative_to(panel_dir(study, c.key.panel)).as_posix()},
        "frames": {"mean": stats.mean, "std": stats.std, "flags": list(stats.flags)},
        # import_s and load_s are what this task spent importing and loading (0 when the
        # worker's warm-up task or an earlier task already did); the warm-up's own figures
        # are under worker.warm_up.
        "timing": {"pass": "bulk", "import_s": import_s, "load_s": load_s, "generate_s": result.seconds,
                   "encode_s": encode_s, "peak_rss_mb": result.peak_rss_mb},
        "worker": {**worker_identity(), "device": result.device, "threads": result.threads,
                   "model_loads": dict(g.LOAD_COUNTS), "warm_up": WARM_UP or None},
        **shared["provenance"],
    }
    if c.arm.search is not None:
        record["search"] = {"n": c.arm.search.n, "verifier": c.arm.search.verifier, "chosen": result.chosen,
                            "seeds": "candidate 0: the pair's stream seed; i >= 1: xxh3_64(['search', stream_seed, "
                                     "i]) & (2^63 - 1) (pairflow.arms.search_seeds)",
                            "candidates": list(result.candidates)}
    if c.arm.model is not None:
        m = arm_model(c.arm, study.model)
        record["arm_model"] = {**m.identity(), "weights": g.model_digests(m), "path": str(m.path)}
    write_record(record_path(study, c), record)
    return {"candidate_id": c.key.candidate_id, "worker": record["worker"]}


def run_generation(study: StudySpec, panel_name: str, manifest_out: Path, run_dir: Path,
                   grant: Grant) -> dict[str, Any]:
    """Generate every incomplete candidate of a panel, then write its generation manifest.

    ``grant`` is what this job was given (``fleet.grant_from_env``): one worker per
    granted accelerator, else CPU workers. Holds the panel's lock throughout: a second
    run on the same panel fails at once."""
    with hold(panel_dir(study, panel_name), f"generate {panel_name}"):
        return _run_generation(study, panel_name, manifest_out, run_dir, grant)


def telemetry_path(study: StudySpec, panel: str, stage: str) -> Path:
    """The stage's telemetry record (spans, busy share, NVML) for its last run with work."""
    return Layout(study.scratch).telemetry(panel, stage)


def failure_path(study: StudySpec, c: Candidate, stage: str) -> Path:
    """Where a candidate's task that failed after its retries is recorded (never a record
    location, so a failure can never look complete)."""
    return Layout(study.scratch).failure(c.key.panel, stage, c.arm.name, c.stem)


def _describe(payload: dict[str, Any]) -> str:
    """A task as the stall error names it: arm/prompt-seed."""
    c: Candidate = payload["candidate"]
    return f"{c.arm.name}/{c.stem}"


def _clear_failures(study: StudySpec, done: list[Candidate], stage: str) -> None:
    for c in done:
        failure_path(study, c, stage).unlink(missing_ok=True)


def sweep_panel(study: StudySpec, panel: str, started: float, subdirs: tuple[str, ...]) -> None:
    """Remove ``.tmp-*`` leftovers older than this job (``started``) from the folders a
    panel job writes: the panel directory, its telemetry, and each arm's ``subdirs``
    folder (records, videos, scores, failures/<stage>)."""
    from .atomic import sweep_temps

    layout = Layout(study.scratch)
    pdir = layout.panel(panel)
    folders = [pdir, layout.telemetry_dir(panel)]
    folders += [pdir / sub / arm.name for sub in subdirs for arm in study.arms]
    for f in sweep_temps(folders, started):
        log.info("removed %s, left by an interrupted write", f)


def task_identity(c: Candidate) -> dict[str, Any]:
    """What a failure record names of its task (beside the path it is written to)."""
    return {"candidate_id": c.key.candidate_id, "panel": c.key.panel, "arm": c.arm.name,
            "prompt_id": c.key.prompt_id, "seed": c.key.seed}


def _run_generation(study: StudySpec, panel_name: str, manifest_out: Path, run_dir: Path,
                    grant: Grant) -> dict[str, Any]:
    from .atomic import job_start
    from .evidence import config_snapshot
    from .fleet import run_tasks
    from .video import recipe_digest

    sweep_panel(study, panel_name, job_start(), ("records", "videos", "failures/generate"))
    panel = study.panel(panel_name)
    todo_all = candidates(study, panel)
    rdigest = recipe_digest(study.encoder, study.generation.fps)
    records: dict[Path, dict[str, Any]] = {}  # verified records, so each video is hashed once per job
    todo: list[Candidate] = []

    def prepare() -> list[dict[str, Any]]:
        """Runs while the workers start and warm up: find the incomplete candidates."""
        for c in todo_all:
            record = complete_record(study, c, rdigest)
            if record is None:
                todo.append(c)
            else:
                records[record_path(study, c)] = record
        log.info("generate %s: %d candidates, %d complete, %d to run", panel_name, len(todo_all),
                 len(todo_all) - len(todo), len(todo))
        ref = write_context(study.scratch, {"study": study, "provenance": provenance(study)})
        return [{"context": ref, "candidate": c, "identity": task_identity(c)} for c in todo]

    warm = (warm_generation, {"model": study.model, "dtype": study.generation.dtype,
                              "threads": study.generation.threads})
    results = run_tasks(generate_task, prepare, run_dir, study.fleet, grant, f"generate {panel_name}",
                        telemetry_path(study, panel_name, "generate"),
                        lambda p: failure_path(study, p["candidate"], "generate"), _describe, warm=warm,
                        # Start the pool before preparing only when work is certain (a record is
                        # missing); else only once prepare() found some, so a no-op job starts none.
                        start_early=any(not record_path(study, c).exists() for c in todo_all))
    _clear_failures(study, todo_all, "generate")  # every candidate is complete now
    for c in todo:  # every new record must verify before the manifest binds it
        path = record_path(study, c)
        records[path] = read_record(path)
        check_video(records[path], path)
    files = [record_path(study, c) for c in todo_all]
    check_streams(list(records.values()))
    manifest = build_manifest("panel-generation", panel_dir(study, panel_name), files,
                              {"study": study.study, "panel": panel_name,
                               "stable_root": stable_root(panel_dir(study, panel_name), records),
                               "config": config_snapshot(study)})
    write_manifest(manifest_out, manifest)
    return {"ran": len(todo), "reused": len(todo_all) - len(todo), "results": results}


def expected_scores(study: StudySpec, arm: ArmSpec) -> list[str]:
    """The metrics a candidate of ``arm`` gets: all, except fidelity (FR) metrics for the
    control, which is its own reference."""
    from .scoring import metric_spec

    return sorted(n for n in study.scorers if not (arm.is_control and metric_spec(n).kind == "FR"))


def arm_record(arm: ArmSpec) -> dict[str, Any]:
    """What a record says of its arm: name, kinds of change and every output-changing field."""
    return {"name": arm.name, "kinds": list(arm.kinds), **arm.asdict(), "digest": arm.digest}


def arm_of(record: dict[str, Any]) -> ArmSpec:
    """The arm a record names, as far as scoring needs it (its name decides control)."""
    return ArmSpec(record["arm"]["name"], record["arm"].get("cache_class"), record["arm"].get("cache_params", {}))


def study_weights(study: StudySpec) -> list[str]:
    """Weight keys the study's scoring needs: its scorers', plus RAFT when
    temporal_flickering uses VBench's static filter (``scoring/static_filter: intersection``)."""
    from .scoring import needed_weights

    extra = ["raft_large"] if uses_static_filter(study) else []
    return sorted(set(needed_weights(study.scorers)) | set(extra))


def uses_static_filter(study: StudySpec) -> bool:
    return study.scoring.static_filter == "intersection" and "temporal_flickering" in study.scorers


def scorer_build(study: StudySpec, grant: Grant | None = None) -> dict[str, Any]:
    """What computed the scores, the same for both arms of every pair of a run: the
    scoring code's digest (``pairflow/scoring`` and ``weights.py``), library versions, the
    weight mirror's lock digest and origin, device type, precision, threads and process
    layout. Raises WeightsError (naming the file, the digests and the mirror command)
    when a file a configured scorer needs is missing from the mirror or altered."""
    from . import weights
    from .envinfo import package_version
    from .identity import digest_file, digest_tree

    accelerators = grant.accelerators if grant else ()
    workers = len(accelerators) or study.fleet.cpu_workers
    # The kind and count of slots, never which GPU indices: panels scored on different
    # GPUs of one study share a build, so their pairs pool.
    slots = "one per granted accelerator" if accelerators else "CPU workers"
    keys = study_weights(study)
    weights.verify(study.weights.mirror, keys, needed_by=f"scorers {', '.join(study.scorers)}")
    lock = weights.read_lock(study.weights.mirror) if keys else None
    here = Path(__file__).resolve().parent
    code = {**{f"scoring/{k}": v for k, v in digest_tree(here / "scoring").items() if k.endswith(".py")},
            "weights.py": digest_file(here / "weights.py")}

    build = {
        "code_digest": digest_obj(code),
        "packages": {p: package_version(p) for p in ("pairflow", "pyiqa", "torch", "torchvision", "timm", "openai-clip",
                                              "numpy")},
        "weights_lock": lock.digest if lock else None,
        "weights_origin": lock.origin if lock else None,
        "static_filter": study.scoring.static_filter,
        "decode": study.scoring.decode,
        "device": "cpu", "precision": "float32", "threads": study.scoring.threads, "batch": study.scoring.batch,
        "workers": workers,
        "layout": (f"parsl htex, {workers} worker process(es) ({slots}), scorer models loaded once per worker "
                   "and run on CPU"),
    }
    return {**build, "digest": digest_obj(build)}


STATIC_FILTER_MEANING = {
    "none": "every video of both arms is scored (no RAFT static filter): one subset for both arms",
    "intersection": "every video is scored and flagged static or not by VBench's RAFT filter; the statistics "
                    "use only pairs whose control and treatment videos are both static",
}


def compared_frames(study: StudySpec) -> str:
    """Which frames the metrics saw (written into every score record)."""
    if study.encoder.lossless:
        return ("decoded lossless video (libx264rgb QP 0): bit-identical to the generated uint8 RGB frames, "
                "so fidelity metrics carry no codec noise")
    return (f"decoded lossy video ({study.encoder.codec} CRF {study.encoder.crf}, {study.encoder.pix_fmt}; uint8 RGB, "
            "BT.709 limited range): fidelity metrics include codec noise; set encoder/lossless: true to compare "
            "lossless copies")


def metric_decoding(study: StudySpec, name: str) -> str:
    """The YUV->RGB matrix a metric's frames are decoded with (``video.DECODE_MATRICES``):
    under ``scoring/decode: vbench`` the VBench dimensions (NR metrics) see BT.601-decoded
    frames as VBench does through OpenCV; FR metrics, and everything under ``bt709``, see
    frames decoded with the BT.709 matrix the videos were encoded with."""
    from .scoring import metric_spec

    return "bt601" if study.scoring.decode == "vbench" and metric_spec(name).kind == "NR" else "bt709"


DECODING_MEANING = {
    "bt709": "decoded with the BT.709 matrix the video was encoded with",
    "bt601": "decoded with the BT.601 matrix, as VBench does through OpenCV 4.x (scoring/decode: vbench)",
}


def _task_view(record: dict[str, Any]) -> dict[str, Any]:
    """What a score task needs of a generation record (not its provenance): a task's
    payload stays the same size whatever the study."""
    return {k: record[k] for k in ("candidate", "arm", "video", "record_digest")}


def score_task(payload: dict[str, Any]) -> dict[str, Any]:
    """Parsl task: score one candidate's video (and against its control for FR metrics).
    Models stay loaded in the worker for the next task (``scoring.models.LOAD_COUNTS``)."""
    import torch

    from .fleet import worker_identity
    from .scoring import ScoreContext, metric_spec, score
    from .scoring.models import LOAD_COUNTS
    from .video import read_video

    shared = load_context(payload["context"])
    study: StudySpec = shared["study"]
    rec, ctrl = payload["record"], payload["control"]
    g = study.generation
    torch.set_num_threads(study.scoring.threads)

    def decode(r: dict[str, Any], matrix: str = "bt709") -> Any:
        return read_video(panel_dir(study, r["candidate"]["panel"]) / r["video"]["path"], study.encoder,
                          frames=r["video"]["frames"], height=r["video"]["height"], width=r["video"]["width"],
                          fps=g.fps, matrix=matrix)

    started = time.perf_counter()
    names = expected_scores(study, arm_of(rec))
    decoding = {name: metric_decoding(study, name) for name in names}
    wanted = set(decoding.values()) | {metric_decoding(study, "temporal_flickering")}
    frames = {m: decode(rec, m) for m in sorted(wanted)}
    ref = decode(ctrl) if rec["arm"]["name"] != "control" else None  # FR metrics: always BT.709
    ctx = ScoreContext(mirror=study.weights.mirror, batch=study.scoring.batch, fps=g.fps)
    digests = shared["weight_digests"]
    scores = {name: {"value": score(name, frames[decoding[name]], ref, ctx), "spec": metric_spec(name).asdict(digests),
                     "decoded_with": decoding[name]}
              for name in names}
    if uses_static_filter(study):
        from .scoring.dynamic_degree import is_dynamic, pair_motion

        seen = frames[metric_decoding(study, "temporal_flickering")]
        pairs, n = pair_motion(seen, ctx)
        # VBench's static filter: a video is static when its RAFT motion does not make it dynamic
        scores["temporal_flickering"]["static"] = not is_dynamic(pairs, min(seen.shape[1:3]), n)
    record = {
        "kind": "score",
        "candidate": rec["candidate"],
        "arm": rec["arm"],
        "video_digest": rec["video"]["digest"],
        "control_video_digest": ctrl["video"]["digest"],
        "generation_record_digest": rec["record_digest"],
        "compared_frames": compared_frames(study),
        "static_filter": {"temporal_flickering": study.scoring.static_filter,
                          "meaning": STATIC_FILTER_MEANING[study.scoring.static_filter]},
        "scores": scores,
        "scorer": shared["scorer"],
        "timing": {"score_s": time.perf_counter() - started},
        "worker": {**worker_identity(), "scorer_loads": dict(LOAD_COUNTS), "warm_up": WARM_UP or None},
    }
    write_record(Path(payload["out"]), record)
    return {"candidate_id": rec["candidate"]["candidate_id"]}


def run_scoring(study: StudySpec, panel_name: str, manifest_out: Path, run_dir: Path,
                grant: Grant) -> dict[str, Any]:
    """Score every candidate whose score record is missing or stale, then write the
    manifest. Scoring runs on the same per-accelerator slots as generation."""
    with hold(panel_dir(study, panel_name), f"score {panel_name}"):
        return _run_scoring(study, panel_name, manifest_out, run_dir, grant)


def _run_scoring(study: StudySpec, panel_name: str, manifest_out: Path, run_dir: Path,
                 grant: Grant) -> dict[str, Any]:
    from .atomic import job_start
    from .fleet import run_tasks
    from .weights import verify

    sweep_panel(study, panel_name, job_start(), ("scores", "failures/score"))
    build = scorer_build(study, grant)  # fails fast, before any worker starts, on a missing or altered weight
    digests = verify(study.weights.mirror, study_weights(study))
    panel = study.panel(panel_name)
    todo_all = candidates(study, panel)
    payloads: list[dict[str, Any]] = []

    def prepare() -> list[dict[str, Any]]:
        """Runs while the workers start and warm up: verify every generation record and
        video, and find the candidates whose score is missing or stale."""
        records = {}
        for c in todo_all:
            path = record_path(study, c)
            records[c.key.candidate_id] = read_record(path)
            check_video(records[c.key.candidate_id], path)
        control = {c.key.pair_key: records[c.key.candidate_id] for c in todo_all if c.arm.is_control}
        ref = write_context(study.scratch, {"study": study, "scorer": build, "weight_digests": digests})
        for c in todo_all:
            rec, ctrl = records[c.key.candidate_id], control[c.key.pair_key]
            out = score_path(study, c)
            try:
                old = read_record(out)
                # A score is bound to its candidate's current generation record: a regenerated
                # candidate is rescored even when its video came out bit-identical.
                if (old["generation_record_digest"] == rec["record_digest"]
                        and old["video_digest"] == rec["video"]["digest"]
                        and old["control_video_digest"] == ctrl["video"]["digest"]
                        and sorted(old["scores"]) == expected_scores(study, c.arm)
                        and old["scorer"].get("digest") == build["digest"]):  # both arms: one scorer build
                    continue
            except (IntegrityError, KeyError):
                pass
            payloads.append({"context": ref, "record": _task_view(rec), "control": _task_view(ctrl),
                             "out": str(out), "candidate": c, "identity": task_identity(c)})
        log.info("score %s: %d candidates, %d to score", panel_name, len(todo_all), len(payloads))
        return payloads

    run_tasks(score_task, prepare, run_dir, study.fleet, grant, f"score {panel_name}",
              telemetry_path(study, panel_name, "score"), lambda p: failure_path(study, p["candidate"], "score"),
              _describe, warm=(warm_scoring, {}),
              start_early=any(not score_path(study, c).exists() for c in todo_all))
    _clear_failures(study, todo_all, "score")  # every candidate is scored now
    files = [score_path(study, c) for c in todo_all]
    for f in files:
        read_record(f)
    manifest = build_manifest("panel-scores", panel_dir(study, panel_name), files,
                              {"study": study.study, "panel": panel_name, "ran": len(payloads),
                               "scorer_build": build["digest"]})
    write_manifest(manifest_out, manifest)
    return {"ran": len(payloads)}
