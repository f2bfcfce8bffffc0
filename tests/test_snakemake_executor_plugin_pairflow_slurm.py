"""The pairflow-slurm executor plugin: the slurm plugin with its status-check wait bounded,
writing the ledger's record of every Slurm job it submits.

The cap is checked on the real slurm plugin's code (its ``check_active_jobs`` backoff and
reset); Snakemake's own registry and CLI must find the plugin and take its settings. The
records are checked by driving the overridden reports with a stand-in job (the interface's
own reports run underneath) and a stand-in scheduler reading.
"""

import asyncio
import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import snakemake_executor_plugin_pairflow_slurm as plugin
import snakemake_executor_plugin_slurm as slurm
from conftest import ROOT, copy_project
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

from pairflow.errors import ConfigError
from pairflow.fleet.sites import slurmacct

BIN = Path(sys.executable).parent


def _executor(**settings: object) -> plugin.Executor:
    """The plugin's executor over the workflow attributes its status checks read, without
    the submission machinery (__init__ starts Snakemake's wait thread and checks Slurm)."""
    ex = plugin.Executor.__new__(plugin.Executor)
    ex.workflow = SimpleNamespace(executor_settings=plugin.ExecutorSettings(**settings),
                                  remote_execution_settings=SimpleNamespace(seconds_between_status_checks=5))
    ex.logger = logging.getLogger("test")
    ex._next_seconds_between_status_checks = None
    return ex


def test_capped_clamps_a_wait_to_the_bound() -> None:
    assert plugin.capped(45, 5) == 5
    assert plugin.capped(3, 5) == 3
    assert plugin.capped(None, 5) is None


def test_the_setter_clamps_the_slurm_plugin_s_backoff() -> None:
    ex = _executor()
    assert ex.next_seconds_between_status_checks == 5  # before any set: --seconds-between-status-checks
    for _ in range(20):  # what check_active_jobs does after each call that finds no job finished
        ex.next_seconds_between_status_checks = min(ex.next_seconds_between_status_checks + 10, 180)
        assert ex.next_seconds_between_status_checks == plugin.DEFAULT_MAX_SECONDS
    ex = _executor(max_seconds_between_status_checks=30)
    ex.next_seconds_between_status_checks = 15
    assert ex.next_seconds_between_status_checks == 15  # under the bound: unchanged
    ex.next_seconds_between_status_checks = 25 + 10
    assert ex.next_seconds_between_status_checks == 30


def test_the_slurm_plugin_s_own_reset_is_clamped_too() -> None:
    ex = _executor(init_seconds_before_status_checks=40)  # the slurm plugin's default start value

    async def check() -> list[object]:
        return [j async for j in ex.check_active_jobs([])]  # its fast path sets the start value

    assert asyncio.run(check()) == []
    assert ex._next_seconds_between_status_checks == plugin.DEFAULT_MAX_SECONDS


def test_settings_keep_every_slurm_setting() -> None:
    ours = {f.name for f in dataclasses.fields(plugin.ExecutorSettings)}
    theirs = {f.name for f in dataclasses.fields(slurm.ExecutorSettings)}
    assert ours - theirs == {"max_seconds_between_status_checks"}
    assert theirs <= ours
    assert plugin.common_settings is slurm.common_settings


@pytest.mark.parametrize("bad", [0, -5])
def test_a_bound_under_one_second_is_refused(bad: int) -> None:
    with pytest.raises(ConfigError, match=f"max-seconds-between-status-checks is {bad}.*set it to 5"):
        plugin.ExecutorSettings(max_seconds_between_status_checks=bad)


def test_snakemake_s_registry_finds_the_plugin() -> None:
    registry = ExecutorPluginRegistry()
    assert registry.get_plugin("pairflow-slurm").executor is plugin.Executor
    assert registry.get_plugin("slurm").executor is slurm.Executor  # the stock plugin stays available


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = copy_project(tmp_path_factory.mktemp("plugin") / "project")
    shutil.copytree(ROOT / "config", dest / "config")
    return dest


