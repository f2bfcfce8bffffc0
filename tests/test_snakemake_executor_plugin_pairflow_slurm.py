"""The pairflow-slurm executor plugin: the slurm plugin with its status-check wait bounded.

The cap is checked on the real slurm plugin's code (its ``check_active_jobs`` backoff and
reset); Snakemake's own registry and CLI must find the plugin and take its settings.
"""

import asyncio
import dataclasses
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import snakemake_executor_plugin_pairflow_slurm as plugin
import snakemake_executor_plugin_slurm as slurm
from conftest import ROOT, copy_project
from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

from pairflow.errors import ConfigError

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
