"""Calibration before scale: one representative candidate per arm, measured in a fresh
worker after a warm-up, frozen into a table that the estimate, the budget guard and the
packing choice read (jobs never re-tune on their own).

For each arm of the study, on this machine's device, a fresh worker process (spawned, so
nothing is imported yet) measures the seconds and peak memory (host RSS, device memory)
of each phase: ``import`` (torch, diffusers, the pipeline's modules and the scorers, once
per worker), ``load`` (the arm's pipeline), then, after one untimed warm-up candidate,
``denoise``, ``decode``, ``encode``, ``score:read`` (decoding the video for the scorers)
and one ``score:<metric>`` per scorer for the
representative candidate (the first prompt of the first panel, its first seed; a search
arm's candidate includes its N generations and verifier scorings), its compute counted in
full as the bulk pass counts it; then once more uncounted, as the timed pass runs it
(``timed_s``).

The table is named by its key's digest (``key``): the model's identity, every arm's
digest, the generation shape and settings, the encoder recipe, the scorers, the
software (Python, package versions and the digest of every installed distribution) and
the planning machine's device kind (``device_kind``: ``cuda`` where it sees a GPU). A
change to any of them names another file, so a stale table is never read: the rule
``calibrate`` makes the missing one. The key is computed without torch, so planning
stays light. The table also records the device its worker actually ran on (``device``:
on a cluster, the GPU the calibrate job was granted, like the panel jobs) and the
software that worker saw; the estimate and packing use those.

On the local site a run's preparing job (``stages.calibworker.prepare``: rule
build_tiny_model, else check_arms) measures the table in its own process instead, its
import phase measured first as a fresh worker's, and leaves it in
``scratch/cache/prepared``; rule calibrate then takes it (``take_prepared``) without
importing torch. The table says where it was measured (``measured_in``: ``fresh
worker``, ``build_tiny_model`` or ``check_arms``).

Packing (``packing``): workers per device = floor(capacity x (1 - headroom) / peak) where
the peak is the largest calibrated phase peak of any arm for that stage (device memory on
a GPU, host RSS on CPU, where capacity is the node's memory); at least 1, and 1 where the
table has no device figure. The table records the choice, and a panel job takes it
(``workers_for``): it reads the table for its study's key if one exists (never
re-tunes; a missing, unreadable or stale table, or ``fleet/packing: one``, means one
worker per GPU and ``fleet/cpu_workers`` on CPU), works the figure out again from the
frozen peaks at the current ``fleet/packing_headroom``, and starts that many workers per
granted GPU (CPU workers per node: never more than ``fleet/cpu_workers`` nor the node's
cores / threads). The timed pass always runs one worker alone on its GPU.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..arms.registry import arm_digest
from ..atomic import write_text
from ..envinfo import environment
from ..errors import CalibrationError
from ..fleet.sites import Grant, Packing
from ..identity import digest_obj
from ..layout import Layout
from ..plan.config import StudySpec

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger(__name__)

FORMAT = 1
"""The table's format; a table of another format is refused (recalibrate)."""
GEN_PHASES = ("load", "denoise", "decode", "encode")
"""Phases of a generation task (``import`` is the worker's, once)."""


