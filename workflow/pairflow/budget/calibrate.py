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
digest, the generation shape and settings, the encoder recipe, the scorers and the
software (Python, package versions and the digest of every installed distribution). A
change to any of them names another file, so a stale table is never read: the rule
``calibrate`` makes the missing one. The key is computed without torch, so planning
stays light. The key leaves out the device: planning (a login node without a GPU) cannot
know what the jobs will run on. The table records the device kind its worker actually
ran on (``device``: ``cuda`` or ``cpu``; on a cluster the calibrate job is granted a GPU
on the panel jobs' partition, ``profiles/slurm``) and the software that worker saw; the
estimate and packing use those, and a panel job uses the table only when its own device
kind (``job_device``) is the table's.

On the local site a run's preparing job (``stages.calibworker.prepare``: rule
build_tiny_model, else check_arms) measures the table in its own process instead, its
import phase measured first as a fresh worker's, and leaves it in
``scratch/cache/prepared``; rule calibrate then takes it (``take_prepared``) without
importing torch, when it was measured on this job's host and device kind (else it
measures). The table says where it was measured (``measured_in``: ``fresh
worker``, ``build_tiny_model`` or ``check_arms``).

Packing (``packing``): workers per device = floor(capacity x (1 - headroom) / peak) where
the peak is the largest calibrated phase peak of any arm for that stage (device memory on
a GPU, host RSS on CPU, where capacity is the node's memory); at least 1, and 1 where the
table has no device figure. The table records the choice, and a panel job takes it
(``workers_for``): it reads the table for its study's key if one exists and was measured
on the job's own device kind (never re-tunes; a missing, unreadable or stale table, one
measured on another device kind, or ``fleet/packing: one``, means one worker per GPU and
``fleet/cpu_workers`` on CPU, the first four with one warning in the job's log naming the
table, both device kinds and the fix), works the figure out again from the frozen peaks
at the current ``fleet/packing_headroom``, and starts that many workers per granted GPU
(CPU workers per node: never more than ``fleet/cpu_workers`` nor the node's cores /
threads). A job granted GPU slots whose torch sees no CUDA (the CI cluster's fake gres)
computes on the CPU: its device kind is ``cpu``, and the node's CPU-worker figure is
shared over its slots. The timed pass always runs one worker alone on its GPU.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from ..arms.registry import arm_digest
from ..atomic import write_text
from ..envinfo import environment
from ..errors import CalibrationError, StalledError
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
    is unset or names a device), as ``generate`` picks its device. A Slurm job granted a
    GPU on a node without an NVIDIA driver (CI's fake gres) is ``cpu``: so are its workers."""
    env = environment()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    hidden = visible is not None and not [d for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    return "cuda" if env.get("driver") and env.get("cuda") and not hidden else "cpu"


def job_device(grant: Grant) -> str:
    """The device kind a job holding ``grant`` computes on: ``cuda`` where it was granted
    accelerators and this process would see CUDA (``device_kind``), else ``cpu`` (no GPU
    granted, or a torch without CUDA behind granted slots)."""
    return "cuda" if grant.accelerators and device_kind() == "cuda" else "cpu"


def key_fields(study: StudySpec) -> dict[str, Any]:
    """What a calibration table is keyed by (see the module docstring; not the device,
    which the table records); no torch."""
    env = environment()
    return {"format": FORMAT, "model": study.model.identity(),
            "arms": {a.name: arm_digest(a) for a in study.declared_arms},
            # the table then also holds the iso-compute controls' derivation and measures them
            "iso_compute": study.iso_compute,
            "shape": asdict(study.generation),
            "encoder": {k: v for k, v in study.raw["encoder"].items()},
            "scorers": list(study.scorers), "scoring": study.raw["scoring"],
            "software": {"python": env["python"], "packages": env["packages"],
                         "installed_digest": env["installed_digest"], "cuda": env["cuda"]}}


def key(study: StudySpec) -> str:
    """The table's key: ``xxh3_128:<hex>`` of ``key_fields``."""
    return digest_obj(key_fields(study))


def table_path(study: StudySpec) -> Path:
    """Where the table for this study lives."""
    return Layout(study.scratch).calibration(key(study))


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


def read_table(study: StudySpec) -> dict[str, Any]:
    """The frozen table for this study (measured on the device kind it records). Raises
    CalibrationError when it is missing (names the command that makes it) or does not
    carry its own key."""
    path = table_path(study)
    if not path.is_file():
        raise CalibrationError(f"no calibration table for study {study.study!r} at {path} (its key "
                               "changes with the model, arms, generation settings, scorers and software); make "
                               "it with 'pairflow calibrate' or let the workflow's calibrate rule run")
    table = load_table(path)
    if table.get("key") != key(study):
        raise CalibrationError(f"calibration table {path} was made for key {table.get('key')!r}, not "
                               f"{key(study)!r}; delete it and rerun 'pairflow calibrate'")
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


def workers_for(study: StudySpec, stages: tuple[str, ...], grant: Grant, device: str | None = None) -> Packing:
    """How many workers a job running ``stages`` (``generate``, ``score``; a combined job
    both: the fewest of them) starts on ``grant``: per granted GPU, or CPU workers per
    node, from the frozen calibration table for this study's key when it was measured on
    the job's device kind (``device``, default ``job_device(grant)``; see the module
    docstring), with its provenance (``Packing.record``). Where no such table exists (and
    ``fleet/calibrate`` is on) the default is taken with one warning naming the table,
    its device kind, the job's and the fix; call it once per job."""
    fleet = study.fleet
    dev = device or job_device(grant)
    cores = (grant.allocation.cpus_on_node if grant.allocation else None) or os.cpu_count() or 1
    cpu_cap = max(1, min(fleet.cpu_workers, cores // max(study.generation.threads, 1)))
    default = Packing(1, None if grant.accelerators else fleet.cpu_workers)
    if fleet.packing == "one":
        return replace(default, record={"source": "fleet.packing: one", "headroom": None, "device": dev})
    table, why_not = _current_table(study, dev)
    if table is None:
        if fleet.calibrate:
            fallback = "one worker per granted GPU" if grant.accelerators else f"fleet.cpu_workers {fleet.cpu_workers}"
            log.warning("packing: %s; this job takes the default (%s)", why_not, fallback)
        return replace(default, record={"source": f"default: {why_not}", "headroom": None, "device": dev})
    figures = packing(table, fleet.packing_headroom, study.generation.threads)
    n = min(int(figures[s]["workers"]) for s in stages)
    why = {s: figures[s]["why"] for s in stages}
    record = {"source": f"calibration {table['key']}", "headroom": fleet.packing_headroom, "stages": list(stages),
              "device": dev, "measured_in": table.get("measured_in"), "why": why}
    if dev == "cuda":
        return Packing(n, None, record)
    why["cap"] = f"at most fleet.cpu_workers {fleet.cpu_workers} and {cores} cores / {study.generation.threads} " \
                 "thread(s)"
    if not grant.accelerators:
        return Packing(1, min(n, cpu_cap), record)
    # Granted GPU slots that compute on the CPU (no CUDA behind them): the node's CPU
    # workers, shared over the slots Parsl pins them to.
    per_slot = max(1, min(n, cpu_cap) // len(grant.accelerators))
    why["slots"] = f"{len(grant.accelerators)} granted slot(s) without CUDA share the node's CPU workers: " \
                   f"{per_slot} per slot"
    return Packing(per_slot, None, record)


def _current_table(study: StudySpec, dev: str) -> tuple[dict[str, Any] | None, str]:
    """The table for this study if it was measured on ``dev``, or None and why not (the
    table, its device kind, this job's, and the fix)."""
    path = table_path(study)
    if not path.is_file():
        return None, (f"no calibration table {path} for this study's key; rule calibrate makes it before the "
                      "panel jobs (or run 'pairflow calibrate' on a node like this job's)")
    try:
        table = read_table(study)
    except CalibrationError as e:
        return None, f"calibration table not usable ({e})"
    if table.get("device") != dev:
        return None, (f"calibration table {path} was measured on {table.get('device')} "
                      f"({table.get('measured_in')}, host {table.get('made', {}).get('host')}), this job runs on "
                      f"{dev}; recalibrate where the panel jobs run: 'snakemake --forcerun calibrate' with the "
                      f"profile that runs them (profiles/slurm grants rule calibrate a GPU on their partition), "
                      f"or 'pairflow calibrate --force' on a {dev} node")
    return table, ""


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
    imported yet, as a fan-out worker starts), this package first on its path, watched
    by the stall rule (``watch_worker``). Raises CalibrationError headed by the
    exception that ended the worker, with its stderr's tail (warnings left out), or
    StalledError when it stalled."""
    with tempfile.TemporaryDirectory(prefix="pairflow-calibrate-") as tmp:
        spec, out, beat = Path(tmp) / "study.pkl", Path(tmp) / "measured.json", Path(tmp) / "beat"
        spec.write_bytes(pickle.dumps(study))
        package_parent = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [package_parent, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])}
        argv = [sys.executable, "-m", "pairflow.stages.calibworker", str(spec), str(out), str(beat)]
        code, stderr = watch_worker(argv, env, beat, study.fleet.stall_timeout_s, study.fleet.startup_timeout_s,
                                    "the calibration worker")
        if code != 0 or not out.is_file():
            raise CalibrationError(f"the calibration worker failed (exit {code}): {_headline(beat, stderr)}; "
                                   f"its stderr ends (warnings left out):\n{quoted_tail(stderr)}")
        measured: dict[str, Any] = json.loads(out.read_text())
        return measured


POLL_S = 1.0
"""How often ``watch_worker`` looks at its worker's heartbeat."""


def watch_worker(argv: list[str], env: dict[str, str], beat: Path, stall_s: float, startup_s: float,
                 what: str) -> tuple[int, str]:
    """Run a worker process (``argv``, stderr kept in a file beside
    ``beat``) under the stall rule of a fan-out (``fleet.stall_timeout_s``): once it has
    reported progress (rewritten ``beat``), it is killed with everything it started (a
    hung ffmpeg included) when ``beat`` has not moved for ``stall_s``; before that, after
    ``startup_s`` (imports, model load). Returns (exit code, stderr). Raises StalledError
    naming ``what``, the limit and the worker's last report; on any exception (SIGTERM's
    too) the worker's process group is killed first."""
    err_path = beat.with_name(beat.name + ".stderr")
    start = time.time()
    with open(err_path, "wb") as err:
        # In this job's process group (not a session of its own): a kill of the job's
        # group (Snakemake's, a scheduler's) reaches the worker and its ffmpeg too.
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    try:
        while True:
            try:
                code = proc.wait(POLL_S)
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.time()
            try:
                st = beat.stat()
            except FileNotFoundError:
                if now - start > startup_s:
                    raise StalledError(
                        f"{what}: no progress within {now - start:.0f}s of its start (fleet/startup_timeout_s: "
                        f"{startup_s:g}): its imports or model load hang. It was killed; rerun, or raise "
                        "fleet/startup_timeout_s on a slow file system") from None
                continue
            if now - st.st_mtime > stall_s:
                last = beat.read_text(errors="replace").strip()
                raise StalledError(
                    f"{what}: stalled: no progress for {now - st.st_mtime:.0f}s (fleet/stall_timeout_s: {stall_s:g}); "
                    f"it last reported: {last}. It was killed with every process it started; rerun, or raise "
                    "fleet/stall_timeout_s if a single step (one denoising step, one metric on one video) really "
                    "takes that long")
    finally:
        if proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                for child in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
                    with contextlib.suppress(psutil.Error):
                        child.kill()
            proc.kill()
            proc.wait()
    return code, err_path.read_text(errors="replace")


def _headline(beat: Path, stderr: str) -> str:
    """The exception that ended a worker (``calibworker`` wrote its type and message),
    else the last line its stderr's traceback names, else its last non-warning line."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        e = json.loads(beat.with_name(beat.name + ".error").read_text())
        return f"{e['type']}: {e['message']}"
    lines = quoted_tail(stderr).splitlines()
    return lines[-1] if lines else "no exception and no stderr (killed by a signal?)"


WARNING_LINE = re.compile(r"\b[A-Z]\w*Warning\b|^\s*warnings\.warn\(|\bWARNING\b")
"""A line of a warning (Python's ``warnings``: ``...: FutureWarning: ...`` and its source
line; a library's ``WARNING`` log line), not of the failure."""


def quoted_tail(stderr: str, limit: int = 3000) -> str:
    """What of a failed process's ``stderr`` to quote: from its last traceback on (the
    failure; everything a library warned before it is not), without warning lines, the
    last ``limit`` characters."""
    at = stderr.rfind("Traceback (most recent call last):")
    text = stderr[at:] if at >= 0 else stderr
    return "\n".join(line for line in text.strip().splitlines() if not WARNING_LINE.search(line))[-limit:]


# --- the driver ------------------------------------------------------------------------------

def calibrate(study: StudySpec, out: Path | None = None, force: bool = False,
              planned_key: str | None = None, measure: Callable[[], dict[str, Any]] | None = None,
              measured_in: str = "fresh worker") -> dict[str, Any]:
    """Make (or, unless ``force``, read) the frozen calibration table for this study,
    measured in a fresh worker on this job's device; write it atomically to ``out``
    (default ``table_path``). ``planned_key``: the key the workflow planned with (its
    file name), recorded as the table's key. ``measure``: what measures instead of the
    fresh worker (``calibworker.prepare``: the preparing job, its import phase measured
    first, as a worker's), named in the table by ``measured_in``. An existing table
    measured on another device kind than this process's (``device_kind``) is measured
    again. Returns the table."""
    path = Path(out) if out is not None else table_path(study)
    if path.is_file() and not force:
        try:
            table: dict[str, Any] = read_table(study) if out is None else dict(json.loads(path.read_text()))
            if table.get("device") == device_kind():
                publish_iso_compute(study, table)
                return table
            log.warning("recalibrating: %s was measured on %s, this process runs on %s", path, table.get("device"),
                        device_kind())
        except CalibrationError as e:
            log.warning("recalibrating: %s", e)
    started = time.time()
    measured = measure() if measure is not None else _fresh_worker(study)
    table = {"kind": "calibration", "format": FORMAT, "key": planned_key or key(study),
             "keyed_by": key_fields(study), "software": environment(),
             "made": {"start": started, "end": time.time(), "host": os.uname().nodename, "pid": os.getpid()},
             "measured_in": measured_in, **measured}
    table["packing"] = packing(table, study.fleet.packing_headroom, study.generation.threads)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(table, indent=1, sort_keys=True) + "\n")
    log.info("calibration table %s (%.1f s)", path, time.time() - started)
    if out is None or measure is None:  # the table the study reads (not the preparing job's cached copy)
        publish_iso_compute(study, table)
    return table


def publish_iso_compute(study: StudySpec, table: dict[str, Any]) -> None:
    """Where ``iso_compute/enabled``: write the table's iso-compute derivation to
    ``Layout.iso_compute`` (the plain arms it names join the study from there on:
    ``plan.config.derived_arms``), with the key of the table it came from. A table
    without one (measured before it was enabled) is a CalibrationError naming the fix."""
    if not study.iso_compute:
        return
    iso = table.get("iso_compute")
    if not isinstance(iso, dict):
        raise CalibrationError(f"calibration table {table.get('key')} holds no iso-compute derivation (it was "
                               "measured with iso_compute/enabled false); remake it: snakemake --forcerun calibrate")
    write_text(Layout(study.scratch).iso_compute,
               json.dumps({**iso, "calibration_key": table.get("key")}, indent=1, sort_keys=True) + "\n")
    log.info("iso-compute controls %s: %s", Layout(study.scratch).iso_compute,
             ", ".join(f"{a['name']} for {', '.join(a['for'])}" for a in iso.get("arms", [])) or "none")


def take_prepared(study: StudySpec, out: Path, planned_key: str, device: str | None = None,
                  host: str | None = None) -> bool:
    """Rule calibrate's shortcut: when the run's preparing job (``calibworker.prepare``)
    measured the table for ``planned_key`` on this job's host (``host``, default this
    machine's name) and device kind (``device``, default ``device_kind()``), move it to
    ``out`` (written atomically; the cache entry is then removed, so a forced rerun of the
    rule measures afresh) and say True; no torch is imported. False when there is none, it
    is not that key's table, or it was measured elsewhere (a login node, under a
    scheduler: its memory, CPUs and device are not the panel jobs'): this job then
    measures on its own."""
    cached = Layout(study.scratch).prepared_calibration(planned_key)
    if not cached.is_file():
        return False
    dev, here = device or device_kind(), host or os.uname().nodename
    try:
        text = cached.read_text()
        prepared = load_table(cached)
        if prepared.get("key") != planned_key:
            raise CalibrationError(f"{cached} was made for another key")
        made_on = (prepared.get("made", {}).get("host"), prepared.get("device"))
        if made_on != (here, dev):
            raise CalibrationError(f"{cached} was measured on {made_on[1]} on host {made_on[0]} by "
                                   f"{prepared.get('measured_in')}, this job runs on {dev} on host {here}: "
                                   "measuring here")
    except (OSError, CalibrationError) as e:
        log.warning("not using the prepared calibration table: %s", e)
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, text)
    publish_iso_compute(study, prepared)
    cached.unlink(missing_ok=True)
    log.info("calibration table %s: measured by this run's preparing job (%s), taken from %s", out,
             prepared.get("measured_in"), cached)
    return True
