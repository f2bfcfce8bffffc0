"""The scheduler's own account of a Slurm job, and the record of each submission.

``scheduler_job`` asks Slurm what a job held and for how long: ``sacct`` where an
accounting database answers, else ``scontrol show job -d`` (the controller's memory of
the job, kept ``MinJobAge`` seconds after it ends). The ledger multiplies what it held
(GPUs, CPUs) by its elapsed time, so both come from the scheduler, never from the job's
own clock or from what was asked for: an ``--exclusive`` job that asked for one GPU holds
the node's every GPU, and Slurm says so (``JOB_GRES``, ``gres/gpu`` in ``AllocTRES``).

``write_submission`` and ``record_outcome`` keep ``<accounts>/slurm-<jobid>.json``, one
per Slurm job, written atomically by the pairflow-slurm executor plugin when Snakemake
submits the job and again when it notices its end::

    {"kind": "slurm-job", "slurm_job": "<id>", "rule": str, "wildcards": {str: str},
     "attempt": int, "snakemake_jobid": int | None, "submitted": epoch,
     "outcome": null | "success" | "error", "noticed": epoch | null,
     "scheduler": <scheduler_job(...)> | null}

A group job's record names its rules joined by ``+`` under ``rule``, no wildcards, no
``snakemake_jobid``, and adds ``"group": {"id": <groupid>, "jobs": [{"rule", "wildcards",
"snakemake_jobid"}, ...]}``.

Slurm prints times in the local time of the process that asks (``TZ``); they are read
back in this process's local time, so the two agree. Imports nothing but the standard
library and ``atomic``: subprocess is the only seam, and its failures are warnings.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ...atomic import write_text

log = logging.getLogger(__name__)

KIND = "slurm-job"
OUTCOMES = ("success", "error")
TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                      "BOOT_FAIL", "DEADLINE"})
"""Job states after which the job holds nothing (Slurm's ``IS_JOB_FINISHED``)."""
SACCT_FORMAT = "JobID,State,ExitCode,Start,End,ElapsedRaw,AllocTRES,NNodes,NodeList,Submit"
SETTLE_S = 10.0
"""How long ``record_outcome`` waits for a job Snakemake saw end to be terminal in Slurm too."""
UNSET = frozenset({"", "Unknown", "None", "N/A", "(null)"})

_RUNTIME = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)$")
_GPU = re.compile(r"^gpu(?::([^:(]+))?(?::(\d+))?(?:\(.*\))?$")


def parse_time(text: str) -> float | None:
    """A Slurm timestamp (``%Y-%m-%dT%H:%M:%S``, local time) as epoch seconds; None for
    ``Unknown``/``None``/empty or anything else that does not parse."""
    if text.strip() in UNSET:
        return None
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def parse_runtime(text: str) -> float | None:
    """Seconds in a Slurm duration: ``D-HH:MM:SS``, ``HH:MM:SS`` or ``MM:SS`` (``RunTime``,
    ``Elapsed``); a bare number is seconds (``ElapsedRaw``). None when it does not parse."""
    text = text.strip()
    if text.isdigit():
        return float(text)
    m = _RUNTIME.match(text)
    if m is None:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def parse_tres(text: str) -> dict[str, str]:
    """A TRES list (``cpu=8,mem=8000M,node=1,billing=8,gres/gpu=2``) as a mapping; empty
    for ``(null)`` or nothing."""
    if text.strip() in UNSET:
        return {}
    out = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def tres_gpus(tres: Mapping[str, str]) -> int | None:
    """GPUs in a parsed TRES list: the untyped ``gres/gpu`` total where Slurm gives one,
    else the sum of the typed ``gres/gpu:<type>`` entries; None when it names no GPU."""
    if "gres/gpu" in tres:
        return _int(tres["gres/gpu"])
    typed = [_int(v) for k, v in tres.items() if k.startswith("gres/gpu:")]
    return sum(typed) if typed else None


