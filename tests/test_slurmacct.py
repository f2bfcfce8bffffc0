"""slurmacct: the scheduler's figures for a Slurm job, parsed from text captured on the CI
cluster (Slurm 22.05, no accounting database: ``scontrol show job -d -o``) and from sacct
text written by hand in its documented ``-P`` format; a real 2-GPU and a 2-node job on the
cluster (slow); the submission records, written atomically."""

from __future__ import annotations

import calendar
import json
import logging
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import slurm_env

from pairflow.fleet.sites import slurmacct

KEYS = {"source", "job_id", "state", "terminal", "exit_code", "submit", "start", "end", "elapsed_s", "nodes",
        "node_list", "cpus", "gpus", "tres", "read_at"}

# Captured on the CI cluster (bash .ci/slurm-up: pf-node1, pf-node2, 8 CPUs and gpu:2 each),
# TZ=UTC, with scontrol show job -d -o ID after:
#   114 sbatch --gres=gpu:2 --cpus-per-task=2 --wrap 'sleep 3'
#   115 sbatch --exclusive --gpus=1 --wrap 'sleep 3'   (holds both of the node's GPUs: JOB_GRES=gpu:2)
#   116 sbatch --wrap 'exit 3'
#   117 sbatch --nodes 2 --gres=gpu:2 --wrap 'sleep 3' (JOB_GRES is the job's total: gpu:4)
#   118 sbatch --gres=gpu:1 --wrap 'sleep 300', scancel while pending
#   119 sbatch --exclusive --gres=gpu:1 --wrap 'sleep 3'
#   120 sbatch --time=5 --gres=gpu:1 --wrap 'sleep 30', read running, then scancel
#   121 sbatch --nodes 2 --gres=gpu:2 --wrap 'sleep 30', read while pending

GPU2_COMPLETED = """JobId=114 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901646 Nice=0 Account=(null) QOS=(null) JobState=COMPLETED Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 DerivedExitCode=0:0 RunTime=00:00:03 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-12-04T19:53:00 EligibleTime=2026-12-04T19:53:00 AccrueTime=2026-12-04T19:53:00 StartTime=2026-12-04T19:53:00 EndTime=2026-12-04T19:53:03 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-04T19:53:00 Scheduler=Main Partition=ci AllocNode:Sid=localhost:6706 ReqNodeList=(null) ExcNodeList=(null) NodeList=pf-node1 BatchHost=pf-node1 NumNodes=1 NumCPUs=2 NumTasks=1 CPUs/Task=2 ReqB:S:C:T=0:0:*:* TRES=cpu=2,node=1,billing=2 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=gpu:2   Nodes=pf-node1 CPU_IDs=0-1 Mem=0 GRES= MinCPUsNode=2 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/capt StdErr=/dev/null StdIn=/dev/null StdOut=/dev/null Power= TresPerNode=gres:gpu:2"""

EXCLUSIVE_GPUS1_COMPLETED = """JobId=115 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901645 Nice=0 Account=(null) QOS=(null) JobState=COMPLETED Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 DerivedExitCode=0:0 RunTime=00:00:03 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-12-04T19:53:00 EligibleTime=2026-12-04T19:53:00 AccrueTime=2026-12-04T19:53:00 StartTime=2026-12-04T19:53:00 EndTime=2026-12-04T19:53:03 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-04T19:53:00 Scheduler=Main Partition=ci AllocNode:Sid=localhost:6706 ReqNodeList=(null) ExcNodeList=(null) NodeList=pf-node2 BatchHost=pf-node2 NumNodes=1 NumCPUs=8 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=8,node=1,billing=8 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=gpu:2   Nodes=pf-node2 CPU_IDs=0-7 Mem=0 GRES= MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=NO Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/capt StdErr=/dev/null StdIn=/dev/null StdOut=/dev/null Power= TresPerJob=gres:gpu:1"""

