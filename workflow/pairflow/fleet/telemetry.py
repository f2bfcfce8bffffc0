"""Telemetry joined to work: per-task spans, per-slot busy share, NVML samples.

A job that fans tasks out (``fleet.run_tasks``) writes one telemetry record beside its
outputs: the allocation window (from just before the worker pool is asked for until
every result is in), one span per task (queued at the driver; started, finished and
slot at the worker), each slot's busy share (seconds in which it ran a task over the
window: workers packed on one GPU share its slot, and their overlapping spans count
once, so a share never exceeds 1), the whole job's accounting (``honest_share`` from the
allocation's or process's start to after the pool's cleanup, ``job_window``; moved past
the job's manifests by ``close_job``) and, where NVML exists, a CSV of GPU samples with
their summary. Utilisation in the report is computed from these records only, so it
comes from work that was really done.

Imports without torch. NVML (nvidia-ml-py) is reached through ``pairflow.nvml``, the one seam
to the GPU driver.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import json
import logging
import os
import resource
import shutil
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import nvml
from ..atomic import write_text

# pynvml is reached through ``nvml`` (the one seam to the driver, which imports it on first use); torch is
# imported lazily where a device is read: optional, absent without a GPU build.

log = logging.getLogger(__name__)

ACTIVE_PCT = 5.0
"""A GPU counts as active in an NVML sample at this utilisation (percent) or more."""
NVML_FIELDS = ("time", "index", "uuid", "memory_used_mb", "memory_total_mb", "utilization_gpu_pct",
               "power_w", "temperature_c", "tensor_active_pct")


def progress_line(label: str, done: int, total: int, elapsed_s: float) -> str:
    """The progress line every fan-out job (``fleet``) and the timed pass log after each
    finished task: done/total, rate and time left at that rate. ``elapsed_s`` counts work
    only (``work_elapsed``): warm-up (imports, model load) would make the first rates
    read hours too slow."""
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    left = f"~{_clock(max(0.0, (total - done) / rate))} left" if rate else "time left unknown"
    return f"{label}: {done}/{total} done ({done / total:.0%}), {rate * 60:.1f}/min, {left}" if total else \
        f"{label}: nothing to do"


def _clock(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def work_elapsed(spans: list[dict[str, Any]], now: float, fallback_start: float) -> float:
    """Seconds since the first finished task (not a warm-up) started, the clock a rate
    over work only runs on; ``now - fallback_start`` when no span has started yet."""
    starts = [s["started"] for s in spans if s.get("started") is not None and s.get("kind") != "warm-up"]
    return now - (min(starts) if starts else fallback_start)


PHASES_DIR = "phases"
"""Under a job's run folder: one small JSON file per worker naming its start-up phase."""


FORK_SERVER = "fork-server"
"""Stem prefix of a pool's fork server's phase file (``preload``): not a worker, never ready."""


def write_phase(folder: str | Path | None, phase: str, *, who: str = "", **figures: float) -> None:
    """A worker names the start-up phase it is in (importing, loading the model, ready)
    in ``folder/<who><host>-<pid>.json``, for the driver's ``PhaseWatch`` to log (``who``:
    ``FORK_SERVER + "-"`` for a pool's fork server). Best effort: a phase that cannot be
    written is only not shown."""
    if folder is None:
        return
    path = Path(folder) / f"{who}{socket.gethostname()}-{os.getpid()}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps({"phase": phase, "time": time.time(), **figures}))
        tmp.replace(path)
    except OSError:
        return


class PhaseWatch:
    """Logs each worker's start-up phase as it changes (polling ``folder`` every
    ``period_s``) and ``workers ready k/n`` with the seconds since the job started, from
    the job's first second until every slot is ready or the watch is stopped."""

    def __init__(self, folder: Path, label: str, slots: int, period_s: float = 2.0) -> None:
        self.folder, self.label, self.slots, self.period_s = Path(folder), label, slots, period_s
        self.start = time.time()
        self.seen: dict[str, str] = {}
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="pairflow-phases", daemon=True)

    def __enter__(self) -> PhaseWatch:
        shutil.rmtree(self.folder, ignore_errors=True)  # a previous job's workers are not this job's
        if self.slots < 1:  # nothing to run: no pool starts
            return self
        log.info("%s: starting %d worker(s): each imports torch and diffusers, loads the model, imports the "
                 "scorers and loads their models before its first task", self.label, self.slots)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        if self.thread.is_alive():
            self.thread.join(timeout=self.period_s * 2)
            self.poll()  # phases that landed since the last poll

    def poll(self) -> bool:
        """Log what changed since the last poll; True once every slot is ready."""
        for f in sorted(self.folder.glob("*.json")):
            try:
                state = json.loads(f.read_text())
            except (OSError, ValueError):
                continue  # being replaced right now
            if self.seen.get(f.stem) != state["phase"]:
                self.seen[f.stem] = state["phase"]
                figures = ", ".join(f"{k} {v:.1f}s" for k, v in sorted(state.items()) if k.endswith("_s"))
                who = f.stem if f.stem.startswith(FORK_SERVER) else f"worker {f.stem}"
                log.info("%s: %s: %s%s (%.0fs after start)", self.label, who, state["phase"],
                         f" ({figures})" if figures else "", time.time() - self.start)
                ready = sum(1 for p in self.seen.values() if p == "ready")
                if state["phase"] == "ready":
                    log.info("%s: workers ready %d/%d after %.0fs", self.label, ready, self.slots,
                             time.time() - self.start)
        return sum(1 for p in self.seen.values() if p == "ready") >= self.slots

    def _run(self) -> None:
        while not self.stop_event.wait(self.period_s):
            if self.poll():
                return