def _snakemake(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "workflow")}
    return subprocess.run([str(BIN / "snakemake"), *args], cwd=project, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_shipped_profile_plans_through_the_plugin(project: Path) -> None:
    run = _snakemake(project, "--profile", "profiles/slurm", "-n")
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert "generate_score_panel" in run.stdout


def test_a_bad_bound_on_the_command_line_names_the_fix(project: Path) -> None:
    run = _snakemake(project, "--executor", "pairflow-slurm", "--pairflow-slurm-max-seconds-between-status-checks",
                     "0", "-n")
    assert run.returncode != 0
    assert "pairflow-slurm-max-seconds-between-status-checks is 0" in run.stderr


# --- the Slurm job records (fleet.sites.slurmacct) the plugin writes for the ledger --------


class _Job:
    """The few attributes of a Snakemake job the hooks and the interface's reports read."""

    def __init__(self, rule: str, jobid: int, wildcards: dict[str, str], attempt: int = 1) -> None:
        self.rule = SimpleNamespace(name=rule)
        self.jobid, self.wildcards, self.attempt = jobid, wildcards, attempt
        self.registered: list[str | None] = []

    def is_group(self) -> bool:
        return False

    def register(self, external_jobid: str | None = None) -> None:
        self.registered.append(external_jobid)

    def log_error(self, msg: str | None = None, **kwargs: object) -> None:
        pass


class _Group(_Job):
    def __init__(self, jobs: list[_Job]) -> None:
        super().__init__("unused", 0, {}, attempt=2)
        self.jobs, self.groupid = jobs, "panels"

    def is_group(self) -> bool:
        return True


class _Scheduler:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def submit_callback(self, job: object) -> None:
        self.calls.append("submit")

    def finish_callback(self, job: object) -> None:
        self.calls.append("finish")

    def error_callback(self, job: object) -> None:
        self.calls.append("error")


def _reporting_executor() -> plugin.Executor:
    ex = _executor()
    ex.workflow.scheduler = _Scheduler()
    ex.lock = threading.Lock()
    ex.active_jobs = []
    return ex


def _scheduler_job(job_id: str) -> dict[str, object]:
    return {"source": "scontrol", "job_id": job_id, "state": "COMPLETED", "terminal": True, "gpus": 2}


@pytest.fixture
def accounts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "accounts"
    monkeypatch.setenv("PAIRFLOW_ACCOUNTS", str(folder))
    monkeypatch.setattr(slurmacct, "scheduler_job", _scheduler_job)  # the scheduler's reading, stood in
    return folder


def test_submission_and_success_are_recorded(accounts: Path) -> None:
    ex = _reporting_executor()
    job = _Job("generate_score_panel", 7, {"panel": "p1"}, attempt=2)
    info = SubmittedJobInfo(job, external_jobid="4321", aux={})
    ex.report_job_submission(info)
    record = json.loads((accounts / "slurm-4321.json").read_text())
    assert record | {"submitted": 0} == {
        "kind": "slurm-job", "slurm_job": "4321", "rule": "generate_score_panel", "wildcards": {"panel": "p1"},
        "attempt": 2, "snakemake_jobid": 7, "submitted": 0, "outcome": None, "noticed": None, "scheduler": None}
    assert ex.active_jobs == [info] and job.registered == ["4321"]  # the slurm plugin's own bookkeeping ran
    ex.report_job_success(info)
    done = json.loads((accounts / "slurm-4321.json").read_text())
    assert done["outcome"] == "success" and done["noticed"] >= done["submitted"] == record["submitted"]
    assert done["scheduler"] == _scheduler_job("4321")
    assert ex.workflow.scheduler.calls == ["submit", "finish"]


def test_an_error_is_recorded(accounts: Path) -> None:
    ex = _reporting_executor()
    info = SubmittedJobInfo(_Job("panel", 3, {"panel": "p2"}), external_jobid="99", aux={})
    ex.report_job_submission(info)
    ex.report_job_error(info, msg="SLURM-job '99' failed, SLURM status is: 'FAILED'", aux_logs=[])
    assert json.loads((accounts / "slurm-99.json").read_text())["outcome"] == "error"
    assert ex.workflow.scheduler.calls == ["submit", "error"]


def test_a_submission_that_never_reached_slurm_writes_nothing(accounts: Path) -> None:
    ex = _reporting_executor()
    ex.report_job_error(SubmittedJobInfo(_Job("panel", 3, {})), msg="Job submission failed")
    assert not accounts.exists()


def test_a_group_job_records_its_members(accounts: Path) -> None:
    group = _Group([_Job("score", 5, {"panel": "p1"}), _Job("generate", 4, {"panel": "p1"})])
    ex = _reporting_executor()
    ex.report_job_submission(SubmittedJobInfo(group, external_jobid="12", aux={}))
    record = json.loads((accounts / "slurm-12.json").read_text())
    assert (record["rule"], record["wildcards"], record["attempt"], record["snakemake_jobid"]) == (
        "generate+score", {}, 2, None)
    assert record["group"] == {"id": "panels", "jobs": [
        {"rule": "generate", "wildcards": {"panel": "p1"}, "snakemake_jobid": 4},
        {"rule": "score", "wildcards": {"panel": "p1"}, "snakemake_jobid": 5}]}


def test_without_pairflow_accounts_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PAIRFLOW_ACCOUNTS", raising=False)
    monkeypatch.chdir(tmp_path)
    ex = _reporting_executor()
    info = SubmittedJobInfo(_Job("panel", 1, {}), external_jobid="5", aux={})
    ex.report_job_submission(info)
    ex.report_job_success(info)
    assert list(tmp_path.iterdir()) == []
    assert ex.workflow.scheduler.calls == ["submit", "finish"]


def test_a_record_that_cannot_be_written_only_warns(accounts: Path, caplog: pytest.LogCaptureFixture) -> None:
    accounts.parent.mkdir(parents=True, exist_ok=True)
    accounts.write_text("a file where the folder should be")
    ex = _reporting_executor()
    info = SubmittedJobInfo(_Job("panel", 1, {"panel": "p1"}), external_jobid="6", aux={})
    with caplog.at_level(logging.WARNING, logger="test"):
        ex.report_job_submission(info)
        ex.report_job_success(info)
    assert caplog.text.count("could not write the record of Slurm job 6") == 2
    assert ex.workflow.scheduler.calls == ["submit", "finish"]  # Snakemake still heard of both
