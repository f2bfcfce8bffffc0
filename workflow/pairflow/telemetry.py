"""Telemetry joined to work: per-task spans, per-slot busy share, NVML samples.

A job that fans tasks out (``fleet.run_tasks``) writes one telemetry record beside its
outputs: the allocation window (from just before the worker pool is asked for until
every result is in), one span per task (queued at the driver; started, finished and
slot at the worker), each slot's busy share (seconds running tasks over the window)
and, where NVML exists, a CSV of GPU samples with their summary. Utilisation in the
report is computed from these records only, so it comes from work that was really done.

Imports without torch. NVML (nvidia-ml-py) is the one seam to the GPU driver.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .atomic import write_text

log = logging.getLogger(__name__)

NVML_FIELDS = ("time", "index", "uuid", "memory_used_mb", "memory_total_mb", "utilization_gpu_pct",
               "power_w", "temperature_c")


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


def write_phase(folder: str | Path | None, phase: str, **figures: float) -> None:
    """A worker names the start-up phase it is in (importing, loading the model, ready)
    in ``folder/<host>-<pid>.json``, for the driver's ``PhaseWatch`` to log. Best effort:
    a phase that cannot be written is only not shown."""
    import os
    import socket

    if folder is None:
        return
    path = Path(folder) / f"{socket.gethostname()}-{os.getpid()}.json"
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
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)  # a previous job's workers are not this job's
        if self.slots < 1:  # nothing to run: no pool starts
            return self
        log.info("%s: starting %d worker(s): each imports torch and diffusers, loads the model and imports the "
                 "scorers before its first task", self.label, self.slots)
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
                log.info("%s: worker %s: %s%s (%.0fs after start)", self.label, f.stem, state["phase"],
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


def busy_share(spans: list[dict[str, Any]], window: tuple[float, float],
               slots: list[str] | None = None) -> dict[str, dict[str, float]]:
    """Per slot: seconds spent running tasks (warm-up tasks included: importing and loading
    is the job's work; they are not counted as tasks), the allocation window in seconds, and their
    ratio. ``slots`` lists every slot that was allocated (so an idle one shows 0 %)."""
    length = max(window[1] - window[0], 1e-9)
    out: dict[str, dict[str, float]] = {s: {"busy_s": 0.0, "tasks": 0} for s in (slots or [])}
    for s in spans:
        if s.get("started") is None or s.get("finished") is None:
            continue
        k = slot_key(s)
        out.setdefault(k, {"busy_s": 0.0, "tasks": 0})
        out[k]["busy_s"] += max(0.0, min(s["finished"], window[1]) - max(s["started"], window[0]))
        out[k]["tasks"] += s.get("kind") != "warm-up"  # a warm-up (imports, model load) is busy, not a task
    for v in out.values():
        v["window_s"] = length
        v["share"] = v["busy_s"] / length
    return out


# --- NVML -------------------------------------------------------------------------------

def nvml_reader() -> tuple[Callable[[], list[dict[str, Any]]] | None, str]:
    """(read, status): ``read()`` returns one sample per GPU on this node; ``read`` is None
    with the reason in ``status`` where NVML is unavailable (no driver, no GPU)."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as e:
        return None, f"NVML unavailable: {e}"
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]

    def text(v: Any) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    def read() -> list[dict[str, Any]]:
        now, rows = time.time(), []
        for i, h in enumerate(handles):
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            rows.append({"time": now, "index": i, "uuid": text(pynvml.nvmlDeviceGetUUID(h)),
                         "memory_used_mb": mem.used / 2**20, "memory_total_mb": mem.total / 2**20,
                         "utilization_gpu_pct": pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
                         "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
                         "temperature_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)})
        return rows

    return read, f"NVML {count} GPU(s)"


THROTTLE_REASONS = {  # nvmlClocksEventReasons / nvmlClocksThrottleReasons bits
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def gpu_state(uuid: str | None, own_pid: int) -> dict[str, Any]:
    """One GPU's state through NVML, found by the UUID torch reports for the device this
    process uses: SM and memory clocks (MHz), throttle reasons, temperature (C), power
    (W), memory used (MiB) and the other processes computing on it. Where NVML or the
    device is unavailable: ``{"unavailable": <reason>}`` (recorded, never raised)."""
    try:
        import pynvml
    except ImportError:
        return {"unavailable": "nvidia-ml-py is not installed"}
    if not uuid:
        return {"unavailable": "no CUDA device in this process"}
    try:
        pynvml.nvmlInit()
        h = None
        for name in (uuid, f"GPU-{uuid}"):  # torch prints the UUID without NVML's "GPU-" prefix
            try:
                h = pynvml.nvmlDeviceGetHandleByUUID(name.encode() if isinstance(name, str) else name)
                break
            except pynvml.NVMLError:
                continue
        if h is None:
            return {"unavailable": f"NVML has no device with UUID {uuid}"}
        reasons = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        return {"sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
                "max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
                "throttle_reasons": [n for bit, n in THROTTLE_REASONS.items() if reasons & bit],
                "temperature_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
                "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
                "memory_used_mb": pynvml.nvmlDeviceGetMemoryInfo(h).used / 2**20,
                "other_processes": [{"pid": p.pid, "used_mb": (p.usedGpuMemory or 0) / 2**20}
                                    for p in procs if p.pid != own_pid]}
    except pynvml.NVMLError as e:
        return {"unavailable": f"NVML: {e}"}


class Sampler:
    """Calls ``read`` every ``interval_s`` seconds on a daemon thread (and once at start
    and stop); rows accumulate in memory and are written as CSV by ``write``."""

    def __init__(self, read: Callable[[], list[dict[str, Any]]] | None, interval_s: float) -> None:
        self.read, self.interval_s = read, interval_s
        self.rows: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        try:
            self.rows += self.read() if self.read else []
        except Exception as e:
            log.warning("NVML sample failed (%s); sampling stops", e)
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

    def summary(self) -> dict[str, dict[str, float]]:
        """Per GPU (uuid): samples, peak memory, mean utilisation and power, peak temperature."""
        by: dict[str, list[dict[str, Any]]] = {}
        for r in self.rows:
            by.setdefault(str(r["uuid"]), []).append(r)

        def mean(rs: list[dict[str, Any]], k: str) -> float:
            return sum(float(r[k]) for r in rs) / len(rs)

        return {u: {"samples": len(rs), "memory_used_mb_max": max(float(r["memory_used_mb"]) for r in rs),
                    "utilization_gpu_pct_mean": mean(rs, "utilization_gpu_pct"),
                    "power_w_mean": mean(rs, "power_w"),
                    "temperature_c_max": max(float(r["temperature_c"]) for r in rs)} for u, rs in by.items()}


def write_telemetry(out: Path, label: str, window: tuple[float, float], spans: list[dict[str, Any]],
                    slots: list[str], sampler: Sampler, nvml_status: str, extra: dict[str, Any]) -> dict[str, Any]:
    """Write ``out`` (JSON) and, when samples exist, ``out`` with suffix ``.nvml.csv``."""
    record = {"kind": "telemetry", "label": label, "window": {"start": window[0], "end": window[1]},
              "spans": spans, "slots": busy_share(spans, window, slots),
              "nvml": {"status": nvml_status, "interval_s": sampler.interval_s, "summary": sampler.summary()},
              **extra}
    if sampler.rows:
        csv_path = Path(out).with_suffix(".nvml.csv")
        write_text(csv_path, sampler.csv_text())
        record["nvml"]["csv"] = csv_path.name
    write_text(Path(out), json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


# --- the study's utilisation report ------------------------------------------------------

def utilisation(records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Summarise telemetry records (name → record): per job and slot busy share, and the
    study's busy share (task seconds over allocated slot seconds)."""
    jobs, busy, alloc = [], 0.0, 0.0
    for name, r in sorted(records.items()):
        slots = r["slots"]
        jobs.append({"job": name, "label": r["label"], "tasks": sum(s.get("kind") != "warm-up" for s in r["spans"]),
                     "failed": sum(1 for s in r["spans"] if s.get("failure")),
                     "window_s": r["window"]["end"] - r["window"]["start"],
                     "allocation": r.get("allocation"), "nvml": r["nvml"]["status"],
                     "slots": {k: {"share": v["share"], "busy_s": v["busy_s"], "tasks": v["tasks"]}
                               for k, v in sorted(slots.items())}})
        busy += sum(v["busy_s"] for v in slots.values())
        alloc += sum(v["window_s"] for v in slots.values())
    return {"jobs": jobs, "busy_s": busy, "allocated_slot_s": alloc,
            "busy_share": busy / alloc if alloc else None}


def utilisation_markdown(u: dict[str, Any], provenance: dict[str, str]) -> str:
    lines = ["# Slot utilisation", "",
             "Share of each slot's allocated time spent running tasks (from per-task spans). "
             "The window runs from asking for workers to the last result, so worker start-up "
             "and the tail after a slot's last task count as idle.", "",
             f"Study: {u['busy_share']:.1%} of {u['allocated_slot_s']:.1f} allocated slot-seconds busy."
             if u["busy_share"] is not None else "Study: no fan-out jobs ran.", "",
             "| job | slot | tasks | busy s | window s | busy share |", "|---|---|---|---|---|---|"]
    for j in u["jobs"]:
        for slot, v in j["slots"].items():
            lines.append(f"| {j['job']} | {slot} | {v['tasks']} | {v['busy_s']:.1f} | {j['window_s']:.1f} "
                         f"| {v['share']:.1%} |")
    lines += ["", "NVML: " + "; ".join(sorted({j["nvml"] for j in u["jobs"]})), "", "## Provenance", ""]
    lines += [f"- `{k}`: `{v}`" for k, v in sorted(provenance.items())]
    return "\n".join(lines) + "\n"