EXIT3_FAILED = """JobId=116 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901644 Nice=0 Account=(null) QOS=(null) JobState=FAILED Reason=NonZeroExitCode Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=3:0 DerivedExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-12-04T19:53:00 EligibleTime=2026-12-04T19:53:00 AccrueTime=2026-12-04T19:53:00 StartTime=2026-12-04T19:53:00 EndTime=2026-12-04T19:53:00 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-04T19:53:00 Scheduler=Main Partition=ci AllocNode:Sid=localhost:6706 ReqNodeList=(null) ExcNodeList=(null) NodeList=pf-node1 BatchHost=pf-node1 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=(null)   Nodes=pf-node1 CPU_IDs=2 Mem=0 GRES= MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/capt StdErr=/dev/null StdIn=/dev/null StdOut=/dev/null Power="""

TWO_NODES_COMPLETED = """JobId=117 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901643 Nice=0 Account=(null) QOS=(null) JobState=COMPLETED Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 DerivedExitCode=0:0 RunTime=00:00:03 TimeLimit=365-00:00:00 TimeMin=N/A SubmitTime=2026-12-04T19:53:00 EligibleTime=2026-12-04T19:53:00 AccrueTime=2026-12-04T19:53:00 StartTime=2026-12-04T19:53:04 EndTime=2026-12-04T19:53:07 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-04T19:53:04 Scheduler=Backfill Partition=ci AllocNode:Sid=localhost:6706 ReqNodeList=(null) ExcNodeList=(null) NodeList=pf-node[1-2] BatchHost=pf-node1 NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=2,node=2,billing=2 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=gpu:4   Nodes=pf-node[1-2] CPU_IDs=0 Mem=0 GRES= MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/capt StdErr=/dev/null StdIn=/dev/null StdOut=/dev/null Power= TresPerNode=gres:gpu:2"""

CANCELLED_PENDING = """JobId=118 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901642 Nice=0 Account=(null) QOS=(null) JobState=CANCELLED Reason=Resources Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 DerivedExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-12-04T19:53:00 EligibleTime=2026-12-04T19:53:00 AccrueTime=2026-12-04T19:53:00 StartTime=2026-12-04T19:53:07 EndTime=2026-12-04T19:53:07 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-04T19:53:06 Scheduler=Main Partition=ci AllocNode:Sid=localhost:6706 ReqNodeList=(null) ExcNodeList=(null) NodeList= NumNodes=1 NumCPUs=1 NumTasks=N/A CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=62.50G,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/capt StdErr=/dev/null StdIn=/dev/null StdOut=/dev/null Power= TresPerNode=gres:gpu:1"""

EXCLUSIVE_GRES1_COMPLETED = """JobId=119 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901641 Nice=0 Account=(null) QOS=(null) JobState=COMPLETED Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 DerivedExitCode=0:0 RunTime=00:00:03 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-12-04T19:53:00 EligibleTime=2026-12-04T19:53:00 AccrueTime=2026-12-04T19:53:00 StartTime=2026-12-04T19:53:09 EndTime=2026-12-04T19:53:12 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-04T19:53:09 Scheduler=Main Partition=ci AllocNode:Sid=localhost:6706 ReqNodeList=(null) ExcNodeList=(null) NodeList=pf-node1 BatchHost=pf-node1 NumNodes=1 NumCPUs=8 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=8,node=1,billing=8 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=gpu:2   Nodes=pf-node1 CPU_IDs=0-7 Mem=0 GRES= MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=NO Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/capt StdErr=/dev/null StdIn=/dev/null StdOut=/dev/null Power= TresPerNode=gres:gpu:1"""

CANCELLED_RUNNING = """JobId=120 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901640 Nice=0 Account=(null) QOS=(null) JobState=CANCELLED Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:15 DerivedExitCode=0:0 RunTime=00:00:03 TimeLimit=00:05:00 TimeMin=N/A SubmitTime=2026-12-04T19:53:29 EligibleTime=2026-12-04T19:53:29 AccrueTime=2026-12-04T19:53:29 StartTime=2026-12-04T19:53:29 EndTime=2026-12-04T19:53:32 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-04T19:53:29 Scheduler=Main Partition=ci AllocNode:Sid=localhost:6706 ReqNodeList=(null) ExcNodeList=(null) NodeList=pf-node1 BatchHost=pf-node1 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=gpu:1   Nodes=pf-node1 CPU_IDs=0 Mem=0 GRES= MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/capt StdErr=/dev/null StdIn=/dev/null StdOut=/dev/null Power= TresPerNode=gres:gpu:1"""