def device_kind() -> str:
    """``cpu``, or ``cuda`` where this process would see a CUDA device (without importing
    torch: an NVIDIA driver exists, torch was built for CUDA, and ``CUDA_VISIBLE_DEVICES``
    is unset or names a device), as ``generate`` picks its device."""
    env = environment()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    hidden = visible is not None and not [d for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    return "cuda" if env.get("driver") and env.get("cuda") and not hidden else "cpu"


def key_fields(study: StudySpec, device: str) -> dict[str, Any]:
    """What a calibration table is keyed by (see the module docstring); no torch."""
    env = environment()
    return {"format": FORMAT, "model": study.model.identity(),
            "arms": {a.name: arm_digest(a) for a in study.arms},
            "shape": asdict(study.generation),
            "encoder": {k: v for k, v in study.raw["encoder"].items()},
            "scorers": list(study.scorers), "scoring": study.raw["scoring"], "device": device,
            "software": {"python": env["python"], "packages": env["packages"],
                         "installed_digest": env["installed_digest"], "cuda": env["cuda"]}}


def key(study: StudySpec, device: str) -> str:
    """The table's key: ``xxh3_128:<hex>`` of ``key_fields``."""
    return digest_obj(key_fields(study, device))


def table_path(study: StudySpec, device: str | None = None) -> Path:
    """Where the table for this study on ``device`` (default: this machine's) lives."""
    return Layout(study.scratch).calibration(key(study, device or device_kind()))


def load_table(path: Path) -> dict[str, Any]:
    """The calibration table at ``path`` (as a rule's input names it). Raises
    CalibrationError when it cannot be read or is of another format."""
    try:
        table: dict[str, Any] = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise CalibrationError(f"calibration table {path} cannot be read ({e}); delete it and rerun "
                               "'pairflow calibrate'") from e
    if table.get("kind") != "calibration" or table.get("format") != FORMAT:
        raise CalibrationError(f"{path} is not a calibration table of format {FORMAT} (kind "
                               f"{table.get('kind')!r}, format {table.get('format')!r}); delete it and rerun "
                               "'pairflow calibrate'")
    return table


def read_table(study: StudySpec, device: str | None = None) -> dict[str, Any]:
    """The frozen table for this study and device. Raises CalibrationError when it is
    missing (names the command that makes it) or does not carry its own key."""
    dev = device or device_kind()
    path = table_path(study, dev)
    if not path.is_file():
        raise CalibrationError(f"no calibration table for study {study.study!r} on {dev} at {path} (its key "
                               "changes with the model, arms, generation settings, scorers and software); make "
                               "it with 'pairflow calibrate' or let the workflow's calibrate rule run")
    table = load_table(path)
    if table.get("key") != key(study, dev):
        raise CalibrationError(f"calibration table {path} was made for key {table.get('key')!r}, not "
                               f"{key(study, dev)!r}; delete it and rerun 'pairflow calibrate'")
    return table


def _capacity(cuda: bool) -> dict[str, Any]:
    """Memory a worker may share: the device's total (MiB, its name) on CUDA, else the
    host's (``/proc/meminfo`` MemTotal) and its CPU count."""
    out: dict[str, Any] = {"host_mb": _host_total_mb(), "cpus": os.cpu_count()}
    if cuda:
        import torch

        props = torch.cuda.get_device_properties(0)
        out.update({"device_mb": props.total_memory / 2**20, "device_name": props.name})
    return out


def _host_total_mb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


# --- packing --------------------------------------------------------------------------------

STAGE_PHASES = {"generate": ("import", *GEN_PHASES), "score": ("import", "score:")}


def packing(table: dict[str, Any], headroom: float, threads: int = 1) -> dict[str, Any]:
    """Workers per device for each stage (``generate``, ``score``, and ``combined``: one
    worker doing both), from the calibrated peaks: floor(capacity x (1 - headroom) / peak),
    at least 1. On CUDA the capacity is the device's memory and the peak its device
    memory (1 where no device figure was measured); on CPU the host's memory against
    peak RSS, and no more workers than CPUs / ``threads``."""
    cap = table["capacity"]
    cuda = table["device"] == "cuda"
    out: dict[str, Any] = {"headroom": headroom, "basis": "device memory" if cuda else "host memory (RSS)"}
    for stage, prefixes in {**STAGE_PHASES, "combined": ("import", *GEN_PHASES, "score:")}.items():
        field = "peak_device_mb" if cuda else "peak_rss_mb"
        peaks = [float(p[field]) for name, p in _phases(table).items()
                 if name.startswith(prefixes) and p.get(field) is not None]
        capacity = cap.get("device_mb") if cuda else cap.get("host_mb")
        peak = max(peaks) if peaks else None
        if peak is None or not capacity or peak <= 0:
            workers, why = 1, "no calibrated peak for this stage: one worker"
        else:
            workers = max(1, int(capacity * (1 - headroom) // peak))
            why = f"{capacity:.0f} MiB x (1 - {headroom}) / {peak:.0f} MiB peak"
            if not cuda and cap.get("cpus"):
                workers = min(workers, max(1, int(cap["cpus"]) // max(threads, 1)))
                why += f", at most {cap['cpus']} CPUs / {threads} thread(s)"
        out[stage] = {"workers": workers, "peak_mb": peak, "capacity_mb": capacity, "why": why}
    return out


def workers_for(study: StudySpec, stages: tuple[str, ...], grant: Grant) -> Packing:
    """How many workers a job running ``stages`` (``generate``, ``score``; a combined job
    both: the fewest of them) starts on ``grant``: per granted GPU, or CPU workers per
    node, from the frozen calibration table for this study's key on the grant's device
    kind (see the module docstring), with its provenance (``Packing.record``)."""
    fleet, cuda = study.fleet, bool(grant.accelerators)
    cores = (grant.allocation.cpus_on_node if grant.allocation else None) or os.cpu_count() or 1
    cpu_cap = max(1, min(fleet.cpu_workers, cores // max(study.generation.threads, 1)))
    default = Packing(1, None if cuda else fleet.cpu_workers)
    if fleet.packing == "one":
        return replace(default, record={"source": "fleet.packing: one", "headroom": None})
    dev = "cuda" if cuda else "cpu"
    table, why_not = _current_table(study, dev)
    if table is None:
        return replace(default, record={"source": f"default: {why_not}", "headroom": None})
    figures = packing(table, fleet.packing_headroom, study.generation.threads)
    n = min(int(figures[s]["workers"]) for s in stages)
    why = {s: figures[s]["why"] for s in stages}
    if not cuda:
        why["cap"] = f"at most fleet.cpu_workers {fleet.cpu_workers} and {cores} cores / {study.generation.threads} " \
                     "thread(s)"
    record = {"source": f"calibration {table['key']}", "headroom": fleet.packing_headroom, "stages": list(stages),
              "why": why}
    return Packing(n, None, record) if cuda else Packing(1, min(n, cpu_cap), record)


def _current_table(study: StudySpec, dev: str) -> tuple[dict[str, Any] | None, str]:
    """The table measured on ``dev`` for this study, or None and why not. A table is named
    by the planning machine's device kind (a login node without a GPU plans ``cpu`` for
    GPU jobs), so both names are looked at, the job's own first."""
    reasons = []
    for planned in dict.fromkeys((dev, "cpu", "cuda")):
        path = table_path(study, planned)
        if not path.is_file():
            reasons.append(f"no calibration table for this study planned on {planned} ({path.name})")
            continue
        try:
            table = read_table(study, planned)
        except CalibrationError as e:
            reasons.append(f"calibration table not usable ({e})")
            continue
        if table.get("device") == dev:
            return table, ""
        reasons.append(f"calibration table {path.name} was measured on {table.get('device')}, this job runs on {dev}")
    return None, "; ".join(reasons)


def _phases(table: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every phase measured, the largest figures over arms (``score:<metric>`` kept apart)."""
    out: dict[str, dict[str, Any]] = {"import": dict(table["import"])}
    for a in table["arms"].values():
        for name, p in a["phases"].items():
            q = out.setdefault(name, {"s": 0.0, "peak_rss_mb": 0.0, "peak_device_mb": None})
            q["s"] = max(q["s"], float(p.get("s", 0.0)))
            q["peak_rss_mb"] = max(q["peak_rss_mb"], float(p.get("peak_rss_mb") or 0.0))
            if p.get("peak_device_mb") is not None:
                q["peak_device_mb"] = max(q["peak_device_mb"] or 0.0, float(p["peak_device_mb"]))
    return out


def _fresh_worker(study: StudySpec) -> dict[str, Any]:
    """``calibworker.measure_worker`` in a new Python process (``python -m
    pairflow.stages.calibworker``: nothing
    imported yet, as a fan-out worker starts), this package first on its path. Raises
    CalibrationError with the worker's stderr when it fails."""
    with tempfile.TemporaryDirectory(prefix="pairflow-calibrate-") as tmp:
        spec, out = Path(tmp) / "study.pkl", Path(tmp) / "measured.json"
        spec.write_bytes(pickle.dumps(study))
        package_parent = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [package_parent, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])}
        done = subprocess.run([sys.executable, "-m", "pairflow.stages.calibworker", str(spec), str(out)], env=env,
                              capture_output=True, text=True, check=False)
        if done.returncode != 0 or not out.is_file():
            raise CalibrationError(f"the calibration worker failed (exit {done.returncode}); its stderr ends: "
                                   f"{done.stderr[-3000:]}")
        measured: dict[str, Any] = json.loads(out.read_text())
        return measured


# --- the driver ------------------------------------------------------------------------------

def calibrate(study: StudySpec, out: Path | None = None, force: bool = False,
              planned_key: str | None = None, measure: Callable[[], dict[str, Any]] | None = None,
              measured_in: str = "fresh worker") -> dict[str, Any]:
    """Make (or, unless ``force``, read) the frozen calibration table for this study,
    measured in a fresh worker on this job's device; write it atomically to ``out``
    (default ``table_path``). ``planned_key``: the key the workflow planned with (its
    file name), recorded as the table's key. ``measure``: what measures instead of the
    fresh worker (``calibworker.prepare``: the preparing job, its import phase measured
    first, as a worker's), named in the table by ``measured_in``. Returns the table."""
    dev = device_kind()
    path = Path(out) if out is not None else table_path(study, dev)
    if path.is_file() and not force:
        try:
            return read_table(study, dev) if out is None else dict(json.loads(path.read_text()))
        except CalibrationError as e:
            log.warning("recalibrating: %s", e)
    started = time.time()
    measured = measure() if measure is not None else _fresh_worker(study)
    table = {"kind": "calibration", "format": FORMAT, "key": planned_key or key(study, dev),
             "keyed_by": key_fields(study, dev), "software": environment(),
             "made": {"start": started, "end": time.time(), "host": os.uname().nodename, "pid": os.getpid()},
             "measured_in": measured_in, **measured}
    table["packing"] = packing(table, study.fleet.packing_headroom, study.generation.threads)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(table, indent=1, sort_keys=True) + "\n")
    log.info("calibration table %s (%.1f s)", path, time.time() - started)
    return table


def take_prepared(study: StudySpec, out: Path, planned_key: str) -> bool:
    """Rule calibrate's shortcut: when the run's preparing job (``calibworker.prepare``)
    measured the table for ``planned_key``, move it to ``out`` (written atomically; the
    cache entry is then removed, so a forced rerun of the rule measures afresh) and say
    True; no torch is imported. False when there is none or it is not that key's table."""
    cached = Layout(study.scratch).prepared_calibration(planned_key)
    if not cached.is_file():
        return False
    try:
        text = cached.read_text()
        if load_table(cached).get("key") != planned_key:
            raise CalibrationError(f"{cached} was made for another key")
    except (OSError, CalibrationError) as e:
        log.warning("not using the prepared calibration table: %s", e)
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, text)
    cached.unlink(missing_ok=True)
    log.info("calibration table %s: measured by this run's preparing job (%s), taken from %s", out,
             json.loads(text).get("measured_in"), cached)
    return True