def gres_gpus(text: str) -> int | None:
    """GPUs in a gres list (``gpu:2``, ``gpu:a100:2``, ``gres:gpu:1``, ``gres/gpu=2``,
    ``gpu:2(IDX:0-1)``); None when it names no GPU. An untyped count after typed ones
    for the same GPUs is not added twice: the untyped entries win, as in ``tres_gpus``."""
    if text.strip() in UNSET:
        return None
    untyped: list[int] = []
    typed: list[int] = []
    for part in re.split(r",(?![^(]*\))", text):  # commas inside "(IDX:0,2)" do not split
        part = part.strip().removeprefix("gres:").removeprefix("gres/").replace("=", ":")
        m = _GPU.match(part)
        if m is None:
            continue
        kind, count = m.group(1), m.group(2)
        if kind is not None and kind.isdigit() and count is None:  # "gpu:2": the count, no type
            kind, count = None, kind
        n = int(count) if count is not None else 1
        (typed if kind else untyped).append(n)
    if untyped:
        return sum(untyped)
    return sum(typed) if typed else None


def _int(text: str | None, default: int = 0) -> int:
    try:
        return int(str(text).split("-")[0])  # NumNodes=2-2 (min-max while pending)
    except ValueError:
        return default


def base_state(text: str) -> str:
    """A job state without Slurm's decorations: ``CANCELLED by 0`` → ``CANCELLED``,
    ``COMPLETED+`` → ``COMPLETED``."""
    return (text.split() or [""])[0].rstrip("+")


def _record(source: str, job_id: str, state: str, exit_code: str, submit: float | None, start: float | None,
            end: float | None, elapsed_s: float, nodes: int, node_list: str, cpus: int, gpus: int,
            tres: str) -> dict[str, Any]:
    terminal = state in TERMINAL
    if state == "PENDING":
        start = None  # a pending job's StartTime is the backfill scheduler's guess
    if not terminal:
        end = None  # a running job's EndTime is its time limit, not its end
    return {"source": source, "job_id": job_id, "state": state, "terminal": terminal, "exit_code": exit_code,
            "submit": submit, "start": start, "end": end, "elapsed_s": elapsed_s, "nodes": nodes,
            "node_list": node_list, "cpus": cpus, "gpus": gpus, "tres": tres, "read_at": time.time()}


def scontrol_fields(text: str) -> dict[str, str]:
    """``scontrol show job -d -o`` output as a mapping; a key that repeats (the per-node
    ``Nodes=``/``GRES=`` detail) keeps its first value, and ``node_gres`` reads the rest."""
    fields: dict[str, str] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def node_gres(text: str, nodes: Callable[[str], int]) -> int | None:
    """GPUs in ``scontrol -d``'s per-node detail (``Nodes=pf-node[1-2] ... GRES=gpu:2(IDX:0-1)``
    once per group of like nodes): each group's count × its node count (``nodes`` expands
    a hostlist); None when no group names a GPU (Slurm blanks them once the job ends)."""
    total, found = 0, False
    group = ""
    for token in text.split():
        key, _, value = token.partition("=")
        if key == "Nodes":
            group = value
        elif key == "GRES" and group:
            n = gres_gpus(value)
            if n is not None:
                total, found = total + n * max(nodes(group), 1), True
    return total if found else None


def parse_scontrol(text: str, nodes_in: Callable[[str], int] | None = None) -> dict[str, Any] | None:
    """The ``scheduler_job`` dict from one job's ``scontrol show job -d -o`` line; None when
    the text names no job. GPUs: ``gres/gpu`` in ``AllocTRES`` (or ``TRES``, Slurm before
    23.02, once the job has started), else ``JOB_GRES`` (the job's total on all its nodes),
    else the per-node detail, else ``TresPerNode`` × nodes plus ``TresPerJob``. A job that
    was never given nodes (cancelled while pending) held nothing: 0 nodes, CPUs and GPUs."""
    f = scontrol_fields(text)
    if "JobId" not in f:
        return None
    state = base_state(f.get("JobState", ""))
    if state != "RUNNING" and f.get("NodeList", "") in UNSET:  # never allocated: it held nothing
        return _record("scontrol", f["JobId"], state, f.get("ExitCode", ""), parse_time(f.get("SubmitTime", "")),
                       parse_time(f.get("StartTime", "")), parse_time(f.get("EndTime", "")), 0.0, 0, "", 0, 0, "")
    nodes = _int(f.get("NumNodes"), 1)
    alloc = f.get("AllocTRES") or (f.get("TRES", "") if state != "PENDING" else "")
    tres = parse_tres(alloc)
    gpus = tres_gpus(tres)
    if gpus is None:
        gpus = gres_gpus(f.get("JOB_GRES", ""))
    if gpus is None:
        gpus = node_gres(text, nodes_in or (lambda _: 1))
    if gpus is None:
        per_node, per_job = gres_gpus(f.get("TresPerNode", "")), gres_gpus(f.get("TresPerJob", ""))
        gpus = (per_node or 0) * nodes + (per_job or 0)
    cpus = _int(tres.get("cpu"), -1)
    if cpus < 0:
        cpus = _int(f.get("NumCPUs"))
    elapsed = parse_runtime(f.get("RunTime", ""))
    return _record("scontrol", f["JobId"], state, f.get("ExitCode", ""), parse_time(f.get("SubmitTime", "")),
                   parse_time(f.get("StartTime", "")), parse_time(f.get("EndTime", "")),
                   elapsed if elapsed is not None else 0.0, nodes, f.get("NodeList", ""), cpus, gpus, alloc)