GPU1_RUNNING = """JobId=120 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901640 Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 DerivedExitCode=0:0 RunTime=00:00:03 TimeLimit=00:05:00 TimeMin=N/A SubmitTime=2026-12-04T19:53:29 EligibleTime=2026-12-04T19:53:29 AccrueTime=2026-12-04T19:53:29 StartTime=2026-12-04T19:53:29 EndTime=2026-12-04T19:58:29 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-04T19:53:29 Scheduler=Main Partition=ci AllocNode:Sid=localhost:6706 ReqNodeList=(null) ExcNodeList=(null) NodeList=pf-node1 BatchHost=pf-node1 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=gpu:1   Nodes=pf-node1 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:0) MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/capt StdErr=/dev/null StdIn=/dev/null StdOut=/dev/null Power= TresPerNode=gres:gpu:1"""

TWO_NODES_PENDING = """JobId=121 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901639 Nice=0 Account=(null) QOS=(null) JobState=PENDING Reason=Resources Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 DerivedExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-12-04T19:53:29 EligibleTime=2026-12-04T19:53:29 AccrueTime=2026-12-04T19:53:29 StartTime=Unknown EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-04T19:53:29 Scheduler=Main Partition=ci AllocNode:Sid=localhost:6706 ReqNodeList=(null) ExcNodeList=(null) NodeList= NumNodes=2-2 NumCPUs=2 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=2,mem=125G,node=2,billing=2 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/capt StdErr=/dev/null StdIn=/dev/null StdOut=/dev/null Power= TresPerNode=gres:gpu:2"""

EXCLUSIVE_GRES1_RUNNING = """JobId=119 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901641 Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 DerivedExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-12-04T19:53:00 EligibleTime=2026-12-04T19:53:00 AccrueTime=2026-12-04T19:53:00 StartTime=2026-12-04T19:53:09 EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-04T19:53:09 Scheduler=Main Partition=ci AllocNode:Sid=localhost:6706 ReqNodeList=(null) ExcNodeList=(null) NodeList=pf-node1 BatchHost=pf-node1 NumNodes=1 NumCPUs=8 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=8,node=1,billing=8 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=gpu:2   Nodes=pf-node1 CPU_IDs=0-7 Mem=0 GRES=gpu:2(IDX:0-1) MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=NO Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/capt StdErr=/dev/null StdIn=/dev/null StdOut=/dev/null Power= TresPerNode=gres:gpu:1"""


def _utc(text: str) -> float:
    return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%S")))


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The captures' time zone (Slurm printed them in the cluster's local time, UTC)."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_a_two_gpu_job_s_figures(utc: None) -> None:
    job = slurmacct.parse_scontrol(GPU2_COMPLETED)
    assert job is not None and set(job) == KEYS
    assert job["source"] == "scontrol" and job["job_id"] == "114"
    assert (job["state"], job["terminal"], job["exit_code"]) == ("COMPLETED", True, "0:0")
    assert (job["submit"], job["start"], job["end"]) == (_utc("2026-12-04T19:53:00"), _utc("2026-12-04T19:53:00"),
                                                       _utc("2026-12-04T19:53:03"))
    assert job["elapsed_s"] == 3.0 == job["end"] - job["start"]
    assert (job["nodes"], job["node_list"], job["cpus"], job["gpus"]) == (1, "pf-node1", 2, 2)
    assert job["tres"] == "cpu=2,node=1,billing=2"  # no gres/gpu: AccountingStorageTRES lacks it here


def test_an_exclusive_one_gpu_job_holds_the_node_s_every_gpu(utc: None) -> None:
    for text in (EXCLUSIVE_GPUS1_COMPLETED, EXCLUSIVE_GRES1_COMPLETED, EXCLUSIVE_GRES1_RUNNING):
        job = slurmacct.parse_scontrol(text)
        assert job is not None
        assert (job["gpus"], job["cpus"]) == (2, 8), text[:10]  # asked for 1 GPU; JOB_GRES=gpu:2


def test_a_two_node_job_holds_the_gpus_of_both_nodes(utc: None) -> None:
    job = slurmacct.parse_scontrol(TWO_NODES_COMPLETED)
    assert job is not None
    assert (job["nodes"], job["node_list"], job["gpus"], job["cpus"]) == (2, "pf-node[1-2]", 4, 2)
    assert job["elapsed_s"] == 3.0 == job["end"] - job["start"]


