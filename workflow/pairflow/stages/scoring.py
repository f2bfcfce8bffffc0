"""Scoring stage: every video of a panel gets its metrics (and its fidelity to the
control for FR metrics), as one Parsl task per candidate, bound to the generation
record, the videos and one scorer build shared by both arms of every pair."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, cast

from ..atomic import job_start
from ..budget.calibrate import workers_for
from ..envinfo import package_version
from ..errors import IntegrityError
from ..fleet.pool import Grant, TaskHooks, run_tasks, worker_identity
from ..fleet.telemetry import PhaseMemory, close_job
from ..generation.generate import CUDA_SETTINGS, pin_cuda
from ..generation.provenance import arm_of
from ..identity import digest_obj, digest_tree
from ..layout import Layout
from ..locks import hold
from ..media.video import read_video
from ..metrics import ScoreContext, metric_spec, needed_weights, score, warm, weights
from ..metrics.dynamic_degree import is_dynamic, pair_motion
from ..metrics.models import LOAD_COUNTS, release_frames
from ..metrics.weights import verify
from ..plan.candidates import (
    Candidate,
    candidates,
    expected_scores,
    failure_path,
    panel_dir,
    record_path,
    score_path,
    scores_stale,
    task_identity,
    telemetry_path,
)
from ..plan.config import StudySpec
from ..plan.context import load_context, write_context
from ..records.store import build_manifest, check_video, read_record, write_manifest, write_record
from ..records.types import (
    Decoding,
    GenerationRecord,
    MetricSpecFields,
    PhaseMemoryFields,
    ScoreEntry,
    ScorerBuild,
    ScoreRecord,
    StaticFilter,
)
from ..records.vouch import vouch
from .jobs import WARM_UP, clear_failures, describe, sweep_after, sweep_panel, timed_imports

# Lazy on purpose: torch is imported inside the functions that run in a worker: the driver and rule scripts
# import this module without it.

log = logging.getLogger(__name__)


def study_weights(study: StudySpec) -> list[str]:
    """Weight keys the study's scoring needs: its scorers', plus RAFT when
    temporal_flickering uses VBench's static filter (``scoring/static_filter: intersection``)."""
    extra = ["raft_large"] if uses_static_filter(study) else []
    return sorted(set(needed_weights(study.scorers)) | set(extra))


def uses_static_filter(study: StudySpec) -> bool:
    return study.scoring.static_filter == "intersection" and "temporal_flickering" in study.scorers


def scorer_build(study: StudySpec, grant: Grant | None = None, cuda: bool | None = None) -> ScorerBuild:
    """What computed the scores, the same for both arms of every pair of a run: the
    scoring code's digest (the ``pairflow/metrics`` wing, ``weights.py`` included), library versions, the
    weight mirror's lock digest and origin, device type, precision, threads and process
    layout; on CUDA also the cuDNN and TF32 settings every scoring worker pins
    (``generate.CUDA_SETTINGS``: no TF32, deterministic cuDNN, no autotuning), so a score
    job and a combined job score in the same float32 under the same digest. Raises
    WeightsError (naming the file, the digests and the mirror command) when a file a
    configured scorer needs is missing from the mirror or altered."""
    accelerators = grant.accelerators if grant else ()
    device = scoring_device(grant, cuda)
    workers = len(accelerators) or study.fleet.cpu_workers
    # The kind and count of slots, never which GPU indices: panels scored on different
    # GPUs of one study share a build, so their pairs pool.
    slots = "one per granted accelerator" if accelerators else "CPU workers"
    keys = study_weights(study)
    weights.verify(study.weights.mirror, keys, needed_by=f"scorers {', '.join(study.scorers)}")
    lock = weights.read_lock(study.weights.mirror) if keys else None
    # the metrics wing: every scorer module and the weight mirror's code (metrics/weights.py)
    here = Path(__file__).resolve().parent.parent / "metrics"
    code = {f"metrics/{k}": v for k, v in digest_tree(here).items() if k.endswith(".py")}

    build: dict[str, Any] = {
        "code_digest": digest_obj(code),
        "packages": {p: package_version(p) for p in ("pairflow", "pyiqa", "torch", "torchvision", "timm", "openai-clip",
                                              "numpy")},
        "weights_lock": lock.digest if lock else None,
        "weights_origin": lock.origin if lock else None,
        "static_filter": study.scoring.static_filter,
        "decode": study.scoring.decode,
        "device": device, "precision": f"float32; CLIP image towers {clip_precision(study, device)}",
        "threads": study.scoring.threads, "batch": study.scoring.batch,
        "workers": workers,
        "layout": (f"parsl htex, {workers} worker process(es) ({slots}), scorer models loaded once per worker "
                   f"and run on {'the slot GPU (cuda)' if device == 'cuda' else 'CPU'}"),
        # only on CUDA: a CPU build's digest, and the CPU scores bound to it, stay as they were
        **({"cuda_settings": dict(CUDA_SETTINGS)} if device == "cuda" else {}),
    }
    return cast(ScorerBuild, {**build, "digest": digest_obj(build)})