def parse_sacct(text: str, job_id: str | None = None) -> dict[str, Any] | None:
    """The ``scheduler_job`` dict from ``sacct -X -n -P --format=`` ``SACCT_FORMAT`` output:
    the row whose JobID is ``job_id`` (default: the first row); None when there is none.
    A job never given nodes (``None assigned``) held nothing, as in ``parse_scontrol``."""
    names = SACCT_FORMAT.split(",")
    for line in text.splitlines():
        cols = line.split("|")
        if len(cols) < len(names):
            continue
        row = dict(zip(names, cols, strict=False))
        if job_id is not None and row["JobID"] != job_id:
            continue
        state = base_state(row["State"])
        times = parse_time(row["Submit"]), parse_time(row["Start"]), parse_time(row["End"])
        if state != "RUNNING" and (row["NodeList"] in UNSET or row["NodeList"] == "None assigned"):
            return _record("sacct", row["JobID"], state, row["ExitCode"], *times, 0.0, 0, "", 0, 0, "")
        tres = parse_tres(row["AllocTRES"])
        elapsed = parse_runtime(row["ElapsedRaw"])
        return _record("sacct", row["JobID"], state, row["ExitCode"], *times,
                       elapsed if elapsed is not None else 0.0, _int(row["NNodes"]), row["NodeList"],
                       _int(tres.get("cpu")), tres_gpus(tres) or 0, row["AllocTRES"])
    return None