def test_a_failed_job_keeps_its_exit_code(utc: None) -> None:
    job = slurmacct.parse_scontrol(EXIT3_FAILED)
    assert job is not None
    assert (job["state"], job["terminal"], job["exit_code"], job["gpus"], job["cpus"]) == ("FAILED", True, "3:0", 0, 1)
    assert job["elapsed_s"] == 0.0


def test_cancelled_jobs(utc: None) -> None:
    running = slurmacct.parse_scontrol(CANCELLED_RUNNING)
    assert running is not None
    assert (running["state"], running["terminal"], running["exit_code"]) == ("CANCELLED", True, "0:15")
    assert (running["gpus"], running["elapsed_s"], running["end"] - running["start"]) == (1, 3.0, 3.0)
    pending = slurmacct.parse_scontrol(CANCELLED_PENDING)  # never given a node: held nothing
    assert pending is not None
    assert (pending["state"], pending["terminal"]) == ("CANCELLED", True)
    assert (pending["nodes"], pending["node_list"], pending["cpus"], pending["gpus"], pending["elapsed_s"],
            pending["tres"]) == (0, "", 0, 0, 0.0, "")


def test_a_running_job_has_no_end_yet(utc: None) -> None:
    job = slurmacct.parse_scontrol(GPU1_RUNNING)
    assert job is not None
    assert (job["state"], job["terminal"], job["end"]) == ("RUNNING", False, None)  # EndTime is its time limit
    assert (job["start"], job["elapsed_s"], job["gpus"]) == (_utc("2026-12-04T19:53:29"), 3.0, 1)
    pending = slurmacct.parse_scontrol(TWO_NODES_PENDING)
    assert pending is not None
    assert (pending["state"], pending["terminal"], pending["start"], pending["end"], pending["gpus"]) == (
        "PENDING", False, None, None, 0)


def test_the_per_node_detail_counts_gpus_when_job_gres_is_absent() -> None:
    text = EXCLUSIVE_GRES1_RUNNING.replace("JOB_GRES=gpu:2", "").replace("Nodes=pf-node1 ", "Nodes=pf-node[1-2] ")
    job = slurmacct.parse_scontrol(text, lambda hostlist: 2 if hostlist == "pf-node[1-2]" else 1)
    assert job is not None and job["gpus"] == 4
    bare = slurmacct.parse_scontrol(GPU2_COMPLETED.replace("JOB_GRES=gpu:2", ""))  # GRES= blank once ended
    assert bare is not None and bare["gpus"] == 2  # TresPerNode=gres:gpu:2 x 1 node


def test_newer_slurm_s_alloc_tres_is_read_first() -> None:
    text = GPU2_COMPLETED.replace("TRES=cpu=2,node=1,billing=2",
                                  "ReqTRES=cpu=2,node=1,billing=2,gres/gpu=2 "
                                  "AllocTRES=cpu=4,mem=8000M,node=1,billing=4,gres/gpu:h100=3,gres/gpu=3")
    job = slurmacct.parse_scontrol(text)
    assert job is not None and (job["cpus"], job["gpus"]) == (4, 3)
    assert job["tres"] == "cpu=4,mem=8000M,node=1,billing=4,gres/gpu:h100=3,gres/gpu=3"


def test_no_job_in_the_text() -> None:
    assert slurmacct.parse_scontrol("") is None
    assert slurmacct.parse_scontrol("slurm_load_jobs error: Invalid job id specified") is None


@pytest.mark.parametrize(("text", "seconds"), [("1-02:03:04", 93784), ("02:03:04", 7384), ("03:04", 184),
                                               ("00:00:00", 0), ("17", 17), ("12-00:00:00", 1036800)])
def test_runtime_forms(text: str, seconds: int) -> None:
    assert slurmacct.parse_runtime(text) == seconds


@pytest.mark.parametrize("text", ["", "INVALID", "UNLIMITED", "1:2:3:4"])
def test_runtime_that_does_not_parse(text: str) -> None:
    assert slurmacct.parse_runtime(text) is None