def slot_name(host: str, gpu_index: str | None, rank: Any = None) -> str:
    """A slot is a physical place a worker runs: ``host/gpu<physical index>``, or
    ``host/cpu<Parsl worker rank>`` where no GPU was granted."""
    return f"{host}/gpu{gpu_index}" if gpu_index not in (None, "") else f"{host}/cpu{rank}"


def slot_key(span: dict[str, Any]) -> str:
    """The slot a task's span ran on."""
    return slot_name(span["host"], span.get("gpu_index"), span.get("rank"))


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of intervals ``(start, end)`` as sorted, disjoint intervals (empty ones dropped)."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(x for x in spans if x[1] > x[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def covered_s(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one interval ``(start, end)``: overlapping intervals
    (two workers packed on one GPU running at once) count once."""
    return sum(b - a for a, b in _merged(spans))


def busy_share(spans: list[dict[str, Any]], window: tuple[float, float],
               slots: list[str] | None = None) -> dict[str, dict[str, float]]:
    """Per slot: seconds in which it ran at least one task (warm-up tasks included:
    importing and loading is the job's work; they are not counted as tasks), the
    allocation window in seconds, and their ratio, at most 1: spans of workers sharing a
    slot (``Packing.per_gpu`` > 1) that overlap count once (``covered_s``). ``slots``
    lists every slot that was allocated (so an idle one shows 0 %)."""
    length = max(window[1] - window[0], 1e-9)
    out: dict[str, dict[str, float]] = {s: {"busy_s": 0.0, "tasks": 0} for s in (slots or [])}
    ran: dict[str, list[tuple[float, float]]] = {}
    for s in spans:
        if s.get("started") is None or s.get("finished") is None:
            continue
        k = slot_key(s)
        out.setdefault(k, {"busy_s": 0.0, "tasks": 0})
        ran.setdefault(k, []).append((max(s["started"], window[0]), min(s["finished"], window[1])))
        out[k]["tasks"] += s.get("kind") != "warm-up"  # a warm-up (imports, model load) is busy, not a task
    for k, v in out.items():
        v["busy_s"] = covered_s(ran.get(k, []))
        v["window_s"] = length
        v["share"] = v["busy_s"] / length
    return out


def process_start(pid: int | str = "self") -> float:
    """A process's start (epoch seconds; default this process), from ``/proc/<pid>/stat``
    (the kernel's own record, so nothing before the first line of Python is missed); on a
    system without /proc, or for a process gone, the interpreter's import of this module
    (later, so the figure flatters less than it could not)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # starttime, field 22: clock ticks after boot
        return boot_epoch() + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED


@functools.cache
def boot_epoch() -> float:
    """When this machine booted, in epoch seconds, to the microsecond: now less the time
    since boot (``CLOCK_BOOTTIME``, the clock ``/proc/<pid>/stat``'s start ticks count
    on). ``/proc/stat``'s ``btime`` is whole seconds, so starts computed from it were up
    to a second early (start-up marks out of order on one machine, in order on another).
    Taken once per process, so every start this process computes uses the same one."""
    try:
        return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):  # no CLOCK_BOOTTIME (not Linux): the whole-second figure
        return next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))


_IMPORTED = time.time()


PROCESS_START = "job process start (/proc/self/stat)"


def job_window(allocated: tuple[float | None, str] | None, end: float) -> tuple[float, float, str]:
    """(start, end, what the start is) of the whole job: under Slurm the allocation's
    start as ``sites.slurm.allocation_start`` read it (``allocated``: (start or None, where
    it was read or why not)), else this job process's start (``process_start``), saying
    why Slurm gave none; ``end`` is the caller's (after the worker pool's cleanup)."""
    if allocated is not None and allocated[0] is not None:
        return float(allocated[0]), end, allocated[1]
    return process_start(), end, PROCESS_START + (f": {allocated[1]}" if allocated is not None else "")


SPAN_KINDS = ("work_s", "warmup_s", "failed_s", "retried_s")
"""What a slot's time in spans is, in the order an overlap is given to (``honest_share``)."""


def _span_kind(s: dict[str, Any]) -> str:
    return ("warmup_s" if s.get("kind") == "warm-up" else "retried_s" if s.get("failure") == "retried"
            else "failed_s" if s.get("failure") else "work_s")