def _run(argv: list[str], timeout_s: float) -> subprocess.CompletedProcess[str] | None:
    """``argv``'s completed process, or None (with a warning) when it cannot run in time."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        log.warning("%s did not answer in %.0f s; the job's scheduler figures are not read", " ".join(argv),
                    timeout_s)
    except OSError as e:
        log.warning("%s could not run (%s); the job's scheduler figures are not read", argv[0], e)
    return None


def _node_count(hostlist: str) -> int:
    """How many nodes a hostlist names (``scontrol show hostnames``), 1 when it cannot say."""
    out = _run(["scontrol", "show", "hostnames", hostlist], 10.0)
    return max(len(out.stdout.split()), 1) if out is not None and out.returncode == 0 else 1


def scheduler_job(job_id: str, timeout_s: float = 30) -> dict[str, Any] | None:
    """Slurm's record of job ``job_id`` (``123`` or an array task ``123_4``) as a dict:
    ``source`` (``sacct``/``scontrol``), ``job_id``, ``state`` (``COMPLETED``, ``FAILED``,
    ``CANCELLED``, ``TIMEOUT``, ``RUNNING``, ...), ``terminal``, ``exit_code`` (``"0:0"``),
    ``submit``/``start``/``end`` (epoch s, None when unset), ``elapsed_s`` (s the job
    has held its allocation), ``nodes``, ``node_list``, ``cpus``, ``gpus`` (held on all its
    nodes together), ``tres`` (Slurm's allocated TRES string) and ``read_at`` (epoch s).

    ``sacct`` first; where it has no accounting database, fails or has no row, ``scontrol
    show job -d -o``. None when neither knows the job (purged from the controller after
    ``MinJobAge`` with no database, or never submitted), when the commands are missing, or
    when the scheduler does not answer (each logged as a warning). Raises nothing."""
    if shutil.which("sacct") is not None:
        argv = ["sacct", "-j", str(job_id), "-X", "-n", "-P", f"--format={SACCT_FORMAT}"]
        out = _run(argv, timeout_s)
        if out is not None and out.returncode == 0:
            found = parse_sacct(out.stdout, str(job_id))
            if found is not None:
                return found
        elif out is not None and "accounting storage is disabled" not in out.stderr:
            log.debug("%s failed (%d): %s; asking scontrol", " ".join(argv), out.returncode, out.stderr.strip())
    if shutil.which("scontrol") is None:
        log.warning("neither sacct nor scontrol answers for Slurm job %s (no scontrol on the PATH)", job_id)
        return None
    argv = ["scontrol", "show", "job", "-d", "-o", str(job_id)]
    out = _run(argv, timeout_s)
    if out is None:
        return None
    if out.returncode != 0:
        if "Invalid job id" in out.stderr:
            log.debug("Slurm no longer knows job %s (%s)", job_id, out.stderr.strip())
        else:
            log.warning("%s failed (%d): %s", " ".join(argv), out.returncode, out.stderr.strip())
        return None
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    return parse_scontrol(lines[0], _node_count) if lines else None


def record_path(accounts_dir: Path, slurm_job: str) -> Path:
    """Where Slurm job ``slurm_job``'s record lives: ``<accounts_dir>/slurm-<id>.json``."""
    return Path(accounts_dir) / f"slurm-{slurm_job}.json"


def submission(slurm_job: str, rule: str, wildcards: Mapping[str, str], attempt: int,
               snakemake_jobid: int | None, submitted: float | None = None,
               group: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A new record (module docstring) of a job just submitted: no outcome yet."""
    record: dict[str, Any] = {
        "kind": KIND, "slurm_job": str(slurm_job), "rule": rule, "wildcards": {str(k): str(v) for k, v in
                                                                               wildcards.items()},
        "attempt": int(attempt), "snakemake_jobid": snakemake_jobid,
        "submitted": time.time() if submitted is None else submitted,
        "outcome": None, "noticed": None, "scheduler": None}
    if group is not None:
        record["group"] = dict(group)
    return record


def _write(accounts_dir: Path, record: Mapping[str, Any]) -> Path:
    path = record_path(accounts_dir, record["slurm_job"])
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path


def write_submission(accounts_dir: Path, record: Mapping[str, Any]) -> Path:
    """Write a ``submission`` record atomically; returns its path. Raises OSError (or
    StorageError when the disk is full) when it cannot be written."""
    return _write(accounts_dir, record)


def settled(job_id: str, settle_s: float = SETTLE_S,
            read: Callable[[str], dict[str, Any] | None] | None = None) -> dict[str, Any] | None:
    """``read(job_id)`` once the scheduler calls the job terminal, asking again (0.5, 1, 2,
    4 ... s apart) for at most ``settle_s`` seconds in all while it says COMPLETING or
    RUNNING; then what it said last (None: it does not know the job). ``read`` defaults
    to ``scheduler_job``."""
    read = read or scheduler_job
    deadline = time.monotonic() + settle_s
    wait, waited = 0.5, 0.0
    found = read(job_id)
    while found is not None and not found["terminal"]:
        pause = min(wait, settle_s - waited, deadline - time.monotonic())
        if pause <= 0:
            break
        time.sleep(pause)
        wait, waited = wait * 2, waited + pause
        found = read(job_id)
    return found


def record_outcome(accounts_dir: Path, fallback: Mapping[str, Any], outcome: str, *,
                   noticed: float | None = None, settle_s: float = SETTLE_S,
                   read: Callable[[str], dict[str, Any] | None] | None = None) -> Path:
    """Add how Snakemake saw the job end (``outcome``: ``success``/``error``; ``noticed``:
    when, default now) and the scheduler's settled figures (``settled``) to the job's
    record, atomically; returns its path. ``fallback`` (a ``submission`` record) is used
    when there is no readable record yet. Raises OSError (or StorageError when the disk
    is full) when it cannot be written."""
    path = record_path(accounts_dir, fallback["slurm_job"])
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        record = dict(fallback)
    except (OSError, ValueError) as e:
        log.warning("Slurm job record %s is unreadable (%s); writing it again from what Snakemake knows", path, e)
        record = dict(fallback)
    record.update(outcome=outcome,
                  noticed=time.time() if noticed is None else noticed,
                  scheduler=settled(record["slurm_job"], settle_s, read))
    return _write(accounts_dir, record)
