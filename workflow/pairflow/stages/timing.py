"""The exclusive timed pass: the only source of reported latency.

Bulk generation (for scoring) is packed onto Parsl slots and its wall times are
recorded but never reported. Latency comes from this pass instead: one process per
node with nothing else running (the rule takes every core locally; the Slurm profile
asks for an exclusive node), batch one, ``warmup`` untimed runs per arm, and
``repeats`` measures per candidate whose median is the candidate's latency.

Order: pairs are timed in blocks of ``BLOCK_PAIRS``; within a block each repeat round
visits the pairs, and the arms within each pair, in an order drawn from
``timing.seed`` and the round, so neither arm always runs first (warm caches, clock
ramps) and drift in machine speed affects every arm alike. ``timing.pairs: N`` times a
seeded sample of N pairs per panel; the other candidates get a record saying they were
not sampled. Each run is split into denoising (the transformer's forward calls),
VAE decode and the rest. On CUDA every interval is timed with CUDA events, the cuDNN
and TF32 settings are pinned (``generate.CUDA_SETTINGS``) and recorded, NVML clocks,
throttle reasons, temperature, power and other processes on the device are read before
and after each run, and the peak device memory of each run is kept. Each timed run's
frames are hashed and compared with the bulk record, so a timing is known to belong to
the same computation. Each arm runs on its own pipeline (its checkpoint and dtype); a
search arm's latency is its whole search, all N generations and verifier scorings.
Compute is counted in the bulk pass, never here.
"""

from __future__ import annotations

import json
import logging
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

from ..arms import verifier_for
from ..atomic import job_start, sweep_temps, write_text
from ..errors import PairFlowError
from ..fleet.pool import worker_identity
from ..fleet.sites.base import AllocationInfo
from ..fleet.sites.slurm import exclusivity
from ..fleet.telemetry import ThrottleWatch, gpu_state, progress_line, thermal_flag
from ..generation import generate as g
from ..generation.armrun import arm_pipeline, run_arm
from ..identity import digest_bytes
from ..layout import Layout
from ..locks import hold
from ..media.frames import prepare_frames
from ..plan.candidates import candidates, panel_dir, record_path, timing_path
from ..plan.config import StudySpec
from ..records.store import build_manifest, read_record, stale_link, timing_frames_differ, write_manifest, write_record
from ..records.types import GenerationRecord, Manifest, TimingRecord
from ..records.vouch import vouch

# Lazy on purpose: torch is imported inside the functions that time on the device: the driver imports this
# module without it.

log = logging.getLogger(__name__)


def run_timed_pass(study: StudySpec, panels: list[str], manifest_out: Path,
                   alloc: AllocationInfo | None = None) -> Manifest:
    """Time every candidate of ``panels`` in this process; write timing records and one
    manifest. Candidates whose timing record verifies and names their current generation
    record are kept, so rerunning one panel re-times only that panel. ``alloc`` is the
    Slurm allocation the pass runs in (None locally); every timing record states whether
    Slurm gave it the node alone, and the pass's window is written to
    ``study/telemetry/timed_pass.json`` so overlap with other jobs can be checked."""
    with hold(Path(manifest_out).parent, "timed pass"):
        return _run_timed_pass(study, panels, manifest_out, alloc)


def _is_timed(study: StudySpec, c: Any, bulk: GenerationRecord, sample: set[tuple[str, str, int]]) -> bool:
    """Whether the candidate's timing record can stay: it names the current generation
    record, and it is a timing (frames matching the bulk run) exactly when the pair is in
    the current sample (a pair leaving the sample gets a not-sampled record)."""
    layout = Layout(study.scratch)
    try:
        t = read_record(timing_path(layout, c), "timing")
        if stale_link(t, bulk):
            return False
        if (c.key.panel, c.key.prompt_id, c.key.seed) not in sample:
            return t["sampled"] is False
        # A timing whose run computed other frames is re-timed, never kept.
        return t["sampled"] is True and not timing_frames_differ(t)
    except PairFlowError:
        return False


BLOCK_PAIRS = 16
"""Pairs timed together (all repeat rounds) before their records are written: a killed
pass loses at most one block, and drift is shared within it."""


def sampled_pairs(study: StudySpec, panels: list[str]) -> set[tuple[str, str, int]]:
    """The (panel, prompt_id, seed) pairs the pass times: all, or with ``timing.pairs: N``
    a sample of N per panel drawn from ``timing.seed`` (the same sample on every rerun)."""
    out: set[tuple[str, str, int]] = set()
    for p in panels:
        keys = sorted({(c.key.panel, c.key.prompt_id, c.key.seed) for c in candidates(study, study.panel(p))})
        n = study.timing.pairs
        out |= set(keys if n == "all" or int(n) >= len(keys)
                   else random.Random(f"{study.timing.seed}:{p}").sample(keys, int(n)))
    return out