def test_times_are_read_in_local_time(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        monkeypatch.setenv("TZ", "Europe/Berlin")
        time.tzset()
        assert slurmacct.parse_time("2026-12-04T19:53:00") == _utc("2026-12-04T18:53:00")
        assert slurmacct.parse_time("2026-07-04T19:53:00") == _utc("2026-07-04T17:53:00")  # summer time
    finally:
        monkeypatch.undo()
        time.tzset()
    for unset in ("Unknown", "None", "", "N/A"):
        assert slurmacct.parse_time(unset) is None


def test_tres_and_gres_gpu_counts() -> None:
    tres = slurmacct.parse_tres("billing=8,cpu=8,gres/gpu:a100=2,gres/gpu=2,mem=64G,node=1")
    assert tres["cpu"] == "8" and slurmacct.tres_gpus(tres) == 2  # the untyped total, not 2 + 2
    assert slurmacct.tres_gpus(slurmacct.parse_tres("cpu=1,gres/gpu:a100=2,gres/gpu:v100=1")) == 3
    assert slurmacct.tres_gpus(slurmacct.parse_tres("cpu=8,node=1,billing=8")) is None
    assert slurmacct.parse_tres("(null)") == {}
    for text, n in [("gpu:2", 2), ("gpu:a100:4", 4), ("gres:gpu:1", 1), ("gres/gpu:2", 2), ("gres/gpu=3", 3),
                    ("gpu:2(IDX:0-1)", 2), ("gpu:a100:2(IDX:0,2),shard:4", 2), ("gpu", 1),
                    ("gpu:a100:1,gpu:v100:2", 3), ("gres/gpu=2,gres/gpu:a100=2", 2)]:
        assert slurmacct.gres_gpus(text) == n, text
    for text in ("(null)", "", "shard:4", "mps:100"):
        assert slurmacct.gres_gpus(text) is None, text


def test_base_state_strips_slurm_s_decorations() -> None:
    assert slurmacct.base_state("CANCELLED by 0") == "CANCELLED"
    assert slurmacct.base_state("CANCELLED by 1000") == "CANCELLED"
    assert slurmacct.base_state("COMPLETED+") == "COMPLETED"
    assert slurmacct.base_state("TIMEOUT") == "TIMEOUT"


# sacct -j ID -X -n -P --format=JobID,State,ExitCode,Start,End,ElapsedRaw,AllocTRES,NNodes,NodeList,Submit,
# as Slurm documents it (no accounting database here to capture from): '|'-separated, no header,
# AllocTRES sorted by TRES id, a typed gres/gpu beside the untyped total.
SACCT = """\
114|COMPLETED|0:0|2026-12-04T19:53:00|2026-12-04T19:53:03|3|billing=2,cpu=2,gres/gpu=2,mem=0,node=1|1|pf-node1|2026-12-04T19:53:00
130|CANCELLED by 0|0:15|2026-12-04T20:00:00|2026-12-04T20:10:00|600|billing=16,cpu=16,gres/gpu:h100=4,gres/gpu=4,mem=128G,node=2|2|gpu[01-02]|2026-12-04T19:59:30
131|TIMEOUT|0:0|2026-12-04T20:00:00|2026-12-04T21:00:05|3605|billing=8,cpu=8,gres/gpu:a100=1,mem=32G,node=1|1|gpu03|2026-12-04T19:00:00
132|RUNNING|0:0|2026-12-04T20:00:00|Unknown|42|billing=4,cpu=4,gres/gpu=1,node=1|1|gpu04|2026-12-04T20:00:00
133|PENDING|0:0|Unknown|Unknown|0||2|None assigned|2026-12-04T20:00:00
134|CANCELLED by 1000|0:0|2026-12-04T20:01:00|2026-12-04T20:01:00|0||1|None assigned|2026-12-04T20:00:00
123_4|FAILED|3:0|2026-12-04T20:00:00|2026-12-04T20:00:09|9|billing=1,cpu=1,node=1|1|gpu05|2026-12-04T20:00:00
"""


def test_sacct_rows(utc: None) -> None:
    first = slurmacct.parse_sacct(SACCT)
    assert first is not None and set(first) == KEYS and first["source"] == "sacct"
    assert (first["job_id"], first["state"], first["gpus"], first["cpus"], first["elapsed_s"]) == (
        "114", "COMPLETED", 2, 2, 3.0)
    assert first["end"] - first["start"] == first["elapsed_s"]
    cancelled = slurmacct.parse_sacct(SACCT, "130")
    assert cancelled is not None
    assert (cancelled["state"], cancelled["terminal"], cancelled["gpus"], cancelled["cpus"], cancelled["nodes"],
            cancelled["node_list"], cancelled["elapsed_s"]) == ("CANCELLED", True, 4, 16, 2, "gpu[01-02]", 600.0)
    timeout = slurmacct.parse_sacct(SACCT, "131")
    assert timeout is not None and (timeout["state"], timeout["gpus"], timeout["terminal"]) == ("TIMEOUT", 1, True)
    running = slurmacct.parse_sacct(SACCT, "132")
    assert running is not None and (running["terminal"], running["end"], running["elapsed_s"]) == (False, None, 42.0)
    for never in ("133", "134"):
        job = slurmacct.parse_sacct(SACCT, never)
        assert job is not None and (job["nodes"], job["cpus"], job["gpus"], job["node_list"]) == (0, 0, 0, "")
    assert slurmacct.parse_sacct(SACCT, "134")["state"] == "CANCELLED"  # type: ignore[index]
    array = slurmacct.parse_sacct(SACCT, "123_4")
    assert array is not None and (array["state"], array["exit_code"], array["gpus"]) == ("FAILED", "3:0", 0)
    assert slurmacct.parse_sacct(SACCT, "999") is None
    assert slurmacct.parse_sacct("") is None


def _fake(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\nPATH=/bin:/usr/bin\n{script}\n")
    path.chmod(0o755)


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH holding only the fake Slurm commands a test writes."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", str(folder))
    return folder


def test_without_accounting_scontrol_answers(bin_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "job.txt").write_text(GPU2_COMPLETED + "\n")
    _fake(bin_dir, "sacct", "echo 'Slurm accounting storage is disabled' >&2; exit 1")
    _fake(bin_dir, "scontrol", f'[ "$*" = "show job -d -o 114" ] && cat {tmp_path / "job.txt"}')
    job = slurmacct.scheduler_job("114")
    assert job is not None and (job["source"], job["gpus"], job["state"]) == ("scontrol", 2, "COMPLETED")


def test_sacct_answers_first(bin_dir: Path) -> None:
    _fake(bin_dir, "sacct", f"printf '%s\\n' '{SACCT.splitlines()[1]}'")
    job = slurmacct.scheduler_job("130")
    assert job is not None and (job["source"], job["gpus"], job["state"]) == ("sacct", 4, "CANCELLED")


def test_sacct_with_no_row_falls_back_to_scontrol(bin_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "job.txt").write_text(TWO_NODES_COMPLETED + "\n")
    _fake(bin_dir, "sacct", "exit 0")  # the database has not got the job yet
    _fake(bin_dir, "scontrol", f"cat {tmp_path / 'job.txt'}")
    job = slurmacct.scheduler_job("117")
    assert job is not None and (job["source"], job["gpus"]) == ("scontrol", 4)


def test_a_job_slurm_no_longer_knows_is_none(bin_dir: Path) -> None:
    _fake(bin_dir, "sacct", "echo 'Slurm accounting storage is disabled' >&2; exit 1")
    _fake(bin_dir, "scontrol", "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1")
    assert slurmacct.scheduler_job("42") is None


def test_a_scheduler_hiccup_is_a_warning_and_none(bin_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    _fake(bin_dir, "scontrol", "echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2; exit 1")
    with caplog.at_level(logging.WARNING, logger=slurmacct.__name__):
        assert slurmacct.scheduler_job("42") is None
    assert "Unable to contact slurm controller" in caplog.text
    caplog.clear()
    _fake(bin_dir, "scontrol", "exec sleep 5")
    with caplog.at_level(logging.WARNING, logger=slurmacct.__name__):
        assert slurmacct.scheduler_job("42", timeout_s=0.3) is None
    assert "did not answer" in caplog.text


def test_no_slurm_commands_is_none(bin_dir: Path) -> None:
    assert slurmacct.scheduler_job("42") is None


def _scheduler(state: str, terminal: bool) -> dict[str, Any]:
    return {"source": "scontrol", "job_id": "77", "state": state, "terminal": terminal, "gpus": 2}


def test_submission_then_outcome_records(tmp_path: Path) -> None:
    accounts = tmp_path / "accounts"
    record = slurmacct.submission("77", "generate_score_panel", {"panel": "p1"}, 2, 14, submitted=100.0)
    path = slurmacct.write_submission(accounts, record)
    assert path == accounts / "slurm-77.json"
    assert json.loads(path.read_text()) == {
        "kind": "slurm-job", "slurm_job": "77", "rule": "generate_score_panel", "wildcards": {"panel": "p1"},
        "attempt": 2, "snakemake_jobid": 14, "submitted": 100.0, "outcome": None, "noticed": None,
        "scheduler": None}
    later = slurmacct.submission("77", "other", {}, 1, None)  # the record on disk wins over the fallback
    slurmacct.record_outcome(accounts, later, "success", noticed=200.0,
                             read=lambda job: _scheduler("COMPLETED", True))
    done = json.loads(path.read_text())
    assert (done["rule"], done["submitted"], done["outcome"], done["noticed"]) == ("generate_score_panel", 100.0,
                                                                                   "success", 200.0)
    assert done["scheduler"] == _scheduler("COMPLETED", True)
    assert [p.name for p in accounts.iterdir()] == ["slurm-77.json"]  # no temp left behind


def test_an_outcome_without_a_submission_record_is_written_from_the_fallback(tmp_path: Path) -> None:
    record = slurmacct.submission("78", "panel", {"panel": "p2"}, 1, 3, submitted=50.0)
    path = slurmacct.record_outcome(tmp_path, record, "error", read=lambda job: None)
    assert json.loads(path.read_text()) | {"noticed": 0} == {**record, "outcome": "error", "noticed": 0,
                                                              "scheduler": None}


def test_an_unreadable_record_is_written_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "slurm-79.json").write_text("{half")
    record = slurmacct.submission("79", "panel", {}, 1, 3)
    with caplog.at_level(logging.WARNING, logger=slurmacct.__name__):
        path = slurmacct.record_outcome(tmp_path, record, "success", read=lambda job: None)
    assert "unreadable" in caplog.text
    assert json.loads(path.read_text())["outcome"] == "success"


def test_outcome_waits_for_slurm_to_call_the_job_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr(slurmacct.time, "sleep", sleeps.append)
    answers = iter([_scheduler("COMPLETING", False), _scheduler("COMPLETING", False), _scheduler("COMPLETED", True)])
    assert slurmacct.settled("77", read=lambda job: next(answers))["state"] == "COMPLETED"  # type: ignore[index]
    assert sleeps == [0.5, 1.0]
    sleeps.clear()  # still running after the settling time: what it said last
    assert slurmacct.settled("77", read=lambda job: _scheduler("RUNNING", False))["state"] == "RUNNING"  # type: ignore[index]
    assert sleeps == [0.5, 1.0, 2.0, 4.0, 2.5]  # 10 s in all
    sleeps.clear()
    assert slurmacct.settled("77", read=lambda job: None) is None and sleeps == []


# --- on the CI cluster ----------------------------------------------------------------------



def _sbatch(tmp_path: Path, *args: str) -> str:
    env = slurm_env()
    run = subprocess.run(["sbatch", "--parsable", "--wait", f"--output={tmp_path}/slurm-%j.out", *args,
                          "--wrap", "sleep 2"], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip().split(";")[0]


@pytest.mark.slow
@pytest.mark.parametrize(("args", "nodes", "gpus"), [(("--gres=gpu:2", "--cpus-per-task=2"), 1, 2),
                                                     (("--nodes=2", "--gres=gpu:2"), 2, 4)])
def test_a_real_job_s_figures(slurm: None, tmp_path: Path, args: tuple[str, ...], nodes: int, gpus: int) -> None:
    job_id = _sbatch(tmp_path, *args)
    job = slurmacct.settled(job_id)
    assert job is not None and set(job) == KEYS
    assert (job["job_id"], job["state"], job["terminal"], job["exit_code"]) == (job_id, "COMPLETED", True, "0:0")
    assert (job["nodes"], job["gpus"]) == (nodes, gpus)
    assert job["elapsed_s"] >= 2 and job["end"] - job["start"] == job["elapsed_s"]
    assert job["submit"] <= job["start"] <= job["end"] <= job["read_at"]
