"""A job's own account of itself: what it was given, from when to when, and how it ended.

Every rule script opens one first (``stages.steps.study_for_rule``), so every job of a
study (prepare, calibrate, estimate, panel, fleet, timed pass, stats, report, archive,
replicate) has one, retried and failed attempts included. The account is written at
once, status ``running``, to ``<accounts>/job-<name>-<start ms>-<pid>.json`` (the folder
``PAIRFLOW_ACCOUNTS`` names, set by ``common.smk``; else the study's ``Layout.accounts``),
and again when the process exits: its end, status ``ok`` or ``failed`` (the exception's
type and message) and CPU seconds (this process and its reaped children). While the job
runs, a daemon thread touches the file every ``BEAT_S`` seconds, so a job killed with
SIGKILL, which can write nothing, leaves ``running`` and an mtime within ``BEAT_S`` of
its death: the ledger reads such an account as ``killed`` (its pid gone), ending then,
unless the scheduler (Slurm) gives the end.

What it was given: the cores Snakemake reserved for it (``threads``) and its resources;
inside a Slurm job, its id, the scheduler's figures come later (``fleet.sites.slurmacct``,
read by the ledger). The start is the kernel's start of this process (psutil reads
``/proc``), so the interpreter's start and the script's imports are the job's time too.

This module imports nothing of the project but ``atomic``: every layer may note into it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from .atomic import write_text

BEAT_S = 15.0
"""Seconds between touches of a running job's account (a killed job's end is known to this)."""
ENV = "PAIRFLOW_ACCOUNTS"

_current: Account | None = None


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._=-" else "_" for c in text)[:120]


class Account:
    """This process's job account (module docstring); ``close`` is idempotent."""

    def __init__(self, folder: Path, rule: str, wildcards: dict[str, str], attempt: int, threads: int,
                 resources: dict[str, Any]) -> None:
        proc = psutil.Process()
        self.start = proc.create_time()
        self.pid = os.getpid()
        name = "-".join([rule, *(f"{k}={v}" for k, v in wildcards.items())])
        self.path = Path(folder) / f"job-{_safe(name)}-{int(self.start * 1000)}-{self.pid}.json"
        env = os.environ
        self.record: dict[str, Any] = {
            "kind": "job-account", "job": name, "rule": rule, "wildcards": dict(wildcards), "attempt": attempt,
            "pid": self.pid, "host": socket.gethostname(), "start": self.start, "start_is": "process start (kernel)",
            "end": None, "status": "running", "threads": threads, "resources": resources,
            "slurm_job": env.get("SLURM_JOB_ID"),
            "slurm": {k: env[k] for k in ("SLURM_JOB_NUM_NODES", "SLURM_CPUS_ON_NODE", "SLURM_JOB_GPUS",
                                          "SLURM_GPUS_ON_NODE", "SLURM_STEP_ID") if k in env},
            "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
            "notes": {}}
        self._error: tuple[str, str] | None = None
        self._closed = False
        self._stop = threading.Event()
        self._write()

    def _write(self) -> None:
        with contextlib.suppress(OSError):  # an account must never fail the job it describes
            write_text(self.path, json.dumps(self.record, indent=1, sort_keys=True) + "\n")

    def note(self, key: str, value: Any) -> None:
        """Keep ``value`` (JSON) under ``notes[key]``: what the job says about its own work."""
        self.record["notes"][key] = value
        self._write()

    def failed(self, kind: str, message: str) -> None:
        self._error = (kind, message)

    def beat(self) -> None:
        while not self._stop.wait(BEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        times = psutil.Process().cpu_times()
        self.record.update(
            end=time.time(), status="failed" if self._error else "ok",
            cpu_s={"self": times.user + times.system, "children": times.children_user + times.children_system})
        if self._error:
            self.record["error"] = {"type": self._error[0], "message": self._error[1][:2000]}
        self._write()


def open_account(folder: Path | str | None, rule: str, wildcards: dict[str, str], attempt: int = 1,
                 threads: int = 1, resources: dict[str, Any] | None = None) -> Account:
    """Open this process's job account in ``folder`` (``PAIRFLOW_ACCOUNTS`` first), closed
    at exit; an uncaught exception marks it failed. Returns it (also ``current()``)."""
    global _current
    if _current is not None:
        return _current
    where = Path(os.environ.get(ENV) or folder or "accounts")
    account = Account(where, rule, wildcards, attempt, threads, dict(resources or {}))
    _current = account
    threading.Thread(target=account.beat, name="pairflow-account", daemon=True).start()
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        account.failed(kind.__name__, str(exc))
        previous(kind, exc, tb)

    sys.excepthook = hook
    atexit.register(account.close)
    return account


def current() -> Account | None:
    """This process's job account, if a rule script opened one."""
    return _current


def note(key: str, value: Any) -> None:
    """``Account.note`` on this process's account; nothing outside a job."""
    if _current is not None:
        _current.note(key, value)


def failed(kind: str, message: str) -> None:
    """Mark this process's account failed: for a job that ends with a non-zero exit status
    without an uncaught exception (``sys.exit(3)`` after a logged refusal)."""
    if _current is not None:
        _current.failed(kind, message)