def run_order(pairs: list[list[Any]], seed: int, round_: int) -> list[Any]:
    """One repeat round's order: the pairs shuffled, and the arms shuffled within each pair,
    by a generator seeded with (``seed``, ``round_``). ``pairs`` is a list of each pair's
    candidates; returns the candidates in run order (each pair's arms adjacent)."""
    rng = random.Random(f"{seed}:{round_}")
    order = list(range(len(pairs)))
    rng.shuffle(order)
    out = []
    for i in order:
        arms = list(pairs[i])
        rng.shuffle(arms)
        out += arms
    return out


def cv(seconds: list[float]) -> float | None:
    """Coefficient of variation of a candidate's repeats (sample sd over mean), None for one."""
    return statistics.stdev(seconds) / statistics.mean(seconds) if len(seconds) > 1 else None


class PhaseClock:
    """Times one pipeline call's phases: the transformer's forward calls (denoising) and
    ``vae.decode`` (decode), and the whole call. On CUDA with CUDA events recorded on the
    current stream (read after one synchronise); on CPU with ``perf_counter``. Installed
    for one call and always removed (hooks, the wrapped method)."""

    def __init__(self, pipe: Any, cuda: bool) -> None:
        self.pipe, self.cuda = pipe, cuda
        self.marks: dict[str, list[tuple[Any, Any]]] = {"denoise": [], "decode": [], "total": []}
        self._open: dict[str, Any] = {}

    def _now(self) -> Any:
        if self.cuda:
            import torch

            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def start(self, phase: str) -> None:
        self._open[phase] = self._now()

    def stop(self, phase: str) -> None:
        self.marks[phase].append((self._open.pop(phase), self._now()))

    def __enter__(self) -> PhaseClock:
        t, vae = getattr(self.pipe, "transformer", None), getattr(self.pipe, "vae", None)
        self._hooks = []
        if t is not None:
            self._hooks += [t.register_forward_pre_hook(lambda *a: self.start("denoise")),
                            t.register_forward_hook(lambda *a: self.stop("denoise"))]
        self._vae, self._decode = vae, None
        if vae is not None and hasattr(vae, "decode"):
            self._decode = vae.decode
            inner = vae.decode

            def decode(*args: Any, **kwargs: Any) -> Any:
                self.start("decode")
                try:
                    return inner(*args, **kwargs)
                finally:
                    self.stop("decode")

            vae.decode = decode  # an instance attribute, deleted on exit
        self.start("total")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop("total")
        for h in self._hooks:
            h.remove()
        if self._decode is not None and self._vae is not None:
            del self._vae.decode

    def seconds(self) -> dict[str, float]:
        """Seconds per phase (``other`` = total - denoise - decode: text encoding,
        scheduler steps, post-processing). Synchronises first on CUDA."""
        if self.cuda:
            import torch

            torch.cuda.synchronize()

            def span(a: Any, b: Any) -> float:
                return float(a.elapsed_time(b)) / 1e3
        else:
            def span(a: Any, b: Any) -> float:
                return float(b - a)
        out = {k: sum(span(a, b) for a, b in v) for k, v in self.marks.items()}
        out["other"] = max(0.0, out["total"] - out["denoise"] - out["decode"])
        return out


def _timed_run(pipe: Any, call: Any, cuda: bool, uuid: str | None) -> tuple[Any, dict[str, Any]]:
    """One timed run: ``call()`` (a generation, or a search arm's whole search) on
    ``pipe``, with its denoise/decode phases clocked on that pipeline; its result and what
    was measured."""
    measured: dict[str, Any] = {}
    if cuda:
        import torch

        torch.cuda.reset_peak_memory_stats()
        measured["gpu_before"] = gpu_state(uuid, os.getpid())

    watch = ThrottleWatch(uuid if cuda else None)
    with watch, PhaseClock(pipe, cuda) as clock:
        result = call()
    phases = clock.seconds()
    if cuda:  # throttle reasons seen while the run ran (polled by NVML), gpu_idle excluded
        measured["throttled"] = {"reasons": watch.reasons, "polls": watch.polls, "status": watch.status,
                                 "max_temperature_c": watch.max_temperature_c}
    # On CUDA the events' total is the latency (the device's own clock between the call's
    # first and last work, after a synchronise); on CPU the call's wall time.
    measured["seconds"] = phases["total"] if cuda else result.seconds
    measured["phases"] = phases
    if cuda:
        import torch

        measured["peak_device_mb"] = torch.cuda.max_memory_allocated() / 2**20
        measured["gpu_after"] = gpu_state(uuid, os.getpid())
    return result, measured


