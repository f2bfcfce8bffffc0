"""The calibration worker: what ``calibrate`` runs in a fresh Python process
(``python -m pairflow.stages.calibworker STUDY.pkl OUT.json``) to measure every arm's phases as
a fan-out worker pays them. Kept apart from ``calibrate`` (the table, its key, packing),
which the stages import for ``workers_for``: the worker imports the stages, so living in
one module would be an import cycle."""

from __future__ import annotations

import json
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..atomic import write_text
from ..budget.calibrate import _capacity
from ..generation.provenance import arm_record
from ..plan.candidates import candidates
from ..plan.config import StudySpec


def _phase(memory: Any, name: str, fn: Any) -> tuple[Any, dict[str, Any]]:
    """Run ``fn()`` as phase ``name`` of ``memory`` (a ``telemetry.PhaseMemory``): its
    result and {seconds, peak_rss_mb, peak_device_mb}."""
    memory.start(name)
    started = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - started
    memory.stop(name)
    return out, {"s": seconds, **memory.peaks[name]}


def measure_worker(study: StudySpec) -> dict[str, Any]:
    """Calibrate every arm in this process (meant to be a fresh one: ``calibrate``).
    Returns {device, import, arms: {name: {phases, warmup_s, generate_s, score_s}}}."""
    # lazy: the stages' modules are imported here, in the fresh worker, not at module level:
    # they bring numpy and the scorers' registry, and `pairflow estimate`, `pairflow status`
    # and Snakemake's planning import this module for the table's key alone.
    from ..fleet.telemetry import PhaseMemory
    from .jobs import timed_imports
    from .scoring import SCORER_MODULES, clip_precision, metric_decoding

    memory = PhaseMemory(False)
    import_s = {"s": 0.0}

    def imports() -> None:
        # lazy: this is the import phase being measured (generation's own imports)
        from ..generation import generate as g

        import_s["s"] = timed_imports(("torch", "diffusers", *SCORER_MODULES)) + g.pipeline_imports(study.model)

    _, imp = _phase(memory, "import", imports)
    # lazy: imported after the measured import phase, in the fresh worker only
    from ..arms import verifier_for
    from ..generation import generate as g
    from ..generation.armrun import arm_pipeline, run_arm
    from ..media.frames import prepare_frames
    from ..media.video import encode, read_video
    from ..metrics import ScoreContext, score

    device = g._device()
    cuda = device == "cuda"
    first = candidates(study, study.panels[0])
    ref: dict[str, Any] = {}
    arms: dict[str, Any] = {}
    ctx = ScoreContext(mirror=study.weights.mirror, batch=study.scoring.batch, fps=study.generation.fps,
                       device=device, clip_precision=clip_precision(study, device))
    with tempfile.TemporaryDirectory(prefix="pairflow-calibrate-") as tmp:
        for arm in sorted(study.arms, key=lambda a: a.name != "control"):  # control first: FR scorers' reference
            c = next(x for x in first if x.arm.name == arm.name)
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
                frames, out, study.encoder, study.generation.fps))
            decoded, phases["score:read"] = _phase(mem, "score:read", lambda out=out, frames=frames: {
                m: read_video(out, study.encoder, frames=frames.shape[0], height=frames.shape[1],
                              width=frames.shape[2], fps=study.generation.fps, matrix=m)
                for m in sorted({metric_decoding(study, n) for n in study.scorers})})
            if arm.name == "control":
                ref["frames"] = decoded.get("bt709", next(iter(decoded.values())))
            for name in study.scorers:
                _, phases[f"score:{name}"] = _phase(mem, f"score:{name}", lambda name=name, decoded=decoded: score(
                    name, decoded[metric_decoding(study, name)], ref.get("frames"), ctx))
            arms[arm.name] = {"arm": dict(arm_record(arm)), "candidate": c.key.candidate_id, "phases": phases,
                              "warmup_s": warmup_s, "generate_s": generate_s + phases["encode"]["s"],
                              "timed_s": timed_s,
                              "score_s": sum(v["s"] for k, v in phases.items() if k.startswith("score:"))}
    return {"device": device, "import": {**imp, "s": import_s["s"] or imp["s"]}, "arms": arms,
            "capacity": _capacity(cuda), "worker_pid": os.getpid()}



def _main(argv: list[str]) -> int:
    """The fresh worker: ``python -m pairflow.stages.calibworker STUDY.pkl OUT.json``."""
    study = pickle.loads(Path(argv[0]).read_bytes())  # written by _fresh_worker in this run
    write_text(Path(argv[1]), json.dumps(measure_worker(study)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
