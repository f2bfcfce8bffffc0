"""``--executor pairflow-slurm``: snakemake-executor-plugin-slurm with a bound on the wait
between status checks, so Snakemake notices a finished Slurm job within seconds.

The slurm plugin (2.8) decides that wait itself: it starts at
``init_seconds_before_status_checks``, grows by 10 s after every squeue/sacct call that
finds no job finished (to at most 180 s, hard-coded) and falls back to the start value when
one has. A panel job that ends while others keep running is therefore noticed 35-65 s
late (measured on the CI cluster), and its dependants wait that long; no setting of the
plugin bounds it. This plugin is that plugin with one change: every wait it asks for is
clamped to ``--pairflow-slurm-max-seconds-between-status-checks`` (default 5 s).

Why 5 s: each check is one squeue (or sacct) call for all of the run's jobs, and a
PairFlow workflow's Slurm jobs each take minutes, so one call per 5 s is a negligible
load on the controller and bounds the notice lag at 5 s plus one call. On a busy cluster
whose admins ask for fewer calls, raise it (the stock plugin's behaviour is
``--executor slurm``).

Every other setting is the slurm plugin's own, under this plugin's prefix:
``--slurm-status-command`` is ``--pairflow-slurm-status-command`` and so on. Jobs still
run inside their allocation through ``--executor slurm-jobstep`` (the slurm plugin's job
command, unchanged). Snakemake finds this plugin the way it finds any executor plugin: a
top-level package named ``snakemake_executor_plugin_<name>`` on ``sys.path`` (installed
with ``pairflow``, from ``workflow/``).

It also keeps the ledger's record of every Slurm job it submits (``fleet.sites.slurmacct``):
``<accounts>/slurm-<jobid>.json`` when the job is submitted, and again with Snakemake's
outcome and the scheduler's own figures (state, start, end, elapsed, GPUs and CPUs held)
when Snakemake notices its end. ``<accounts>`` is ``PAIRFLOW_ACCOUNTS`` (set by
``common.smk``); unset, nothing is written. A record that cannot be written is a warning:
bookkeeping never fails a run.
"""

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snakemake_executor_plugin_slurm import Executor as SlurmExecutor
from snakemake_executor_plugin_slurm import ExecutorSettings as SlurmExecutorSettings
from snakemake_executor_plugin_slurm import common_settings

from pairflow.errors import ConfigError
from pairflow.fleet.sites import slurmacct

__all__ = ["ACCOUNTS_ENV", "DEFAULT_MAX_SECONDS", "Executor", "ExecutorSettings", "capped", "common_settings",
           "submission_of"]

DEFAULT_MAX_SECONDS = 5
ACCOUNTS_ENV = "PAIRFLOW_ACCOUNTS"
"""The folder of job records (``<scratch>/accounts``, absolute), set by ``common.smk``."""


@dataclass
class ExecutorSettings(SlurmExecutorSettings):  # type: ignore[misc]  # the slurm plugin is untyped
    """The slurm plugin's settings, plus the bound on the wait between status checks."""

    max_seconds_between_status_checks: int = field(
        default=DEFAULT_MAX_SECONDS,
        metadata={
            "help": "The longest wait (s) between two status checks (squeue/sacct) of the "
            "run's Slurm jobs, so a finished job is noticed within it. Each check is one "
            f"call for all jobs; raise it on a busy cluster. Default: {DEFAULT_MAX_SECONDS}.",
            "env_var": False,
            "required": False,
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        value = self.max_seconds_between_status_checks
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(
                f"pairflow-slurm-max-seconds-between-status-checks is {value!r} (from the Snakemake "
                "profile or command line); it must be a whole number of seconds >= 1: set it to "
                f"{DEFAULT_MAX_SECONDS}, or more on a busy cluster")


def capped(value: float | None, bound: float) -> float | None:
    """A wait the slurm plugin asks for, clamped to ``bound`` (None: not yet set)."""
    return None if value is None else min(value, bound)


def submission_of(slurm_job: str, job: Any) -> dict[str, Any]:
    """The ``slurmacct.submission`` record of Snakemake job ``job`` submitted as Slurm job
    ``slurm_job``. A group job is its rules joined by ``+``, no wildcards and no Snakemake
    job id of its own (its id is a uuid), and each member under ``group``."""
    if job.is_group():
        members = sorted(job.jobs, key=lambda j: (j.rule.name, j.jobid))
        return slurmacct.submission(
            slurm_job, "+".join(sorted({j.rule.name for j in members})), {}, job.attempt, None,
            group={"id": str(job.groupid),
                   "jobs": [{"rule": j.rule.name, "wildcards": _wildcards(j), "snakemake_jobid": j.jobid}
                            for j in members]})
    return slurmacct.submission(slurm_job, job.rule.name, _wildcards(job), job.attempt, job.jobid)


def _wildcards(job: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in job.wildcards.items()}


class Executor(SlurmExecutor):  # type: ignore[misc]  # the slurm plugin is untyped
    """The slurm plugin's executor, whose wait between status checks never exceeds the bound, and
    which records every Slurm job it submits (module docstring)."""

    @property
    def max_seconds_between_status_checks(self) -> float:
        return float(self.workflow.executor_settings.max_seconds_between_status_checks)

    @property
    def next_seconds_between_status_checks(self) -> float | None:
        # The interface falls back to --seconds-between-status-checks before the first set.
        value: float | None = SlurmExecutor.next_seconds_between_status_checks.fget(self)
        return capped(value, self.max_seconds_between_status_checks)

    @next_seconds_between_status_checks.setter
    def next_seconds_between_status_checks(self, value: float | None) -> None:
        # The plugin adds 10 s to what it reads back; storing the clamped value keeps that
        # sum from creeping past the bound.
        SlurmExecutor.next_seconds_between_status_checks.fset(
            self, capped(value, self.max_seconds_between_status_checks))

    def _accounts(self, job_info: Any) -> Path | None:
        """Where this job's record goes; None when records are off (no ``PAIRFLOW_ACCOUNTS``)
        or nothing reached Slurm (a submission that failed has no Slurm id)."""
        folder = os.environ.get(ACCOUNTS_ENV)
        return Path(folder) if folder and job_info.external_jobid else None

    def _note(self, job_info: Any, outcome: str | None) -> None:
        """Write the job's record (``outcome`` None: its submission); a failure is a warning."""
        folder = self._accounts(job_info)
        if folder is None:
            return
        try:
            record = submission_of(str(job_info.external_jobid), job_info.job)
            if outcome is None:
                slurmacct.write_submission(folder, record)
            else:
                slurmacct.record_outcome(folder, record, outcome, settle_s=2.0)  # the ledger re-reads one not yet ended
        # Any error at all: the record is the ledger's, and the run must not fail for it.
        except Exception as e:
            self.logger.warning(f"PairFlow could not write the record of Slurm job {job_info.external_jobid} "
                                f"in {folder} ({type(e).__name__}: {e}); the ledger will lack this job's "
                                "scheduler figures")

    def report_job_submission(self, job_info: Any, register_job: bool = True) -> None:
        super().report_job_submission(job_info, register_job=register_job)
        self._note(job_info, None)

    def report_job_success(self, job_info: Any) -> None:
        super().report_job_success(job_info)
        self._note(job_info, "success")

    def report_job_error(self, job_info: Any, msg: str | None = None, **kwargs: Any) -> None:
        super().report_job_error(job_info, msg=msg, **kwargs)
        self._note(job_info, "error")
