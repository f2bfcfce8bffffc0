"""The exclusive timed pass: the only source of reported latency.

Bulk generation (for scoring) is packed onto Parsl slots and its wall times are
recorded but never reported. Latency comes from this pass instead: one process per
node with nothing else running (the rule takes every core locally; the Slurm profile
asks for an exclusive node), batch one, ``warmup`` untimed runs per arm, device
synchronisation around each call, and ``repeats`` measures per candidate whose median
is the candidate's latency. Arms are interleaved within each pair so drift in machine
speed affects all arms alike. Each timed run's frames are hashed and compared with the
bulk record, so a timing is known to belong to the same computation. Each arm runs on
its own pipeline (its checkpoint and dtype); a search arm's latency is its whole search,
all N generations and verifier scorings. Compute is counted in the bulk pass, never here.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from pathlib import Path
from typing import Any

from .config import StudySpec
from .records import build_manifest, read_record, write_manifest, write_record
from .slurm import AllocationInfo

log = logging.getLogger(__name__)


def timing_path(study: StudySpec, c: Any) -> Path:
    from .panel import panel_dir

    return panel_dir(study, c.key.panel) / "timing" / c.arm.name / f"{c.stem}.json"


def run_timed_pass(study: StudySpec, panels: list[str], manifest_out: Path,
                   alloc: AllocationInfo | None = None) -> dict[str, Any]:
    """Time every candidate of ``panels`` in this process; write timing records and one
    manifest. Candidates whose timing record verifies and names their current generation
    record are kept, so rerunning one panel re-times only that panel. ``alloc`` is the
    Slurm allocation the pass runs in (None locally); every timing record states whether
    Slurm gave it the node alone, and the pass's window is written to
    ``study/telemetry/timed_pass.json`` so overlap with other jobs can be checked."""
    from .locks import hold

    with hold(Path(manifest_out).parent, "timed pass"):
        return _run_timed_pass(study, panels, manifest_out, alloc)


def _is_timed(study: StudySpec, c: Any, bulk: dict[str, Any]) -> bool:
    from .errors import PairFlowError

    try:
        t = read_record(timing_path(study, c))
        # A timing whose run computed other frames is re-timed, never kept.
        return t["generation_record_digest"] == bulk["record_digest"] and t["matches_bulk_frames"] is True
    except (PairFlowError, KeyError):
        return False


def _run_timed_pass(study: StudySpec, panels: list[str], manifest_out: Path,
                    alloc: AllocationInfo | None) -> dict[str, Any]:
    from . import generate as g
    from .atomic import job_start, sweep_temps, write_text
    from .fleet import worker_identity
    from .identity import digest_bytes
    from .panel import candidates, panel_dir, record_path
    from .slurm import exclusivity
    from .video import prepare_frames

    cands = [c for p in panels for c in candidates(study, study.panel(p))]
    sweep_temps([panel_dir(study, p) / "timing" / a.name for p in panels for a in study.arms]
                + [Path(manifest_out).parent, Path(manifest_out).parent / "telemetry"], job_start())
    bulk = {c.key.candidate_id: read_record(record_path(study, c)) for c in cands}
    todo = [c for c in cands if not _is_timed(study, c, bulk[c.key.candidate_id])]
    log.info("timed pass: %d candidates, %d already timed, %d to time", len(cands), len(cands) - len(todo), len(todo))
    node = exclusivity(alloc) if todo else None
    window_start = time.time()
    if todo:
        from .arms import arm_pipeline, run_arm, verifier_for

        pipes = {a.name: arm_pipeline(a, study.model, study.generation) for a in study.arms
                 if any(c.arm == a for c in todo)}
        tokens = {name: g.text_tokens(p, study.generation) for name, p in pipes.items()}
        verifiers = {a.name: verifier_for(a, study) for a in study.arms}
        warm, reps = study.timing.warmup, study.timing.repeats

        def run(c: Any) -> Any:
            # A search arm's latency is its whole search: N generations and N scorings.
            return run_arm(pipes[c.arm.name], c.prompt.text, c.key.stream_seed, c.arm, study.generation,
                           tokens[c.arm.name], verifier=verifiers[c.arm.name])

        for arm in study.arms:  # untimed warm-up: kernels, allocator, caches of each arm
            first = next((c for c in todo if c.arm == arm), None)
            for _ in range(warm if first is not None else 0):
                run(first)
        # Arms interleaved per pair, so drift in machine speed affects every arm alike.
        ordered = sorted(todo, key=lambda c: (c.key.panel, c.key.prompt_id, c.key.seed))
        started = time.monotonic()
        for done, c in enumerate(ordered, start=1):
            b = bulk[c.key.candidate_id]
            seconds, same = [], True
            for _ in range(reps):
                result = run(c)
                seconds.append(result.seconds)
                frames, _ = prepare_frames(result.frames, study.encoder)
                same = same and digest_bytes(frames.tobytes()) == b["video"]["raw_digest"]
            write_record(timing_path(study, c), {
                "kind": "timing",
                "candidate": b["candidate"], "arm": b["arm"],
                "generation_record_digest": b["record_digest"],
                "timing": {"pass": "timed", "latency_s": statistics.median(seconds), "seconds": seconds,
                           "warmup_per_arm": warm, "repeats": reps, "batch": 1,
                           "synchronised": result.device == "cuda", "device": result.device,
                           "threads": result.threads,
                           # what one timed run covers: a search arm's whole search
                           "covers": (f"{c.arm.search.n} generations and {c.arm.search.n} {c.arm.search.verifier} "
                                      "scorings (best-of-N search)" if c.arm.search else "one generation")},
                "matches_bulk_frames": same,
                "worker": {**worker_identity(), "device": result.device, "node": node},
            })
            if done % 10 == 0 or done == len(ordered):
                rate = done / (time.monotonic() - started)
                log.info("timed pass: %d/%d done, %.2f/s, ~%.0fs left", done, len(ordered), rate,
                         (len(ordered) - done) / rate)
    if todo:
        write_text(Path(manifest_out).parent / "telemetry" / "timed_pass.json", json.dumps(
            {"kind": "telemetry", "label": "timed pass", "window": {"start": window_start, "end": time.time()},
             "timed": len(todo), "node": node, "allocation": alloc.asdict() if alloc else None},
            indent=1, sort_keys=True) + "\n")
    manifest = build_manifest("timing", study.scratch, [timing_path(study, c) for c in cands],
                              {"study": study.study, "panels": panels, "pass": "timed"},
                              base=os.path.relpath(study.scratch, Path(manifest_out).parent))
    write_manifest(manifest_out, manifest)
    return manifest