def honest_share(spans: list[dict[str, Any]], job: tuple[float, float], slots: list[str]) -> dict[str, Any]:
    """The busy share that cannot flatter: seconds in which a slot (a GPU, or a CPU
    worker) had task work (warm-up tasks excluded, failed tasks excluded) over slot time
    for the whole job (every granted slot, from the job's start, ``job_window``, to its
    end); at most 1. Workers packed on one GPU share its slot: their overlapping task
    spans count once (``covered_s``), so the share says "the device had work", not how
    many workers had it. The rest of the slot time is beside it, each second counted
    once per slot: ``startup_s`` (job start to the slot's first span: interpreter,
    imports, Parsl, worker start-up), ``warmup_s`` (warm-up tasks: imports, model load,
    where no task work ran), ``failed_s`` (the final attempt of tasks that failed, where
    neither ran), ``retried_s`` (attempts Parsl retried, where none of those ran) and
    ``idle_s`` (everything else: gaps and the tail after a slot's last task), so the six
    add up to ``slot_s``. ``worker_work_s``: task work summed over workers (each packed
    worker's seconds counted), more than ``work_s`` exactly when packed tasks overlapped."""
    start, end = job[0], job[1]
    length = max(end - start, 1e-9)
    names = list(dict.fromkeys([*slots, *(slot_key(s) for s in spans if s.get("started") is not None)]))
    out = {"job_s": length, "slots": len(names), "slot_s": length * max(len(names), 1),
           **dict.fromkeys(SPAN_KINDS, 0.0), "worker_work_s": 0.0, "startup_s": 0.0}
    first: dict[str, float] = {}
    by_slot: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for s in spans:
        if s.get("started") is None or s.get("finished") is None:
            continue
        k, kind = slot_key(s), _span_kind(s)
        clipped = (max(s["started"], start), min(s["finished"], end))
        by_slot.setdefault(k, {}).setdefault(kind, []).append(clipped)
        if kind == "work_s":
            out["worker_work_s"] += max(0.0, clipped[1] - clipped[0])
        first[k] = min(first.get(k, s["started"]), s["started"])
    for kinds in by_slot.values():
        seen: list[tuple[float, float]] = []
        for kind in SPAN_KINDS:  # each second of a slot is given to the first kind that covers it
            before = covered_s(seen)
            seen += kinds.get(kind, [])
            out[kind] += covered_s(seen) - before
    out["startup_s"] = sum(max(0.0, min(first.get(k, end), end) - start) for k in names)
    out["idle_s"] = max(0.0, out["slot_s"] - sum(out[k] for k in SPAN_KINDS) - out["startup_s"])
    out["busy_share"] = out["work_s"] / out["slot_s"]
    return out


# --- NVML -------------------------------------------------------------------------------


def nvml_reader() -> tuple[NvmlReader | None, str]:
    """(read, status): ``read()`` returns one sample per device on this node (a whole GPU,
    or each MIG device of a MIG-enabled GPU; ``NvmlReader``); ``read`` is None with the
    reason in ``status`` where NVML is unavailable (no driver, no GPU). Under MIG,
    ``status`` says that utilisation is unavailable."""
    pynvml, why = nvml.start()
    if pynvml is None:
        return None, why
    try:
        count = pynvml.nvmlDeviceGetCount()
        devices = [d for i in range(count) for d in _devices(pynvml, i)]
    except pynvml.NVMLError as e:
        return None, f"NVML unavailable: {e}"
    migs = sum(d["mig"] for d in devices)
    return NvmlReader(pynvml, devices), (f"NVML {count} GPU(s)" + (
        f", {migs} MIG device(s): utilisation unavailable under MIG (NVML reports none per MIG device or for a "
        "MIG-enabled GPU)" if migs else ""))


class NvmlReader:
    """One NVML sample per device (``_devices``) per call. Each field is read on its own
    (``nvml.optional``): one the device cannot answer is None in its row, the others are
    kept. Under MIG, NVML has no utilisation (neither for the GPU nor per MIG device); a
    MIG device's row carries its own memory and UUID (``MIG-...``, the UUID torch reports
    for the slot) and its physical GPU's power and temperature, and no tensor activity."""

    def __init__(self, pynvml: Any, devices: list[dict[str, Any]]) -> None:
        self.pynvml, self.devices = pynvml, devices
        self.tensor = {d["uuid"]: TensorActivity(pynvml, d["handle"]) for d in devices if not d["mig"]}

    def __call__(self) -> list[dict[str, Any]]:
        pynvml, now, rows = self.pynvml, time.time(), []
        for d in self.devices:
            h, gpu = d["handle"], d["gpu"]
            mem = nvml.optional(pynvml, "nvmlDeviceGetMemoryInfo", h)
            util = None if d["mig"] else nvml.optional(pynvml, "nvmlDeviceGetUtilizationRates", h)
            power = nvml.optional(pynvml, "nvmlDeviceGetPowerUsage", gpu)
            tensor = self.tensor.get(d["uuid"])
            rows.append({"time": now, "index": d["index"], "uuid": d["uuid"],
                         "memory_used_mb": None if mem is None else mem.used / 2**20,
                         "memory_total_mb": None if mem is None else mem.total / 2**20,
                         "utilization_gpu_pct": None if util is None else util.gpu,
                         "power_w": None if power is None else power / 1000.0,
                         "temperature_c": nvml.optional(pynvml, "nvmlDeviceGetTemperature", gpu,
                                                        pynvml.NVML_TEMPERATURE_GPU),
                         "tensor_active_pct": tensor.read() if tensor is not None else None})
        return rows

    def why_no_tensor(self, uuid: str) -> str:
        """Why device ``uuid`` has no tensor-activity value."""
        tensor = self.tensor.get(uuid)
        return tensor.why() if tensor is not None else "not read for a MIG device (NVML GPM per MIG not sampled)"


def _mig_enabled(pynvml: Any, handle: Any) -> bool:
    """Whether MIG is on (current mode) for the physical GPU ``handle``; False where the
    GPU or driver has no MIG."""
    mode = nvml.optional(pynvml, "nvmlDeviceGetMigMode", handle)
    return bool(mode is not None and mode[0] == getattr(pynvml, "NVML_DEVICE_MIG_ENABLE", 1))