STATIC_FILTER_MEANING: dict[StaticFilter, str] = {
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


def metric_decoding(study: StudySpec, name: str) -> Decoding:
    """The YUV->RGB matrix a metric's frames are decoded with (``video.DECODE_MATRICES``).
    ``scoring/decode: bt709``: the BT.709 matrix every video declares, for every metric.
    ``scoring/decode: vbench``: each VBench dimension as VBench 0.1.5 reads it (its spec's
    ``vbench_reader``): ``opencv`` dimensions (dynamic_degree, motion_smoothness,
    temporal_flickering) BT.601 as OpenCV 4.x's ``VideoCapture``; ``decord`` dimensions
    (subject_consistency, background_consistency, aesthetic_quality, imaging_quality)
    BT.709, which is how decord decodes the recipe's BT.709-tagged videos; other metrics
    (FR) BT.709."""
    return "bt601" if study.scoring.decode == "vbench" and metric_spec(name).vbench_reader == "opencv" else "bt709"


def scoring_device(grant: Grant | None, cuda: bool | None = None) -> str:
    """Where this job's metrics run: ``cuda`` when its slots were granted accelerators
    (one worker per GPU, each seeing only its own as ``cuda``) and torch sees CUDA
    (``cuda``; asked of torch when None), else ``cpu``, as generation decides
    (``generate.device``): a slot granted a device torch cannot use (a CPU-only build of
    torch, or Slurm gres on a node without a CUDA driver, as in CI) scores on the CPU."""
    if grant is None or not grant.accelerators:
        return "cpu"
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    return "cuda" if cuda else "cpu"


def clip_precision(study: StudySpec, device: str = "cpu") -> str:
    """The CLIP towers' precision: ``scoring/clip_precision``, where ``auto`` is fp32 on
    CPU and fp16 (VBench's) on CUDA."""
    chosen = study.scoring.clip_precision
    return chosen if chosen != "auto" else ("fp16" if device == "cuda" else "fp32")


def _task_view(record: GenerationRecord) -> dict[str, Any]:
    """What a score task needs of a generation record (not its provenance): a task's
    payload stays the same size whatever the study."""
    return {k: record[k] for k in ("candidate", "arm", "video", "record_digest")}


SCORER_MODULES = ("pyiqa", "pairflow.metrics", "pairflow.media.video")
"""What every scoring worker imports in its warm-up (besides torch); the study's metric
modules and their models' libraries follow (``warm_scorers``)."""


def scorer_warm_payload(study: StudySpec, build: ScorerBuild) -> dict[str, Any]:
    """What ``warm_scorers`` prepares in a worker: the study's scorers, the weight files
    they use (RAFT for the static filter included), the mirror, and the build's device and
    CLIP precision (so the warm-up fills the very cache entries the score tasks read)."""
    device = build["device"]
    return {"scorers": list(study.scorers), "weights": study_weights(study), "mirror": study.weights.mirror,
            "device": device, "clip_precision": clip_precision(study, device)}


def warm_scorers(payload: dict[str, Any]) -> dict[str, float]:
    """In a worker, before its first score task: pin ``generate.CUDA_SETTINGS`` when it
    scores on CUDA (torch's default lets cuDNN use TF32), import the study's metric
    modules and their models' libraries and build their models on the slot's device
    (``metrics.warm``). Returns ``import_s`` and ``load_s`` (seconds). Raises what
    scoring would (WeightsError for a missing or altered weight file)."""
    if payload["device"] == "cuda":
        pin_cuda()
    ctx = ScoreContext(mirror=payload["mirror"], device=payload["device"], clip_precision=payload["clip_precision"])
    return warm(payload["scorers"], ctx, payload["weights"])


def warm_scoring(payload: dict[str, Any]) -> dict[str, Any]:
    """Parsl warm-up task (``payload``: ``scorer_warm_payload``): import torch, pyiqa and
    the scorers and load the study's scorer models in this worker while the driver still
    verifies the job's records, so the first score task's span is scoring alone."""
    import_s = timed_imports(("torch", *SCORER_MODULES))
    got = warm_scorers(payload)
    WARM_UP.update({"import_s": import_s + got["import_s"], "load_s": got["load_s"]})
    return dict(WARM_UP)


FRAME_CACHE_BYTES = 1 << 30
"""The most decoded frames a scoring worker keeps (``decoded``): a pair's control video
at 480p x 81 frames is 97 MiB, so a few pairs' controls stay while their treatments score."""
_FRAMES: OrderedDict[tuple[str, str], Any] = OrderedDict()
DECODES: dict[str, int] = {"decoded": 0, "reused": 0}
"""This worker's decodes and cache hits (``decoded``), for tests and records."""


def decoded(digest: str, matrix: str, read: Any) -> Any:
    """The frames of the video whose content digest is ``digest`` decoded with ``matrix``:
    ``read()`` on first use, then from this worker's cache (least recently used first out,
    at most ``FRAME_CACHE_BYTES``), so a pair's control is decoded once for every
    treatment this worker scores against it. Keyed by the digest the generation record
    verified, so a changed video is never served from the cache. Metrics are pure
    functions of their frames (``scoring``), so a cached array is never altered."""
    key = (digest, matrix)
    if key in _FRAMES:
        _FRAMES.move_to_end(key)
        DECODES["reused"] += 1
        return _FRAMES[key]
    frames = read()
    DECODES["decoded"] += 1
    _FRAMES[key] = frames
    while sum(f.nbytes for f in _FRAMES.values()) > FRAME_CACHE_BYTES and len(_FRAMES) > 1:
        _FRAMES.popitem(last=False)
    return frames


def score_task(payload: dict[str, Any]) -> dict[str, Any]:
    """Parsl task: score one candidate's video (and against its control for FR metrics).
    Models stay loaded in the worker for the next task (``scoring.models.LOAD_COUNTS``)."""
    import torch

    shared = load_context(payload["context"])
    study: StudySpec = shared["study"]
    layout = Layout(study.scratch)
    rec, ctrl = payload["record"], payload["control"]
    g = study.generation
    torch.set_num_threads(study.scoring.threads)
    device = shared["scorer"]["device"]  # the build's: both arms of a pair on one kind of device
    if device == "cuda":
        pin_cuda()  # the warm-up pinned already, unless it failed: the build's digest names these settings

    def decode(r: dict[str, Any], matrix: str = "bt709") -> Any:
        return decoded(r["video"]["digest"], matrix, lambda: read_video(
            panel_dir(layout, r["candidate"]["panel"]) / r["video"]["path"], study.encoder,
            frames=r["video"]["frames"], height=r["video"]["height"], width=r["video"]["width"], fps=g.fps,
            matrix=matrix))

    started = time.perf_counter()
    memory = PhaseMemory(device == "cuda")
    memory.start("score")  # decoding and every metric of this candidate
    names = expected_scores(study, arm_of(rec))
    decoding = {name: metric_decoding(study, name) for name in names}
    wanted = set(decoding.values()) | {metric_decoding(study, "temporal_flickering")}
    frames = {m: decode(rec, m) for m in sorted(wanted)}
    ref = decode(ctrl) if rec["arm"]["name"] != "control" else None  # FR metrics: always BT.709
    ctx = ScoreContext(mirror=study.weights.mirror, batch=study.scoring.batch, fps=g.fps, device=device,
                       clip_precision=clip_precision(study, device))
    digests = shared["weight_digests"]
    try:
        scores: dict[str, ScoreEntry] = {
            name: {"value": score(name, frames[decoding[name]], ref, ctx),
                   "spec": cast(MetricSpecFields, metric_spec(name).asdict(digests)), "decoded_with": decoding[name]}
            for name in names}
        if uses_static_filter(study):
            seen = frames[metric_decoding(study, "temporal_flickering")]
            pairs, n = pair_motion(seen, ctx)
            # VBench's static filter: a video is static when its RAFT motion does not make it dynamic
            scores["temporal_flickering"]["static"] = not is_dynamic(pairs, min(seen.shape[1:3]), n)
    finally:
        release_frames()  # the videos' device copies go with the task
    memory.stop("score")
    static = cast(StaticFilter, study.scoring.static_filter)  # an enum in the config schema
    record: ScoreRecord = {
        "kind": "score",
        "candidate": rec["candidate"],
        "arm": rec["arm"],
        "video_digest": rec["video"]["digest"],
        "control_video_digest": ctrl["video"]["digest"],
        "generation_record_digest": rec["record_digest"],
        "compared_frames": compared_frames(study),
        "static_filter": {"temporal_flickering": static, "meaning": STATIC_FILTER_MEANING[static]},
        "scores": scores,
        "scorer": shared["scorer"],
        "timing": {"score_s": time.perf_counter() - started},
        "memory": cast(PhaseMemoryFields, memory.asdict()),
        "worker": {**worker_identity(), "scorer_loads": dict(LOAD_COUNTS), "warm_up": WARM_UP or None},
    }
    write_record(Path(payload["out"]), record)
    return {"candidate_id": rec["candidate"]["candidate_id"]}


def run_scoring(study: StudySpec, panel_name: str, manifest_out: Path, run_dir: Path,
                grant: Grant) -> dict[str, Any]:
    """Score every candidate whose score record is missing or stale, then write the
    manifest. Scoring runs on the same per-accelerator slots as generation."""
    layout = Layout(study.scratch)
    with hold(panel_dir(layout, panel_name), f"score {panel_name}"):
        return _run_scoring(study, panel_name, manifest_out, run_dir, grant)


def _run_scoring(study: StudySpec, panel_name: str, manifest_out: Path, run_dir: Path,
                 grant: Grant) -> dict[str, Any]:
    layout = Layout(study.scratch)
    started = job_start()
    sweep_panel(study, panel_name, started, ("scores", "failures/score"))
    shared = scoring_context(study, grant)  # fails fast, before any worker starts, on a missing or altered weight
    todo_all = candidates(study, study.panel(panel_name))
    payloads: list[dict[str, Any]] = []

    def prepare() -> list[dict[str, Any]]:
        """Runs while the workers start and warm up: verify every generation record and
        video, and find the candidates whose score is missing or stale."""
        records: dict[str, GenerationRecord] = {}
        for c in todo_all:
            path = record_path(layout, c)
            records[c.key.candidate_id] = read_record(path, "generation")
            check_video(records[c.key.candidate_id], path)
        control = {c.key.pair_key: records[c.key.candidate_id] for c in todo_all if c.arm.is_control}
        ref = write_context(study.scratch, shared)
        for c in todo_all:
            p = score_payload(study, ref, c, records[c.key.candidate_id], control[c.key.pair_key], shared["scorer"])
            if p is not None:
                payloads.append(p)
        log.info("score %s: %d candidates, %d to score", panel_name, len(todo_all), len(payloads))
        return payloads

    hooks = TaskHooks(telemetry_path(layout, panel_name, "score"),
                      lambda p: failure_path(layout, p["candidate"], "score"), describe,
                      warm=(warm_scoring, scorer_warm_payload(study, shared["scorer"])),
                      start_early=any(not score_path(layout, c).exists() for c in todo_all))
    run_tasks(score_task, prepare, run_dir, study.fleet, grant, f"score {panel_name}", hooks,
              workers_for(study, ("score",), grant))
    sweep_after(study, panel_name, ("scores",))
    finish_scoring(study, panel_name, todo_all, len(payloads), shared["scorer"], manifest_out)
    close_job(hooks.telemetry_out, started)  # the manifest's read-back is the job's time too
    return {"ran": len(payloads)}


def scoring_context(study: StudySpec, grant: Grant) -> dict[str, Any]:
    """What every score task of a job shares: the study, the scorer build and the weight
    digests. Raises WeightsError on a missing or altered weight (before any worker starts)."""
    build = scorer_build(study, grant)
    return {"study": study, "scorer": build, "weight_digests": verify(study.weights.mirror, study_weights(study))}


def score_payload(study: StudySpec, ref: Any, c: Candidate, rec: GenerationRecord, ctrl: GenerationRecord,
                  build: ScorerBuild) -> dict[str, Any] | None:
    """The score task of ``c`` given its verified generation record ``rec`` and its pair's
    control record ``ctrl``, or None when its score record is fresh."""
    layout = Layout(study.scratch)
    out = score_path(layout, c)
    try:
        old = read_record(out, "score")
        # A score is bound to its candidate's current generation record: a regenerated
        # candidate is rescored even when its video came out bit-identical.
        if (old["generation_record_digest"] == rec["record_digest"]
                and old["video_digest"] == rec["video"]["digest"]
                and old["control_video_digest"] == ctrl["video"]["digest"]
                and scores_stale(study, c, old) is None
                and old["scorer"]["digest"] == build["digest"]):  # both arms: one scorer build
            return None
    except (IntegrityError, KeyError):
        pass
    return {"context": ref, "record": _task_view(rec), "control": _task_view(ctrl),
            "out": str(out), "candidate": c, "identity": task_identity(c), "stage": "score"}


def ready_score_task(study: StudySpec, ref: Any, build: ScorerBuild, c: Candidate, control: Candidate,
                     records: dict[Path, GenerationRecord], scored: set[str]) -> tuple[Any, dict[str, Any]] | None:
    """``c``'s score task once its record and its control's are verified (in ``records``),
    at most once per candidate (``scored`` remembers it); None when either is not ready,
    when ``c`` was offered before, or when its score record is fresh. The combined panel
    job and the study-wide job feed their queues through this one rule."""
    layout = Layout(study.scratch)
    rec, ctrl = records.get(record_path(layout, c)), records.get(record_path(layout, control))
    if rec is None or ctrl is None or c.key.candidate_id in scored:
        return None
    scored.add(c.key.candidate_id)
    payload = score_payload(study, ref, c, rec, ctrl, build)
    return None if payload is None else (score_task, payload)


def finish_scoring(study: StudySpec, panel_name: str, todo_all: list[Candidate], ran: int,
                   build: ScorerBuild, manifest_out: Path) -> None:
    """After every task succeeded: clear the panel's score failure records, check every
    score record's self-digest and write the score manifest."""
    layout = Layout(study.scratch)
    clear_failures(study, todo_all, "score")  # every candidate is scored now
    files = [score_path(layout, c) for c in todo_all]
    for f in files:
        read_record(f, "score")
    manifest = build_manifest("panel-scores", panel_dir(layout, panel_name), files,
                              {"study": study.study, "panel": panel_name, "ran": ran,
                               "scorer_build": build["digest"]})
    write_manifest(manifest_out, manifest)
    vouch(study.scratch, manifest_out, manifest)  # every record it lists was read back above
