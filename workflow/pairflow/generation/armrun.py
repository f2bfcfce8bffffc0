"""Running an arm: its pipeline (``arm_pipeline``) and its video for one pair
(``run_arm``), including a search's N candidates and their verifier scorings.

Workers import this module; planning never does (it imports ``generate``, hence torch
and diffusers when it runs). It sits above ``pairflow.arms`` (which ``generate`` and
``config`` build on), not inside it. Each generation applies the arm's declared kinds through
``generate.generate`` (``arms.registry.applied``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..arms.kinds.search import search_seeds
from ..arms.kinds.student import arm_model, check_same_latents
from ..arms.registry import load_dtype
from ..errors import ConfigError
from ..identity import digest_bytes
from ..media.frames import prepare_frames
from ..specs import ArmSpec, GenerationSpec, ModelSpec
from .compute import ComputeCount, measure
from .generate import generate, load_pipeline, run_queue_wait


def arm_pipeline(arm: ArmSpec, model: ModelSpec, gen: GenerationSpec) -> Any:
    """The pipeline ``arm`` runs on: its own checkpoint and precision where it declares
    them (loaded once per worker process, like control's)."""
    if arm.model is not None:
        check_same_latents(arm, model)  # the embedded model exists by now
    return load_pipeline(arm_model(arm, model), load_dtype(arm, gen), gen.threads)


@dataclass(frozen=True)
class ArmResult:
    """One arm's video for one pair. ``seconds``: wall time of everything the arm did for
    it (all search candidates and their scorings); ``compute``: summed counts (None when
    not counted); ``candidates``: a search's evidence, one entry per candidate."""

    frames: Any
    seconds: float
    peak_rss_mb: float
    device: str
    threads: int
    compute: dict[str, Any] | None
    candidates: tuple[dict[str, Any], ...] = ()
    chosen: int | None = None
    measured: Any = None  # the compute.FlopTable a run counted in full measured, or None
    memory: Any = None  # telemetry.PhaseMemory over every generation of the arm (denoise, decode)
    cpu_seconds: float | None = None  # this process's CPU time over the same work as ``seconds``
    wait_seconds: float | None = None  # of ``seconds``, the generations' wait for a CPU (``generate.run_queue_wait``)


def run_arm(pipe: Any, prompt: str, stream_seed: int, arm: ArmSpec, gen: GenerationSpec, tokens: int | None,
            count: bool = False, verifier: Any = None, table: Any = None, full: bool = True,
            table_key: str | None = None) -> ArmResult:
    """Run ``arm`` for one pair. Without ``search``: one generation from ``stream_seed``.
    With it: N candidates (``search_seeds``), each generated and scored with ``verifier``
    (a callable uint8 (F, H, W, 3) frames -> float, ``higher_is_better`` attribute), and
    the best kept (ties: the lowest index). ``count``: count compute (bulk pass only);
    ``full``, ``table``: count FLOPs in full (cross-checked against ``table``) or derive
    them from ``table`` (``compute.counting``). A run counted in full under ``table_key``
    returns the ``FlopTable`` it measured (``ArmResult.measured``)."""
    if arm.search is None:
        r = generate(pipe, prompt, stream_seed, arm, gen, tokens, count=count, table=table, full=full)
        measured = None
        if r.count is not None and r.count.method == "counted" and table_key is not None:
            measured = measure(r.count, table_key, {r.count.total_flops - r.count.transformer_flops}, {0})
        return ArmResult(r.frames, r.seconds, r.peak_rss_mb, r.device, r.threads, r.compute, measured=measured,
                         memory=r.memory, cpu_seconds=r.cpu_seconds, wait_seconds=r.wait_seconds)
    if verifier is None:
        raise ConfigError(f"arm {arm.name!r} searches (search: n={arm.search.n}), so run_arm needs its verifier; "
                          "pass arms.verifier_for(arm, study)")
    total = ComputeCount() if count else None
    evidence: list[dict[str, Any]] = []
    best: int | None = None
    best_frames: Any = None
    seconds, cpu_seconds, last = 0.0, 0.0, None
    waits: list[float | None] = []
    rest: set[int] = set()
    vseen: set[int] = set()
    memory: Any = None
    for i, seed in enumerate(search_seeds(stream_seed, arm.search.n)):
        r = last = generate(pipe, prompt, seed, arm, gen, tokens, count=count, table=table, full=full)
        counted = r.count is not None and r.count.method == "counted"
        if memory is None:
            memory = r.memory
        elif r.memory is not None:
            memory.merge(r.memory)
        started, cpu_started, wait_started = time.perf_counter(), time.process_time(), run_queue_wait()
        frames, _ = prepare_frames(r.frames, verifier.encoder)
        value, vflops = verifier(frames, count and (counted or table is None))
        if count and not counted:
            vflops = table.verifier  # derived: one scoring's FLOPs from the table
        seconds += r.seconds + time.perf_counter() - started
        cpu_seconds += (r.cpu_seconds or 0.0) + time.process_time() - cpu_started
        wait_ended = run_queue_wait()
        waits.append(None if r.wait_seconds is None or wait_started is None or wait_ended is None
                     else r.wait_seconds + wait_ended - wait_started)
        if total is not None and r.count is not None:
            total.add(r.count)
            total.verifier_flops += vflops
            if counted:
                rest.add(r.count.total_flops - r.count.transformer_flops)
                vseen.add(vflops)
        evidence.append({"index": i, "seed": seed, "score": value, "raw_digest": digest_bytes(frames.tobytes()),
                         "generate_s": r.seconds, "compute": r.compute})
        better = best is None or (value > evidence[best]["score"] if verifier.higher_is_better
                                  else value < evidence[best]["score"])
        if better:
            best, best_frames = i, r.frames
    if last is None or best is None:
        raise ConfigError(f"arm {arm.name!r}: search n={arm.search.n}; a search needs n >= 1 candidates "
                          f"(set arms.{arm.name}.search.n to 1 or more)")
    compute, measured = None, None
    if total is not None:
        methods = {e["compute"]["method"] for e in evidence if e["compute"]}
        total.method = "counted" if "counted" in methods else "derived"
        total.table = table.key if table is not None else None
        checks = [e["compute"]["cross_check"] for e in evidence if e["compute"] and "cross_check" in e["compute"]]
        if checks:
            total.cross_check = {"derived_transformer_flops": sum(c["derived_transformer_flops"] or 0 for c in checks),
                                 "equal": all(c["equal"] for c in checks)}
        compute = {**total.asdict(), "verifier": arm.search.verifier}
        if methods == {"counted"} and table_key is not None:
            measured = measure(total, table_key, rest, vseen)
    return ArmResult(best_frames, seconds, last.peak_rss_mb, last.device, last.threads, compute, tuple(evidence),
                     best, measured, memory, cpu_seconds, None if None in waits else sum(w or 0.0 for w in waits))
