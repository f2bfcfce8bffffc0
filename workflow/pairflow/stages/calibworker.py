"""The calibration worker: what ``calibrate`` runs in a fresh Python process
(``python -m pairflow.stages.calibworker STUDY.pkl OUT.json``) to measure every arm's phases as
a fan-out worker pays them. Kept apart from ``calibrate`` (the table, its key, packing),
which the stages import for ``workers_for``: the worker imports the stages, so living in
one module would be an import cycle.

Also the preparing job (``prepare``): the run's first heavy job, which imports torch and
diffusers once for the model's build, the arms' check and the calibration, and leaves the
check and the table in a cache that rules check_arms and calibrate copy from."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import progress
from ..arms import arms_check_inputs, arms_check_key, verifier_for, write_arms_check
from ..atomic import write_text
from ..budget.calibrate import _capacity, calibrate
from ..budget.calibrate import key as calibration_key
from ..fleet.sites import select
from ..generation.provenance import arm_record
from ..identity import digest_file, digest_obj
from ..layout import Layout
from ..plan.candidates import candidates
from ..plan.config import ArmSpec, StudySpec

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger(__name__)


def _phase(memory: Any, name: str, fn: Any) -> tuple[Any, dict[str, Any]]:
    """Run ``fn()`` as phase ``name`` of ``memory`` (a ``telemetry.PhaseMemory``): its
    result and {seconds, peak_rss_mb, peak_device_mb}."""
    memory.start(name)
    started = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - started
    memory.stop(name)
    return out, {"s": seconds, **memory.peaks[name]}


def measure_imports(study: StudySpec) -> dict[str, Any]:
    """The import phase a fan-out worker pays once (torch, diffusers, the scorers' modules
    and the pipeline's modules), measured in this process: {s, peak_rss_mb, ...}. Only
    true first thing in a process that has imported none of them (a fresh worker, or the
    preparing job: ``prepare``)."""
    # lazy: the stages' modules are imported here, in the measuring process, not at module level:
    # they bring numpy and the scorers' registry, and `pairflow estimate`, `pairflow status`
    # and Snakemake's planning import this module for the table's key alone.
    from ..fleet.telemetry import PhaseMemory
    from .jobs import timed_imports
    from .scoring import SCORER_MODULES

    memory = PhaseMemory(False)
    import_s = {"s": 0.0}

    def imports() -> None:
        # lazy: this is the import phase being measured (generation's own imports)
        from ..generation import generate as g

        import_s["s"] = timed_imports(("torch", "diffusers", *SCORER_MODULES)) + g.pipeline_imports(study.model)

    _, imp = _phase(memory, "import", imports)
    return {**imp, "s": import_s["s"] or imp["s"]}


def measure_worker(study: StudySpec, imported: dict[str, Any] | None = None) -> dict[str, Any]:
    """Calibrate every arm in this process (a fresh one: ``calibrate``; or the preparing
    job, which passes the import phase it measured first as ``imported``).
    Returns {device, import, arms: {name: {phases, warmup_s, generate_s, score_s}}}."""
    imp = imported if imported is not None else measure_imports(study)
    # lazy: imported after the measured import phase, in the measuring process only
    from ..fleet.telemetry import PhaseMemory
    from ..generation import generate as g
    from ..generation.armrun import arm_pipeline, run_arm
    from ..media.frames import prepare_frames
    from ..media.video import encode, read_video
    from ..metrics import ScoreContext, score
    from .scoring import clip_precision, metric_decoding

    device = g._device()
    cuda = device == "cuda"
    first = candidates(study, study.panels[0])
    ref: dict[str, Any] = {}
    arms: dict[str, Any] = {}
    ctx = ScoreContext(mirror=study.weights.mirror, batch=study.scoring.batch, fps=study.generation.fps,
                       device=device, clip_precision=clip_precision(study, device))
    with tempfile.TemporaryDirectory(prefix="pairflow-calibrate-") as tmp:
        def one(arm: ArmSpec, c: Any) -> None:
            mem = PhaseMemory(cuda)
            pipe, load = _phase(mem, "load", lambda arm=arm: arm_pipeline(arm, study.model, study.generation))
            tokens = g.text_tokens(pipe, study.generation)
            verifier = verifier_for(arm, study)
            started = time.perf_counter()
            # counted in full, as the bulk pass counts every candidate (stages.generation.counted_run)
            run_arm(pipe, c.prompt.text, c.key.stream_seed, arm, study.generation, tokens, count=True, full=True,
                    verifier=verifier)
            warmup_s = time.perf_counter() - started
            decode_s = [0.0]
            vae = pipe.vae

            def timed_decode(*a: Any, _inner: Any = vae.decode, _spent: list[float] = decode_s, **k: Any) -> Any:
                t = time.perf_counter()
                try:
                    return _inner(*a, **k)
                finally:
                    _spent[0] += time.perf_counter() - t

            vae.decode = timed_decode  # an instance attribute, removed below
            try:
                started = time.perf_counter()
                result = run_arm(pipe, c.prompt.text, c.key.stream_seed, arm, study.generation, tokens, count=True,
                                 full=True, verifier=verifier)
                generate_s = time.perf_counter() - started
            finally:
                del vae.decode
            started = time.perf_counter()  # as the timed pass runs it: nothing counted
            run_arm(pipe, c.prompt.text, c.key.stream_seed, arm, study.generation, tokens, verifier=verifier)
            timed_s = time.perf_counter() - started
            peaks = result.memory.asdict() if result.memory is not None else {}
            phases: dict[str, Any] = {"load": load}
            phases["denoise"] = {"s": generate_s - decode_s[0], **peaks.get("denoise", {})}
            phases["decode"] = {"s": decode_s[0], **peaks.get("decode", {})}
            frames, _ = prepare_frames(result.frames, study.encoder)
            out = Path(tmp) / f"{arm.name}.mp4"
            _, phases["encode"] = _phase(mem, "encode", lambda out=out, frames=frames: encode(
                frames, out, study.encoder, study.generation.fps, stall_s=study.fleet.stall_timeout_s))
            decoded, phases["score:read"] = _phase(mem, "score:read", lambda out=out, frames=frames: {
                m: read_video(out, study.encoder, frames=frames.shape[0], height=frames.shape[1],
                              width=frames.shape[2], fps=study.generation.fps, matrix=m)
                for m in sorted({metric_decoding(study, n) for n in study.scorers})})
            if arm.name == "control":
                ref["frames"] = decoded.get("bt709", next(iter(decoded.values())))
            for name in study.scorers:
                _, phases[f"score:{name}"] = _phase(mem, f"score:{name}", lambda name=name, decoded=decoded: score(
                    name, decoded[metric_decoding(study, name)], ref.get("frames"), ctx))
            counted = result.compute or {}
            arms[arm.name] = {"arm": dict(arm_record(arm)), "candidate": c.key.candidate_id, "phases": phases,
                              "warmup_s": warmup_s, "generate_s": generate_s + phases["encode"]["s"],
                              "timed_s": timed_s,
                              "score_s": sum(v["s"] for k, v in phases.items() if k.startswith("score:")),
                              # counted in full: what the iso-compute controls are derived from
                              "compute": {k: counted.get(k) for k in ("total_flops", "transformer_flops")}}

        declared = sorted(study.declared_arms, key=lambda a: a.name != "control")  # control first: FR's reference
        for arm in declared:
            one(arm, next(x for x in first if x.arm.name == arm.name))
        iso = None
        if study.iso_compute:
            # lazy: the statistics, in the measuring process only (planning imports this module for the key)
            from ..analysis import isocompute

            # derived from the counts just made; each plain arm measured on control's candidate (same prompt, seed)
            iso = isocompute.controls(declared, arms, study.generation.steps)
            control = next(x for x in first if x.arm.is_control)
            for row in iso["arms"]:
                one(isocompute.iso_arm(row["steps"]), control)
    return {"device": device, "import": imp, "arms": arms, "capacity": _capacity(cuda), "worker_pid": os.getpid(),
            **({"iso_compute": iso} if iso is not None else {})}


# --- the preparing job ------------------------------------------------------------------------

def arms_model_files(study: StudySpec) -> list[Path]:
    """The model files rule check_arms takes as input (``common.smk``'s ``arms_check_input``):
    the embedded model's index, else the configs ``arms.arms_check_inputs`` lists."""
    own = [Path(study.model.path) / "model_index.json"] if study.model.kind == "embedded-tiny" else []
    return [*own, *arms_check_inputs(study.declared_arms, study.model)]


def arms_entry_key(study: StudySpec) -> str:
    """What the prepared arms' check is keyed by: rule check_arms's ``params`` key
    (``arms_check_key``: every arm field, the model's identity, the diffusers version)
    and the bytes of its input files (a rebuilt model or an edited checkpoint config
    names another entry). No torch."""
    files = [f for f in arms_model_files(study) if f.is_file()]
    return digest_obj({"check": arms_check_key(study.declared_arms, study.model),
                       "files": sorted(digest_file(f) for f in files)})


def calibrates_here(study: StudySpec) -> bool:
    """Whether a preparing job measures the calibration table itself: ``fleet.calibrate``
    on, and the local site (every job shares this machine and its device). Under a
    scheduler rule calibrate is granted its own device (``profiles/slurm``: a GPU, as
    the panel jobs), so its fresh worker measures there."""
    return study.fleet.calibrate and select(os.environ, study.fleet.site).name == "local"


def prepare(study: StudySpec, job: str, build: Callable[[], object] | None = None, strict: bool = True) -> bool:
    """The run's one cold torch import for what comes before the panels (issue 37): the
    first heavy job (rule build_tiny_model, else check_arms) measures the import phase
    first, as a fresh calibration worker does; runs ``build`` (the tiny model) when
    given; checks the arms and writes rule check_arms's output bytes to the cache
    (``Layout.prepared_arms``); then, where ``calibrates_here`` and no table exists for
    the current key, measures the calibration table in this process (its build's
    objects freed first) into the cache (``Layout.prepared_calibration``), the table
    saying ``measured_in: job``. Rules check_arms and calibrate then copy their outputs
    from the cache without importing torch. Returns whether the arms passed.

    ``strict`` (rule check_arms): a failing arms' check raises its ConfigError. Not
    strict (the build job): it is logged and nothing is cached, so rule check_arms checks
    again and fails with its own message. A failing calibration here is logged and left
    to rule calibrate, which measures in its fresh worker and reports it."""
    imported = measure_imports(study)
    if build is not None:
        build()
    at = Layout(study.scratch)
    entry = at.prepared_arms(arms_entry_key(study))  # after the build: the model's files are in the key
    try:
        write_arms_check(study.declared_arms, study.model, entry)
    except Exception as e:
        if strict:
            raise
        log.warning("the arms did not pass their check (%s); rule check_arms checks them again and reports it", e)
        return False
    log.info("prepared the arms' check for rule check_arms: %s", entry)
    if not calibrates_here(study):
        return True
    planned = calibration_key(study)
    if at.calibration(planned).is_file() or at.prepared_calibration(planned).is_file():
        return True
    gc.collect()  # the build's pipeline and the check's objects, before peaks are measured
    try:
        calibrate(study, at.prepared_calibration(planned), force=True, planned_key=planned,
                  measure=lambda: measure_worker(study, imported), measured_in=job)
    except Exception as e:
        log.warning("calibrating in %s failed (%s); rule calibrate measures in its fresh worker", job, e)
        at.prepared_calibration(planned).unlink(missing_ok=True)
    return True



def _main(argv: list[str]) -> int:
    """The fresh worker: ``python -m pairflow.stages.calibworker STUDY.pkl OUT.json
    [BEAT]``. Each ``progress.report`` rewrites BEAT with what was just done (the caller's
    stall check reads its mtime, ``calibrate.watch_worker``); an exception that ends the
    worker is written first to ``BEAT.error`` (its type and message: the failure's
    headline, whatever warnings its stderr holds), then raised."""
    study = pickle.loads(Path(argv[0]).read_bytes())  # written by _fresh_worker in this run
    beat = Path(argv[2]) if len(argv) > 2 else None

    def sink(note: str) -> None:
        if beat is not None:
            beat.write_text(note)  # best effort (progress.report drops an OSError): the mtime is the beat

    try:
        with progress.reporting_to(sink):
            measured = measure_worker(study)
    except BaseException as e:
        if beat is not None:
            with contextlib.suppress(OSError):
                beat.with_name(beat.name + ".error").write_text(json.dumps({"type": type(e).__name__,
                                                                            "message": str(e)}))
        raise
    write_text(Path(argv[1]), json.dumps(measured) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