def _devices(pynvml: Any, index: int) -> list[dict[str, Any]]:
    """The devices NVML samples for physical GPU ``index``: the GPU itself, or, where MIG
    is on, each MIG device present (a slot absent from the GPU's MIG slots is skipped; a
    MIG-enabled GPU without any MIG device is sampled as itself). ``handle``: memory and
    UUID; ``gpu``: power, temperature and clocks (the physical GPU's)."""
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    out = []
    if _mig_enabled(pynvml, h):
        for j in range(nvml.optional(pynvml, "nvmlDeviceGetMaxMigDeviceCount", h) or 0):
            try:
                m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
            except pynvml.NVMLError as e:
                if nvml.code(e) in (nvml.NOT_FOUND, *nvml.UNANSWERABLE):  # an empty MIG slot
                    continue
                raise
            out.append({"index": index, "handle": m, "gpu": h, "mig": True, "uuid": _text(pynvml.nvmlDeviceGetUUID(m))})
    return out or [{"index": index, "handle": h, "gpu": h, "mig": False, "uuid": _text(pynvml.nvmlDeviceGetUUID(h))}]


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


THROTTLE_REASONS = {  # nvmlClocksEventReasons / nvmlClocksThrottleReasons bits
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
NOT_THROTTLING = frozenset({"gpu_idle"})
"""Reasons that say the clocks are low because nothing runs: never a slowdown of a timed run."""


def uuid_names(uuid: str) -> list[str]:
    """The spellings NVML may know a device by: torch reports a bare UUID where NVML says
    ``GPU-<uuid>`` for a whole GPU and ``MIG-<uuid>`` for a MIG instance."""
    bare = uuid.removeprefix("GPU-").removeprefix("MIG-")
    return list(dict.fromkeys([uuid, f"GPU-{bare}", f"MIG-{bare}"]))


def _handle(pynvml: Any, uuid: str) -> tuple[Any, Any] | None:
    """(handle for memory and processes, handle of the physical GPU for clocks, power,
    temperature and throttle reasons) of the device ``uuid``, a whole GPU or a MIG
    instance; None when NVML has neither."""
    for name in uuid_names(uuid):
        try:
            h = pynvml.nvmlDeviceGetHandleByUUID(name.encode())
        except pynvml.NVMLError:
            continue
        mig = bool(nvml.optional(pynvml, "nvmlDeviceIsMigDeviceHandle", h))
        return h, (pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h) if mig else h)
    return None