def _run_timed_pass(study: StudySpec, panels: list[str], manifest_out: Path,
                    alloc: AllocationInfo | None) -> Manifest:
    layout = Layout(study.scratch)
    cands = [c for p in panels for c in candidates(study, study.panel(p))]
    sweep_temps([panel_dir(layout, p) / "timing" / a.name for p in panels for a in study.arms]
                + [Path(manifest_out).parent, Layout(study.scratch).timed_pass_telemetry.parent], job_start())
    bulk = {c.key.candidate_id: read_record(record_path(layout, c), "generation") for c in cands}
    sample = sampled_pairs(study, panels)
    todo = [c for c in cands if not _is_timed(study, c, bulk[c.key.candidate_id], sample)]
    log.info("timed pass: %d candidates (%d pairs sampled), %d already timed, %d to time", len(cands), len(sample),
             len(cands) - len(todo), len(todo))
    node = exclusivity(alloc) if todo else None
    window_start = time.time()
    skipped = [c for c in todo if (c.key.panel, c.key.prompt_id, c.key.seed) not in sample]
    for c in skipped:  # cheap: no run, a record saying the pair was not in the sample
        b = bulk[c.key.candidate_id]
        not_sampled: TimingRecord = {
            "kind": "timing", "candidate": b["candidate"], "arm": b["arm"], "sampled": False,
            "generation_record_digest": b["record_digest"],
            "timing": {"pass": "timed", "latency_s": None, "pairs": study.timing.pairs, "seed": study.timing.seed},
            "matches_bulk_frames": None}
        write_record(timing_path(layout, c), not_sampled)
    run = [c for c in todo if c not in skipped]
    per_arm: dict[str, dict[str, Any]] = {}
    settings = None
    if run:
        pipes = {a.name: arm_pipeline(a, study.model, study.generation) for a in study.arms
                 if any(c.arm == a for c in run)}
        settings = g.pin_cuda()
        cuda = settings is not None
        uuid = None
        if cuda:
            import torch

            uuid = str(torch.cuda.get_device_properties(0).uuid)  # the device this process times on
        tokens = {name: g.text_tokens(p, study.generation) for name, p in pipes.items()}
        verifiers = {a.name: verifier_for(a, study) for a in study.arms}
        warm, reps = study.timing.warmup, study.timing.repeats

        def call(c: Any) -> Any:
            # A search arm's latency is its whole search: N generations and N scorings.
            return run_arm(pipes[c.arm.name], c.prompt.text, c.key.stream_seed, c.arm, study.generation,
                           tokens[c.arm.name], verifier=verifiers[c.arm.name])

        for arm in study.arms:  # untimed warm-up: kernels, allocator, caches of each arm
            first = next((c for c in run if c.arm == arm), None)
            for _ in range(warm if first is not None else 0):
                call(first)
        by_pair: dict[tuple[str, str, int], list[Any]] = {}
        for c in sorted(run, key=lambda c: (c.key.panel, c.key.prompt_id, c.key.seed, c.arm.name)):
            by_pair.setdefault((c.key.panel, c.key.prompt_id, c.key.seed), []).append(c)
        pairs = list(by_pair.values())
        started, done = time.monotonic(), 0
        for b0 in range(0, len(pairs), BLOCK_PAIRS):
            block = pairs[b0:b0 + BLOCK_PAIRS]
            runs: dict[str, list[dict[str, Any]]] = {c.key.candidate_id: [] for p in block for c in p}
            same: dict[str, bool] = dict.fromkeys(runs, True)
            device = threads = None
            for r in range(reps):
                for c in run_order(block, study.timing.seed, b0 * reps + r):
                    result, measured = _timed_run(pipes[c.arm.name], lambda c=c: call(c), cuda, uuid)
                    runs[c.key.candidate_id].append({"round": r, **measured})
                    same[c.key.candidate_id] &= _same_frames(result, bulk[c.key.candidate_id], study)
                    device, threads = result.device, result.threads
            for c in (c for p in block for c in p):
                done += 1
                _write_timing(study, c, bulk[c.key.candidate_id], runs[c.key.candidate_id],
                              same[c.key.candidate_id], device, threads, settings, node)
                rs = runs[c.key.candidate_id]
                a = per_arm.setdefault(c.arm.name, {"runs": 0, "peak_device_mb": None, "over_max_cv": 0})
                a["runs"] += len(rs)
                if cuda:
                    a["peak_device_mb"] = max([a["peak_device_mb"] or 0.0, *(x["peak_device_mb"] for x in rs)])
                v = cv([x["seconds"] for x in rs])
                a["over_max_cv"] += bool(v is not None and v > study.timing.max_cv)
                a["thermal_flagged"] = a.get("thermal_flagged", 0) + sum(
                    bool(thermal_flag(x.get("throttled"), study.timing.max_temperature_c)["flagged"]) for x in rs)
            log.info("%s", progress_line("timed pass", done, len(run), time.monotonic() - started))
    if todo:
        write_text(Layout(study.scratch).timed_pass_telemetry, json.dumps(
            {"kind": "telemetry", "label": "timed pass", "window": {"start": window_start, "end": time.time()},
             "timed": len(run), "not_sampled": len(skipped), "pairs": study.timing.pairs,
             "seed": study.timing.seed, "per_arm": per_arm, "cuda_settings": settings, "node": node,
             "allocation": alloc.asdict() if alloc else None},
            indent=1, sort_keys=True) + "\n")
    manifest = build_manifest("timing", study.scratch, [timing_path(layout, c) for c in cands],
                              {"study": study.study, "panels": panels, "pass": "timed"},
                              base=os.path.relpath(study.scratch, Path(manifest_out).parent))
    write_manifest(manifest_out, manifest)
    vouch(study.scratch, manifest_out, manifest)  # every record it lists was written or read back here
    return manifest


