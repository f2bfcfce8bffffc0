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

import contextlib
import json
import logging
import math
import os
import random
import socket
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from .. import progress
from ..analysis import sequential
from ..arms import verifier_for
from ..atomic import job_start, sweep_temps, write_text
from ..errors import PairFlowError, StorageError
from ..fleet.pool import ACTIVE_S, fresh_heartbeats, worker_identity, write_beat
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
        out |= set(keys if n in ("all", "auto") or int(n) >= len(keys)
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


BEAT_S = ACTIVE_S / 4
"""Inside a timed run the heartbeat is rewritten at most this often (seconds): a quarter of
``pairflow status``'s activity window, so status never loses a running pass."""


class _Beats:
    """The timed pass's heartbeat, where ``pairflow status`` reads a running pass: one file
    per panel, ``<panel>/run/timed-pass/heartbeats/<host>-<pid>.json``, as a pool worker's. It
    names the work (``progress``) and carries ``timing``: the panel's timed runs whose
    records are not written yet (``in_flight``; a block's records are written together once
    its last repeat round ends), runs per candidate (``repeats``) and the pass's rate in
    candidates per second over its timed runs (``rate_per_s``, warm-up excluded). Rewritten
    after every timed run and, at most every ``BEAT_S``, on a ``progress.report`` of the
    run in progress (denoising steps), so a run longer than ``pairflow status``'s window
    keeps it fresh while adding at most one small write per ``BEAT_S`` to a timed run.
    Best effort: a write that fails never stops the pass."""

    def __init__(self, layout: Layout, panels: list[str], repeats: int) -> None:
        name = f"{socket.gethostname()}-{os.getpid()}.json"
        self.files = {p: fresh_heartbeats(layout.timed_run_dir(p)) / name for p in panels}
        self.repeats, self.since = repeats, time.time()
        self.in_flight: dict[str, int] = dict.fromkeys(panels, 0)
        self.rate: float | None = None
        self.panel, self.note, self.written = panels[0] if panels else "", "loading the arms' pipelines", 0.0
        self.write(*panels)

    def write(self, *panels: str, phase: str = "task") -> None:
        for p in panels:
            state = {"what": "timed pass", "task": None, "phase": phase, "since": self.since, "at": time.time(),
                     "progress": self.note, "pid": os.getpid(), "host": socket.gethostname(),
                     "timing": {"in_flight": self.in_flight[p], "repeats": self.repeats, "rate_per_s": self.rate}}
            with contextlib.suppress(OSError, StorageError):
                write_beat(self.files[p], state)
        self.written = time.monotonic()

    def report(self, note: str) -> None:
        """``progress.report``'s sink while a run is timed: rewrites the running panel's file."""
        self.note = note
        if time.monotonic() - self.written >= BEAT_S:
            self.write(self.panel)

    def close(self) -> None:
        """The pass ended: every panel's file says idle, nothing in flight."""
        self.in_flight = dict.fromkeys(self.in_flight, 0)
        self.note = "timed pass done"
        self.write(*self.files, phase="idle")


class _Timer:
    """Times candidates in this process and writes their records: one pipeline per arm,
    loaded when the arm is first timed, after its ``timing.warmup`` untimed runs. Pairs
    go in blocks of ``BLOCK_PAIRS``, each repeat round in ``run_order``'s seeded order."""

    def __init__(self, study: StudySpec, bulk: dict[str, GenerationRecord], alloc: AllocationInfo | None,
                 panels: list[str]) -> None:
        self.study, self.bulk, self.alloc = study, bulk, alloc
        self.layout = Layout(study.scratch)
        self.pipes: dict[str, Any] = {}
        self.tokens: dict[str, Any] = {}
        self.settings: dict[str, Any] | None = None
        self.uuid: str | None = None
        self.node: Any = None
        self.cuda = self.ready = False
        self.per_arm: dict[str, dict[str, Any]] = {}
        self.verifiers = {a.name: verifier_for(a, study) for a in study.arms}
        self.timed, self.done, self.runs = 0, 0, 0
        self.work_started: float | None = None  # the first timed run's start: rates count work, not warm-up
        self.same_as_bulk = {"compared": 0, "identical": 0}
        self.beats = _Beats(self.layout, panels, study.timing.repeats)

    def _call(self, c: Any) -> Any:
        # A search arm's latency is its whole search: N generations and N scorings.
        return run_arm(self.pipes[c.arm.name], c.prompt.text, c.key.stream_seed, c.arm, self.study.generation,
                       self.tokens[c.arm.name], verifier=self.verifiers[c.arm.name])

    def _prepare(self, arms: list[Any], first: dict[str, Any]) -> None:
        if not self.ready:
            self.node = exclusivity(self.alloc)
            self.settings = g.pin_cuda()
            self.cuda = self.settings is not None
            if self.cuda:
                import torch

                self.uuid = str(torch.cuda.get_device_properties(0).uuid)  # the device this process times on
            self.ready = True
        for arm in arms:
            if arm.name in self.pipes:
                continue
            self.pipes[arm.name] = arm_pipeline(arm, self.study.model, self.study.generation)
            self.tokens[arm.name] = g.text_tokens(self.pipes[arm.name], self.study.generation)
            self.beats.panel = first[arm.name].key.panel
            with progress.reporting_to(self.beats.report):
                for _ in range(self.study.timing.warmup):  # untimed: kernels, allocator, caches of each arm
                    self._call(first[arm.name])

    def time(self, run: list[Any], total: int, sequential: dict[str, dict[str, Any]] | None = None) -> None:
        """Time ``run`` (candidates) and write their records; ``total``: candidates this pass
        times in all (progress); ``sequential``: each candidate's design fields."""
        if not run:
            return
        first: dict[str, Any] = {}
        for c in run:
            first.setdefault(c.arm.name, c)
        self._prepare([a for a in self.study.arms if a.name in first], first)
        reps = self.study.timing.repeats
        by_pair: dict[tuple[str, str, int], list[Any]] = {}
        for c in sorted(run, key=lambda c: (c.key.panel, c.key.prompt_id, c.key.seed, c.arm.name)):
            by_pair.setdefault((c.key.panel, c.key.prompt_id, c.key.seed), []).append(c)
        pairs = list(by_pair.values())
        for b0 in range(0, len(pairs), BLOCK_PAIRS):
            block = pairs[b0:b0 + BLOCK_PAIRS]
            runs: dict[str, list[dict[str, Any]]] = {c.key.candidate_id: [] for p in block for c in p}
            same: dict[str, bool] = dict.fromkeys(runs, True)
            device = threads = None
            block_panels = sorted({c.key.panel for p in block for c in p})
            for r in range(reps):
                for c in run_order(block, self.study.timing.seed, (self.timed + b0) * reps + r):
                    self.work_started = self.work_started or time.monotonic()
                    self.beats.panel = c.key.panel
                    with progress.reporting_to(self.beats.report):
                        result, measured = _timed_run(self.pipes[c.arm.name], lambda c=c: self._call(c), self.cuda,
                                                      self.uuid)
                    runs[c.key.candidate_id].append({"round": r, **measured})
                    same[c.key.candidate_id] &= _same_frames(result, self.bulk[c.key.candidate_id], self.study)
                    device, threads = result.device, result.threads
                    self._ran(c, block_panels, total)
            for c in (c for p in block for c in p):
                self.done += 1
                cid = c.key.candidate_id
                _write_timing(self.study, c, self.bulk[cid], runs[cid], same[cid], device, threads, self.settings,
                              self.node, (sequential or {}).get(cid))
                # The timed run repeats the bulk run (same seed, same arm): a free repeatability check.
                self.same_as_bulk["compared"] += 1
                self.same_as_bulk["identical"] += bool(same[cid])
                self._count(c, runs[cid])
            self.runs = 0
            self.beats.in_flight = dict.fromkeys(self.beats.in_flight, 0)
            self.beats.write(*block_panels)  # the block's records are written: none in flight
        self.timed += len(pairs)

    def _ran(self, c: Any, block_panels: list[str], total: int) -> None:
        """One timed run finished: the heartbeat counts it, and each time the runs add up to
        another candidate's worth (``timing.repeats`` runs) the log gets a progress line.
        Progress is in candidates: ``done`` written plus this block's runs over the repeats."""
        reps = self.study.timing.repeats
        self.runs += 1
        self.beats.in_flight[c.key.panel] += 1
        done = self.done + self.runs / reps
        elapsed = time.monotonic() - (self.work_started or time.monotonic())
        self.beats.rate = done / elapsed if elapsed > 0 else None
        self.beats.note = f"timed {c.key.candidate_id} ({c.arm.name}), {self.runs} run(s) of this block"
        self.beats.write(*block_panels)
        if self.runs % reps == 0:
            log.info("%s", progress_line("timed pass", int(done), total, elapsed))

    def _count(self, c: Any, rs: list[dict[str, Any]]) -> None:
        a = self.per_arm.setdefault(c.arm.name, {"runs": 0, "candidates": 0, "peak_device_mb": None,
                                                 "over_max_cv": 0})
        a["runs"] += len(rs)
        a["candidates"] += 1
        if self.cuda:
            a["peak_device_mb"] = max([a["peak_device_mb"] or 0.0, *(x["peak_device_mb"] for x in rs)])
        v = cv([x["seconds"] for x in rs])
        a["over_max_cv"] += bool(v is not None and v > self.study.timing.max_cv)
        a["thermal_flagged"] = a.get("thermal_flagged", 0) + sum(
            bool(thermal_flag(x.get("throttled"), self.study.timing.max_temperature_c)["flagged"]) for x in rs)


def _not_sampled(study: StudySpec, c: Any, b: GenerationRecord, stopped: str | None = None) -> None:
    """A record saying the pair was not timed: outside the ``timing.pairs: N`` sample, or
    (``stopped``) beyond where the sequential design stopped for this arm."""
    timing: dict[str, Any] = {"pass": "timed", "latency_s": None, "pairs": study.timing.pairs,
                              "seed": study.timing.seed}
    if stopped is not None:
        timing["stopped"] = stopped
    record: TimingRecord = {
        "kind": "timing", "candidate": b["candidate"], "arm": b["arm"], "sampled": False,
        "generation_record_digest": b["record_digest"], "timing": timing,  # type: ignore[typeddict-item]
        "matches_bulk_frames": None}
    write_record(timing_path(Layout(study.scratch), c), record)


def _run_timed_pass(study: StudySpec, panels: list[str], manifest_out: Path,
                    alloc: AllocationInfo | None) -> Manifest:
    layout = Layout(study.scratch)
    cands = [c for p in panels for c in candidates(study, study.panel(p))]
    sweep_temps([panel_dir(layout, p) / "timing" / a.name for p in panels for a in study.arms]
                + [Path(manifest_out).parent, Layout(study.scratch).timed_pass_telemetry.parent], job_start())
    bulk = {c.key.candidate_id: read_record(record_path(layout, c), "generation") for c in cands}
    timer = _Timer(study, bulk, alloc, panels)
    window_start = time.time()
    if study.timing.pairs == "auto":
        design = _sequential_pass(study, cands, bulk, timer)
        wrote, not_sampled = timer.done + design["not_sampled_written"], design["not_timed"]
    else:
        design = None
        sample = sampled_pairs(study, panels)
        not_sampled = sum((c.key.panel, c.key.prompt_id, c.key.seed) not in sample for c in cands)
        todo = [c for c in cands if not _is_timed(study, c, bulk[c.key.candidate_id], sample)]
        log.info("timed pass: %d candidates (%d pairs sampled), %d already timed, %d to time", len(cands),
                 len(sample), len(cands) - len(todo), len(todo))
        skipped = [c for c in todo if (c.key.panel, c.key.prompt_id, c.key.seed) not in sample]
        for c in skipped:  # cheap: no run, a record saying the pair was not in the sample
            _not_sampled(study, c, bulk[c.key.candidate_id])
        run = [c for c in todo if c not in skipped]
        timer.time(run, len(run))
        wrote = len(todo)
    timer.beats.close()  # (a pass that fails leaves its files to go stale: status then reads records only)
    if wrote:
        write_text(Layout(study.scratch).timed_pass_telemetry, json.dumps(
            {"kind": "telemetry", "label": "timed pass", "window": {"start": window_start, "end": time.time()},
             "timed": timer.done, "not_sampled": not_sampled,
             "pairs": study.timing.pairs, "repeats": study.timing.repeats, "seed": study.timing.seed,
             "sequential": design, "frames_match_bulk": timer.same_as_bulk, "per_arm": timer.per_arm,
             "cuda_settings": timer.settings, "node": timer.node,
             "allocation": alloc.asdict() if alloc else None},
            indent=1, sort_keys=True) + "\n")
    manifest = build_manifest("timing", study.scratch, [timing_path(layout, c) for c in cands],
                              {"study": study.study, "panels": panels, "pass": "timed"},
                              base=os.path.relpath(study.scratch, Path(manifest_out).parent))
    write_manifest(manifest_out, manifest)
    vouch(study.scratch, manifest_out, manifest)  # every record it lists was written or read back here
    return manifest


def _design_fields(study: StudySpec, pilot: bool, n0: int) -> dict[str, Any]:
    t = study.timing
    return {"design": sequential.DESIGN, "pilot": pilot, "pilot_prompts": n0, "precision": t.precision,
            "max_prompts": t.max_prompts, "level": study.stats.level}


def _kept(study: StudySpec, c: Any, bulk: GenerationRecord, fields: dict[str, Any] | None,
          stopped: str | None = None) -> bool:
    """Whether the candidate's record can stay under the sequential design: a clean timing
    with these design ``fields``, or (``fields`` None) a not-timed record saying ``stopped``."""
    try:
        t = read_record(timing_path(Layout(study.scratch), c), "timing")
    except PairFlowError:
        return False
    if stale_link(t, bulk):
        return False
    if fields is None:
        return t["sampled"] is False and t["timing"].get("stopped") == stopped
    return (t["sampled"] is True and not timing_frames_differ(t)
            and t["timing"].get("sequential") == fields and t["timing"].get("repeats") == study.timing.repeats)


def _sequential_pass(study: StudySpec, cands: list[Any], bulk: dict[str, GenerationRecord],
                     timer: _Timer) -> dict[str, Any]:
    """``timing.pairs: auto``: the pilot prompts first, then, per arm, as many prompts as
    its pilot's spread asks for (``analysis.sequential``). Records already timed under the
    same design are kept; candidates beyond an arm's stop get a not-timed record saying why."""
    t = study.timing
    units = sequential.order({(c.key.panel, c.key.prompt_id) for c in cands}, t.seed)
    rank = {u: i for i, u in enumerate(units)}
    n0 = min(t.pilot_prompts, t.max_prompts, len(units))
    unit = {c.key.candidate_id: rank[(c.key.panel, c.key.prompt_id)] for c in cands}
    treatments = [a.name for a in study.arms if a.name != "control"]
    pilot = [c for c in cands if unit[c.key.candidate_id] < n0]
    fields = {c.key.candidate_id: _design_fields(study, unit[c.key.candidate_id] < n0, n0) for c in cands}
    todo = [c for c in pilot if not _kept(study, c, bulk[c.key.candidate_id], fields[c.key.candidate_id])]
    log.info("timed pass (sequential, %s): %d prompts, pilot of %d (%d candidates, %d to time)", sequential.DESIGN,
             len(units), n0, len(pilot), len(todo))
    timer.time(todo, len(todo), fields)
    layout = Layout(study.scratch)
    lat = {c.key.candidate_id: _clean_latency(read_record(timing_path(layout, c), "timing")) for c in pilot}
    plans: dict[str, sequential.Plan] = {}
    control = {(c.key.panel, c.key.prompt_id, c.key.seed): c.key.candidate_id for c in pilot if c.arm.name == "control"}
    for arm in treatments:
        ratios: dict[tuple[str, str], list[float]] = {}
        for c in pilot:
            if c.arm.name != arm:
                continue
            lc = lat[control[(c.key.panel, c.key.prompt_id, c.key.seed)]]
            lt = lat[c.key.candidate_id]
            if lc is not None and lt is not None:
                ratios.setdefault((c.key.panel, c.key.prompt_id), []).append(math.log(lc / lt))
        x = [sum(v) / len(v) for _u, v in sorted(ratios.items())]
        plans[arm] = sequential.plan(np.array(x), study.stats.level, t.precision, n0, len(units), t.max_prompts)
    need = {arm: p.prompts for arm, p in plans.items()}
    need["control"] = max(need.values(), default=n0)
    stop = {arm: p.stopped for arm, p in plans.items()}
    stop["control"] = "precision" if need["control"] < min(len(units), t.max_prompts) else (
        "exhausted" if need["control"] == len(units) else "ceiling")
    later = [c for c in cands if unit[c.key.candidate_id] >= n0]
    wanted = [c for c in later if unit[c.key.candidate_id] < need.get(c.arm.name, n0)]
    todo = [c for c in wanted if not _kept(study, c, bulk[c.key.candidate_id], fields[c.key.candidate_id])]
    log.info("timed pass: pilot done; prompts to time per arm %s (%s); %d more candidates to time", need, stop,
             len(todo))
    timer.time(todo, timer.done + len(todo), fields)
    written, wanted_ids = 0, {c.key.candidate_id for c in wanted}
    for c in later:
        why = stop.get(c.arm.name, "precision")
        if c.key.candidate_id in wanted_ids or _kept(study, c, bulk[c.key.candidate_id], None, why):
            continue
        _not_sampled(study, c, bulk[c.key.candidate_id], why)
        written += 1
    timed = {(c.key.panel, c.key.prompt_id, c.key.seed) for c in [*pilot, *wanted]}
    log.info("timed pass: %d candidates (%d pairs sampled), %d already timed, %d to time", len(cands), len(timed),
             len(cands) - timer.done - written, timer.done + written)
    return {"design": sequential.DESIGN, "prompts": len(units), "pilot_prompts": n0, "precision": t.precision,
            "max_prompts": t.max_prompts, "level": study.stats.level, "not_sampled_written": written,
            "not_timed": len(later) - len(wanted),
            "arms": {arm: {"prompts": p.prompts, "stopped": p.stopped, "pilot_clean": p.pilot_prompts,
                           "pilot_sd_log": p.pilot_sd, "planned_half_width_log": p.planned_half_width}
                     for arm, p in plans.items()},
            "control_prompts": need["control"]}


def _clean_latency(t: TimingRecord) -> float | None:
    """A pilot record's latency, None where its run computed other frames (dropped, as stats does)."""
    if not t["sampled"] or timing_frames_differ(t):
        return None
    return t["timing"]["latency_s"]

def _same_frames(result: Any, bulk: GenerationRecord, study: StudySpec) -> bool:
    frames, _ = prepare_frames(result.frames, study.encoder)
    return digest_bytes(frames.tobytes()) == bulk["video"]["raw_digest"]


def _gpu_name() -> str:
    import torch

    return str(torch.cuda.get_device_name(0))


def _write_timing(study: StudySpec, c: Any, b: GenerationRecord, runs: list[dict[str, Any]], same: bool,
                  device: str | None, threads: int | None, settings: dict[str, Any] | None, node: Any,
                  design: dict[str, Any] | None = None) -> None:
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
    if design is not None:  # timing.pairs: auto: the sequential design this run belongs to (analysis.sequential)
        record["timing"]["sequential"] = design
    write_record(timing_path(layout, c), record)
