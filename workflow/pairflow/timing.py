"""The exclusive timed pass: the only source of reported latency.

Bulk generation (for scoring) is packed onto Parsl slots and its wall times are
recorded but never reported. Latency comes from this pass instead: one process per
node with nothing else running (the rule takes every core locally; the Slurm profile
asks for an exclusive node), batch one, ``warmup`` untimed runs per arm, device
synchronisation around each call, and ``repeats`` measures per candidate whose median
is the candidate's latency. Arms are interleaved within each pair so drift in machine
speed affects all arms alike. Each timed run's frames are hashed and compared with the
bulk record, so a timing is known to belong to the same computation.
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path
from typing import Any

from .config import StudySpec
from .records import build_manifest, read_record, write_manifest, write_record

log = logging.getLogger(__name__)


def timing_path(study: StudySpec, c: Any) -> Path:
    from .panel import panel_dir

    return panel_dir(study, c.key.panel) / "timing" / c.arm.name / f"{c.stem}.json"


def run_timed_pass(study: StudySpec, panel_name: str, manifest_out: Path) -> dict[str, Any]:
    """Time every candidate of a panel in this process; write timing records and a manifest."""
    from .locks import hold
    from .panel import panel_dir

    with hold(panel_dir(study, panel_name), f"timed pass {panel_name}"):
        return _run_timed_pass(study, panel_name, manifest_out)


def _run_timed_pass(study: StudySpec, panel_name: str, manifest_out: Path) -> dict[str, Any]:
    from . import generate as g
    from .fleet import worker_identity
    from .identity import digest_bytes
    from .panel import candidates, record_path
    from .video import prepare_frames

    cands = candidates(study, study.panel(panel_name))
    pipe = g.load_pipeline(study.model, study.generation.dtype, study.generation.threads)
    tokens = g.max_text_tokens(study.model)
    warm, reps = study.timing.warmup, study.timing.repeats
    for arm in study.arms:  # untimed warm-up: kernels, allocator, caches of each arm
        first = next(c for c in cands if c.arm == arm)
        for _ in range(warm):
            g.generate(pipe, first.prompt.text, first.key.stream_seed, arm, study.generation, tokens)
    ordered = sorted(cands, key=lambda c: (c.key.prompt_id, c.key.seed))  # arms interleaved per pair
    started = time.monotonic()
    for done, c in enumerate(ordered, start=1):
        bulk = read_record(record_path(study, c))
        seconds, same = [], True
        for _ in range(reps):
            result = g.generate(pipe, c.prompt.text, c.key.stream_seed, c.arm, study.generation, tokens)
            seconds.append(result.seconds)
            frames, _ = prepare_frames(result.frames, study.encoder)
            same = same and digest_bytes(frames.tobytes()) == bulk["video"]["raw_digest"]
        write_record(timing_path(study, c), {
            "kind": "timing",
            "candidate": bulk["candidate"], "arm": bulk["arm"],
            "generation_record_digest": bulk["record_digest"],
            "timing": {"pass": "timed", "latency_s": statistics.median(seconds), "seconds": seconds,
                       "warmup_per_arm": warm, "repeats": reps, "batch": 1,
                       "synchronised": result.device == "cuda", "device": result.device,
                       "threads": result.threads},
            "matches_bulk_frames": same,
            "worker": worker_identity(),
        })
        if done % 10 == 0 or done == len(ordered):
            rate = done / (time.monotonic() - started)
            log.info("timed %s: %d/%d done, %.2f/s, ~%.0fs left", panel_name, done, len(ordered), rate,
                     (len(ordered) - done) / rate)
    from .panel import panel_dir

    manifest = build_manifest("panel-timing", panel_dir(study, panel_name),
                              [timing_path(study, c) for c in cands],
                              {"study": study.study, "panel": panel_name, "pass": "timed"})
    write_manifest(manifest_out, manifest)
    return manifest