def _same_frames(result: Any, bulk: GenerationRecord, study: StudySpec) -> bool:
    frames, _ = prepare_frames(result.frames, study.encoder)
    return digest_bytes(frames.tobytes()) == bulk["video"]["raw_digest"]


def _gpu_name() -> str:
    import torch

    return str(torch.cuda.get_device_name(0))


def _write_timing(study: StudySpec, c: Any, b: GenerationRecord, runs: list[dict[str, Any]], same: bool,
                  device: str | None, threads: int | None, settings: dict[str, Any] | None, node: Any) -> None:
    layout = Layout(study.scratch)
    seconds = [x["seconds"] for x in runs]
    v = cv(seconds)
    phases = {k: statistics.median(x["phases"][k] for x in runs) for k in ("denoise", "decode", "other", "total")}
    kept = ("round", "gpu_before", "gpu_after", "throttled", "peak_device_mb")
    gpu: list[dict[str, Any]] = [{**{k: x[k] for k in kept if k in x},
                                  # taken while the GPU throttled or ran above timing/max_temperature_c
                                  "thermal": thermal_flag(x.get("throttled"), study.timing.max_temperature_c)}
                                 for x in runs]
    record: TimingRecord = {
        "kind": "timing", "sampled": True,
        "candidate": b["candidate"], "arm": b["arm"],
        "generation_record_digest": b["record_digest"],
        "timing": {"pass": "timed", "latency_s": statistics.median(seconds), "seconds": seconds,
                   "rounds": [x["round"] for x in runs], "cv": v, "max_cv": study.timing.max_cv,
                   "over_max_cv": bool(v is not None and v > study.timing.max_cv),
                   # medians over the repeats, seconds: denoising loop, VAE decode, the rest
                   "phases_s": phases,
                   "clock": "cuda_events" if device == "cuda" else "perf_counter",
                   "order": "seeded random within each repeat round", "seed": study.timing.seed,
                   "pairs": study.timing.pairs,
                   "warmup_per_arm": study.timing.warmup, "repeats": study.timing.repeats, "batch": 1,
                   "synchronised": device == "cuda", "device": device, "threads": threads,
                   # torch's name for the GPU timed on (its dense BF16 peak gives the estimated MFU)
                   "gpu_name": _gpu_name() if device == "cuda" else None,
                   "cuda_settings": settings,
                   "peak_device_mb": max(x["peak_device_mb"] for x in runs) if device == "cuda" else None,
                   # what one timed run covers: a search arm's whole search
                   "covers": (f"{c.arm.search.n} generations and {c.arm.search.n} {c.arm.search.verifier} "
                              "scorings (best-of-N search)" if c.arm.search else "one generation")},
        "gpu": gpu if device == "cuda" else None,
        "matches_bulk_frames": same,
        "worker": {**worker_identity(), "device": device, "node": node},
    }
    write_record(timing_path(layout, c), record)