def clock_event_reasons(pynvml: Any, gpu: Any) -> int | None:
    """The GPU's current clock-event (throttle) reason bits: ``nvmlDeviceGetCurrentClocksEventReasons``
    (driver R535+), else the deprecated ``...ClocksThrottleReasons`` where the driver or
    nvidia-ml-py lacks it; None where neither answers."""
    bits: int | None = nvml.optional(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", gpu)
    if bits is None:
        bits = nvml.optional(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", gpu)
    return bits


OBSERVERS_VAR = "PAIRFLOW_OBSERVER_PIDS"
"""Comma-separated PIDs of processes that watch a run and may hold a CUDA context of their
own (``benchmarks/gpu_check.py``, which read the GPU's properties): not counted as other
processes on the device (``gpu_state``)."""


def observers() -> set[int]:
    """The PIDs ``OBSERVERS_VAR`` names (malformed entries ignored)."""
    return {int(p) for p in os.environ.get(OBSERVERS_VAR, "").split(",") if p.strip().isdigit()}


def gpu_state(uuid: str | None, own_pid: int) -> dict[str, Any]:
    """One GPU's state through NVML, found by the UUID torch reports for the device this
    process uses (a whole GPU or a MIG instance, whose clocks, power, temperature and
    throttle reasons are its physical GPU's): SM and memory clocks (MHz), throttle
    reasons, temperature (C), power (W), memory used (MiB) and the other processes
    computing on it. Each field is read on its own: one the device cannot answer is
    left out and named in ``unsupported``. Where NVML or the device is unavailable:
    ``{"unavailable": <reason>}`` (recorded, never raised)."""
    if not uuid:
        return {"unavailable": "no CUDA device in this process"}
    pynvml, why = nvml.start()
    if pynvml is None:
        return {"unavailable": why}
    try:
        found = _handle(pynvml, uuid)
        if found is None:
            return {"unavailable": f"NVML has no device with UUID {uuid} (tried {', '.join(uuid_names(uuid))})"}
        h, gpu = found
        get = functools.partial(nvml.optional, pynvml)
        mem, power, procs = (get("nvmlDeviceGetMemoryInfo", h), get("nvmlDeviceGetPowerUsage", gpu),
                             get("nvmlDeviceGetComputeRunningProcesses", h))
        reasons = clock_event_reasons(pynvml, gpu)
        fields = {"sm_clock_mhz": get("nvmlDeviceGetClockInfo", gpu, pynvml.NVML_CLOCK_SM),
                  "mem_clock_mhz": get("nvmlDeviceGetClockInfo", gpu, pynvml.NVML_CLOCK_MEM),
                  "max_sm_clock_mhz": get("nvmlDeviceGetMaxClockInfo", gpu, pynvml.NVML_CLOCK_SM),
                  "throttle_reasons": None if reasons is None else [n for bit, n in THROTTLE_REASONS.items()
                                                                    if reasons & bit],
                  "temperature_c": get("nvmlDeviceGetTemperature", gpu, pynvml.NVML_TEMPERATURE_GPU),
                  "power_w": None if power is None else power / 1000.0,
                  "memory_used_mb": None if mem is None else mem.used / 2**20,
                  "other_processes": None if procs is None else [
                      {"pid": p.pid, "used_mb": (p.usedGpuMemory or 0) / 2**20} for p in procs
                      if p.pid != own_pid and p.pid not in observers()]}
    except pynvml.NVMLError as e:
        return {"unavailable": f"NVML: {e}"}
    missing = sorted(k for k, v in fields.items() if v is None)
    return {**{k: v for k, v in fields.items() if v is not None}, "mig": h is not gpu,
            **({"unsupported": missing} if missing else {})}


class ThrottleWatch:
    """Polls the clock-event (throttle) reasons of the GPU ``uuid`` every ``interval_s``
    on a daemon thread while the ``with`` block runs, so a reason is reported only when it
    appeared *during* a timed run (``reasons``, ``gpu_idle`` excluded). ``polls`` counts
    the polls NVML answered: with none, ``status`` says ``not watched`` and why (not
    ``watched``: no reason seen is then no evidence). A no-op (with ``status`` saying
    why) without NVML or the device."""

    def __init__(self, uuid: str | None, interval_s: float = 0.05) -> None:
        self.uuid, self.interval_s = uuid, interval_s
        self.seen: set[str] = set()
        self.polls = 0
        self.failure = ""
        self.max_temperature_c: float | None = None
        self.status = "not started"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gpu: Any = None

    def _poll(self) -> None:
        pynvml = nvml.loaded()
        if pynvml is None:
            return
        try:
            bits = clock_event_reasons(pynvml, self._gpu)
        except pynvml.NVMLError as e:
            self.failure = f"NVML: {e}"
            return
        if bits is None:
            self.failure = "neither clock-event nor throttle reasons are supported here"
            return
        self.polls += 1
        self.seen.update(n for bit, n in THROTTLE_REASONS.items() if bits & bit)
        try:
            temp = nvml.optional(pynvml, "nvmlDeviceGetTemperature", self._gpu, pynvml.NVML_TEMPERATURE_GPU)
        except pynvml.NVMLError:
            return
        if temp is not None:
            temp = float(temp)
            self.max_temperature_c = temp if self.max_temperature_c is None else max(self.max_temperature_c, temp)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._poll()

    def __enter__(self) -> ThrottleWatch:
        pynvml, why = nvml.start()
        if pynvml is None:
            self.status = f"unavailable: {why}"
            return self
        try:
            found = _handle(pynvml, self.uuid) if self.uuid else None
        except pynvml.NVMLError as e:  # recorded, never raised
            self.status = f"unavailable: NVML: {e}"
            return self
        if found is None:
            self.status = f"unavailable: NVML has no device with UUID {self.uuid}"
            return self
        self._gpu = found[1]
        self.status = "watched"
        self._poll()
        self._thread = threading.Thread(target=self._loop, name="throttle-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._poll()
            if not self.polls:
                self.status = f"not watched: no poll answered ({self.failure or 'no poll ran'})"

    @property
    def reasons(self) -> list[str]:
        return sorted(self.seen - NOT_THROTTLING)


def thermal_flag(throttled: dict[str, Any] | None, limit_c: float) -> dict[str, Any]:
    """Whether a timed run was taken while its GPU throttled (a clock-event reason other
    than idle) or ran above ``limit_c`` (``timing/max_temperature_c``), from its
    ``ThrottleWatch`` figures; ``flagged`` is None where nothing was watched (no NVML)."""
    if not throttled or throttled.get("status") != "watched" or not throttled.get("polls", 1):
        return {"flagged": None, "limit_c": limit_c,
                "why": f"not watched ({(throttled or {}).get('status') or 'no NVML or no GPU'})"}
    temp = throttled.get("max_temperature_c")
    hot = temp is not None and float(temp) > limit_c
    reasons = list(throttled.get("reasons") or [])
    why = ", ".join([*([f"{temp:.0f} C > {limit_c:.0f} C"] if hot else []), *reasons]) or "none"
    return {"flagged": bool(hot or reasons), "limit_c": limit_c, "max_temperature_c": temp, "why": why}


def throttled_during(states: list[dict[str, Any]]) -> list[str]:
    """The throttle reasons in ``states`` (``gpu_state`` readings taken at the end of
    timed runs) that slow a run down: ``gpu_idle`` excluded."""
    return sorted({r for s in states for r in s.get("throttle_reasons", []) if r not in NOT_THROTTLING})


class TensorActivity:
    """Tensor-core activity of one GPU between two reads, from NVML's GPU Performance
    Monitoring (GPM: Hopper and later, driver R520+): ``NVML_GPM_METRIC_ANY_TENSOR_UTIL``,
    the percentage of time any tensor pipe was busy, computed by NVML from two samples.
    ``read()`` gives None where the device or driver has no GPM (``reason`` says why), where
    NVML answered the call but not this metric (its ``nvmlReturn``; ``failure`` says so: a
    failed metric is not a 0 % reading), and on the first read (one sample is no interval).
    ``why()`` says why a GPU has no value. Written here, not through DCGM: DCGM's
    profiling metrics need its host engine running, GPM needs only the driver."""

    def __init__(self, pynvml: Any, handle: Any) -> None:
        self.pynvml, self.handle = pynvml, handle
        self.last: Any = None
        self.reason = ""
        self.failure = ""
        try:
            if not pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                self.reason = "this GPU has no GPM (NVML GPU Performance Monitoring: Hopper and later)"
        except (pynvml.NVMLError, AttributeError) as e:  # an older driver or nvidia-ml-py
            self.reason = f"NVML GPM unavailable: {e}"

    def why(self) -> str:
        """Why this GPU has no tensor-activity value (for a summary without one)."""
        return self.reason or self.failure or "not sampled twice (one GPM sample is no interval)"

    def read(self) -> float | None:
        if self.reason:
            return None
        pynvml = self.pynvml
        try:
            sample = pynvml.nvmlGpmSampleGet(self.handle, pynvml.nvmlGpmSampleAlloc())
            if self.last is None:
                self.last = sample
                return None
            get = pynvml.c_nvmlGpmMetricsGet_t()
            get.version, get.numMetrics = pynvml.NVML_GPM_METRICS_GET_VERSION, 1
            get.sample1, get.sample2 = self.last, sample
            get.metrics[0].metricId = pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
            pynvml.nvmlGpmMetricsGet(get)
            pynvml.nvmlGpmSampleFree(self.last)
            self.last = sample
            status = int(getattr(get.metrics[0], "nvmlReturn", 0))  # absent from old nvidia-ml-py
            if status != 0:  # the call succeeded, this metric did not: its value is no 0 % reading
                self.failure = f"NVML GPM tensor metric failed (nvmlReturn {status})"
                return None
            return float(get.metrics[0].value)
        except pynvml.NVMLError as e:
            self.reason = f"NVML GPM failed: {e}"
            return None


TENSOR_UNAVAILABLE = "unavailable (no NVML GPM tensor-activity sample: not Hopper or later, or not sampled twice)"


def tensor_summary(values: list[Any], why: str | None = None) -> float | str:
    """Mean tensor-core activity (%) over the samples that have it, or why there is none
    (``why``: the reader's reason for this GPU, where it knows one)."""
    got = [float(v) for v in values if v not in (None, "")]
    if got:
        return sum(got) / len(got)
    return f"unavailable ({why})" if why else TENSOR_UNAVAILABLE


class Sampler:
    """Calls ``read`` every ``interval_s`` seconds on a daemon thread (and once at start
    and stop); rows accumulate in memory and are written as CSV by ``write``. A reader
    that raises stops the sampling for good; ``stopped`` says why."""

    def __init__(self, read: Callable[[], list[dict[str, Any]]] | None, interval_s: float) -> None:
        self.read, self.interval_s = read, interval_s
        self.source = read  # kept when sampling stops: it knows why a field is missing
        self.stopped = ""
        self.rows: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        try:
            self.rows += self.read() if self.read else []
        except Exception as e:  # any reader failure ends sampling; the job goes on without it
            log.warning("NVML sample failed (%s); sampling stops", e)
            self.stopped = f"sampling stopped after {len(self.rows)} row(s): {type(e).__name__}: {e}"
            self.read = None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> Sampler:
        if self.read is not None:
            self._sample()
            self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._sample()

    def csv_text(self) -> str:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=NVML_FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows(self.rows)
        return buf.getvalue()

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per GPU (uuid): samples, peak memory, mean utilisation and power, peak temperature,
        the share of samples at >= ``ACTIVE_PCT`` % utilisation, mean tensor-core activity
        (``TensorActivity``; "unavailable (why)" where the GPU or driver has no GPM). A
        field no sample has (utilisation under MIG, power the board does not report) is
        None; samples without a field are left out of its figure."""
        by: dict[str, list[dict[str, Any]]] = {}
        for r in self.rows:
            by.setdefault(str(r["uuid"]), []).append(r)
        why = getattr(self.source, "why_no_tensor", None)

        def got(rs: list[dict[str, Any]], k: str) -> list[float]:
            return [float(r[k]) for r in rs if r.get(k) not in (None, "")]

        def mean(rs: list[dict[str, Any]], k: str) -> float | None:
            v = got(rs, k)
            return sum(v) / len(v) if v else None

        def peak(rs: list[dict[str, Any]], k: str) -> float | None:
            return max(got(rs, k), default=None)

        def active(rs: list[dict[str, Any]]) -> float | None:
            util = got(rs, "utilization_gpu_pct")
            # the share of samples in which the GPU was active (ledger.ACTIVE_PCT)
            return sum(u >= ACTIVE_PCT for u in util) / len(util) if util else None

        return {u: {"samples": len(rs), "memory_used_mb_max": peak(rs, "memory_used_mb"),
                    "utilization_gpu_pct_mean": mean(rs, "utilization_gpu_pct"), "active_share": active(rs),
                    "tensor_active": tensor_summary([r.get("tensor_active_pct") for r in rs],
                                                    why(u) if callable(why) else None),
                    "power_w_mean": mean(rs, "power_w"),
                    "temperature_c_max": peak(rs, "temperature_c")} for u, rs in by.items()}


def write_telemetry(out: Path, label: str, window: tuple[float, float], spans: list[dict[str, Any]],
                    slots: list[str], sampler: Sampler, nvml_status: str, extra: dict[str, Any],
                    job: tuple[float, float, str] | None = None) -> dict[str, Any]:
    """Write ``out`` (JSON) and, when samples exist, ``out`` with suffix ``.nvml.csv``.
    ``job``: the whole job's (start, end, what the start is), ``job_window``; by default
    the Slurm allocation's start (``extra['allocation']['start']``) or this process's
    start, to now (``fleet.run_tasks`` writes the record after the worker pool's
    cleanup; ``close_job`` moves the end past the job's manifests). ``job`` in the
    record holds ``honest_share`` over it; ``slots`` the per-slot shares of the Parsl
    window (warm-up counted busy, start-up outside it: what a progress view shows, never
    the study's figure)."""
    if job is None:
        alloc_start = (extra.get("allocation") or {}).get("start")
        job = job_window((alloc_start, "Slurm allocation start (SLURM_JOB_START_TIME)")
                         if alloc_start is not None else None, time.time())
    record = {"kind": "telemetry", "label": label, "window": {"start": window[0], "end": window[1]},
              "job": {"start": job[0], "end": job[1], "start_is": job[2], "end_is": JOB_END,
                      **honest_share(spans, job[:2], slots)},
              "spans": spans, "slots": busy_share(spans, window, slots),
              "nvml": {"status": nvml_status, "interval_s": sampler.interval_s, "summary": sampler.summary(),
                       **({"stopped": sampler.stopped} if sampler.stopped else {})},
              **extra}
    if sampler.rows:
        csv_path = Path(out).with_suffix(".nvml.csv")
        write_text(csv_path, sampler.csv_text())
        record["nvml"]["csv"] = csv_path.name
    write_text(Path(out), json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


JOB_END = "after the worker pool's cleanup"
JOB_END_MANIFESTS = "after the job's manifests were read back and written"


def close_job(out: Path | None, since: float, end: float | None = None) -> dict[str, Any] | None:
    """Move the job's end in the telemetry record ``out`` to ``end`` (default now) and
    recompute its accounting (``honest_share``): a stage calls it after its manifests
    (every record read back), the job's last work this process can see, so that time is
    the job's slot time too (idle). None, and nothing written, where this job wrote no
    record (none whose window opened at or after ``since``, epoch seconds: a job that ran
    no task writes none, and a previous job's record is not this job's; or ``out`` is None)."""
    if out is None or not Path(out).is_file():
        return None
    path = Path(out)
    record: dict[str, Any] = json.loads(path.read_text())
    if float(record["window"]["start"]) < since:
        return None
    job = record["job"]
    end = time.time() if end is None else end
    record["job"] = {"start": job["start"], "end": end, "start_is": job.get("start_is"), "end_is": JOB_END_MANIFESTS,
                     **honest_share(record["spans"], (job["start"], end), list(record["slots"]))}
    write_text(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


# --- the study's utilisation report ------------------------------------------------------

HONEST = ("work_s", "startup_s", "warmup_s", "idle_s", "failed_s", "retried_s", "slot_s", "worker_work_s")


def utilisation(records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Summarise telemetry records (name → record): the study's busy share, seconds a
    slot had task work (warm-up and failed tasks excluded; packed workers' overlapping
    spans once) over slot time for whole jobs (``honest_share``), with start-up, warm-up,
    idle and failed-task seconds beside it and ``worker_work_s`` (task work summed over
    workers); and, per job and slot,
    the Parsl-window share (``window_busy_share``: warm-up counted busy, start-up outside
    the window, so it flatters)."""
    jobs, busy, alloc = [], 0.0, 0.0
    totals = dict.fromkeys(HONEST, 0.0)
    for name, r in sorted(records.items()):
        slots = r["slots"]
        jobs.append({"job": name, "label": r["label"], "tasks": sum(s.get("kind") != "warm-up" for s in r["spans"]),
                     "failed": sum(1 for s in r["spans"] if s.get("failure") and not s.get("attempt")),
                     "window_s": r["window"]["end"] - r["window"]["start"],
                     "allocation": r.get("allocation"), "nvml": r["nvml"]["status"],
                     "slots": {k: {"share": v["share"], "busy_s": v["busy_s"], "tasks": v["tasks"]}
                               for k, v in sorted(slots.items())},
                     "whole_job": r.get("job")})
        busy += sum(v["busy_s"] for v in slots.values())
        alloc += sum(v["window_s"] for v in slots.values())
        job = r.get("job") or {}
        for k in HONEST:  # a record from before worker_work_s summed work over workers in work_s
            totals[k] += float(job.get(k, job.get("work_s", 0.0) if k == "worker_work_s" else 0.0))
    honest = totals["work_s"] / totals["slot_s"] if totals["slot_s"] else None
    return {"jobs": jobs, "busy_share": honest, **totals,
            "window_busy_s": busy, "allocated_slot_s": alloc, "window_busy_share": busy / alloc if alloc else None}


def utilisation_markdown(u: dict[str, Any], provenance: dict[str, str]) -> str:
    share = u.get("busy_share")
    lines = ["# Slot utilisation", "",
             "Busy share: seconds in which a slot (a GPU, or a CPU worker) had task work (warm-up and failed "
             "tasks excluded; workers packed on one GPU share its slot and their overlapping spans count once, "
             "so it never exceeds 100%) over slot time for whole jobs (from the Slurm allocation's start, or "
             "the job process's start, to the job's end, after the worker pool's cleanup), from per-task spans; "
             "start-up, warm-up (imports, model and scorer loads), idle and failed-task seconds beside it.", "",
             "This page covers the fan-out jobs' slots, from their task spans. The study's busy share, over "
             "every job it ran and everything each held (the scheduler's figures on Slurm), is the ledger's "
             "(study/ledger.md), which `pairflow status` prints.", "",
             (f"Fan-out jobs: **{share:.1%}** busy of {u['slot_s']:.1f} slot-seconds; start-up {u['startup_s']:.1f} s, "
              f"warm-up {u['warmup_s']:.1f} s, idle {u['idle_s']:.1f} s, failed tasks {u['failed_s']:.1f} s; "
              f"task work summed over workers {u['worker_work_s']:.1f} worker-seconds. "
              f"(Over the Parsl window with warm-up counted busy, as earlier reports did: "
              f"{u['window_busy_share']:.1%}.)") if share is not None and u.get("window_busy_share") is not None
             else "Fan-out jobs: none ran.", "",
             "| job | slot | tasks | busy s | window s | busy share |", "|---|---|---|---|---|---|"]
    for j in u["jobs"]:
        for slot, v in j["slots"].items():
            lines.append(f"| {j['job']} | {slot} | {v['tasks']} | {v['busy_s']:.1f} | {j['window_s']:.1f} "
                         f"| {v['share']:.1%} |")
    lines += ["", "NVML: " + "; ".join(sorted({j["nvml"] for j in u["jobs"]})), "", "## Provenance", ""]
    lines += [f"- `{k}`: `{v}`" for k, v in sorted(provenance.items())]
    return "\n".join(lines) + "\n"


# --- peak memory per phase ----------------------------------------------------------------

_CLEAR_REFS = Path("/proc/self/clear_refs")
_UNSET = object()
_STATUS = Path("/proc/self/status")


def _host_peak_mb() -> tuple[float, str]:
    """(peak resident set, what it covers): Linux's VmHWM since the last ``_reset_host``
    (per phase), else the process's lifetime peak (``ru_maxrss``)."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0, "phase"
    except OSError:
        pass

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, "process"


def _reset_host() -> bool:
    """Reset the kernel's peak-RSS mark to the current RSS (``clear_refs`` 5, Linux >= 4.0)."""
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


class PhaseMemory:
    """Peak host RSS and peak device memory per phase. ``start(phase)`` resets both peaks
    (the kernel's VmHWM and torch's CUDA peak); ``stop(phase)`` reads them into
    ``peaks[phase]`` (the larger of any earlier reading: a search's N generations give
    one peak per phase). On a machine where the host peak cannot be reset, its figure is
    the process's peak so far and ``peaks[phase]['host_scope']`` says ``process``.
    ``track(pipe)`` splits a pipeline call into ``denoise`` (everything before the VAE
    decode: text encoding and the denoising loop) and ``decode``."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.peaks: dict[str, dict[str, Any]] = {}

    def start(self, phase: str) -> None:
        reset = _reset_host()
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats()
        self.peaks.setdefault(phase, {"peak_rss_mb": 0.0, "peak_device_mb": None,
                                      "host_scope": "phase" if reset else "process"})

    def stop(self, phase: str) -> None:
        rss, _ = _host_peak_mb()
        p = self.peaks[phase]
        p["peak_rss_mb"] = max(p["peak_rss_mb"], rss)
        if self.cuda:
            import torch

            dev = torch.cuda.max_memory_allocated() / 2**20
            p["peak_device_mb"] = max(p["peak_device_mb"] or 0.0, dev)

    def merge(self, other: PhaseMemory) -> None:
        for phase, q in other.peaks.items():
            p = self.peaks.setdefault(phase, dict(q))
            p["peak_rss_mb"] = max(p["peak_rss_mb"], q["peak_rss_mb"])
            if q["peak_device_mb"] is not None:
                p["peak_device_mb"] = max(p["peak_device_mb"] or 0.0, q["peak_device_mb"])

    def track(self, pipe: Any) -> Any:
        """A context manager: the ``with`` block is a pipeline call of ``pipe``, split at
        its VAE decode (``vae.decode`` wrapped for the call, restored on exit)."""
        @contextlib.contextmanager
        def tracked() -> Any:
            vae: Any = getattr(pipe, "vae", None)
            inner = getattr(vae, "decode", None)
            self.start("denoise")
            state = {"phase": "denoise"}

            def decode(*args: Any, **kwargs: Any) -> Any:
                if state["phase"] == "denoise":
                    self.stop("denoise")
                state["phase"] = "decode"
                self.start("decode")
                try:
                    return inner(*args, **kwargs)  # type: ignore[misc]
                finally:
                    self.stop("decode")

            prev = vae.__dict__.get("decode", _UNSET) if vae is not None else _UNSET  # another wrapper's
            if inner is not None:
                vae.decode = decode  # an instance attribute, removed (or the previous one restored) on exit
            try:
                yield self
            finally:
                if inner is not None:
                    if prev is _UNSET:
                        del vae.decode
                    else:
                        vae.decode = prev
                if state["phase"] == "denoise":
                    self.stop("denoise")

        return tracked()

    def asdict(self) -> dict[str, dict[str, Any]]:
        return {k: dict(v) for k, v in self.peaks.items()}
