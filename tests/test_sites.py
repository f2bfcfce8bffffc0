"""sites: site selection, accelerator discovery, and the Parsl config each site composes.

Discovery and grants are pure functions of an environment dict (and torch's count);
one test runs them against this process's real torch. No scheduler is started: the
Slurm site's config is built from a Slurm job's environment and inspected."""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
from pathlib import Path

import pytest
import yaml
from parsl.addresses import address_by_hostname
from parsl.launchers import SingleNodeLauncher, SrunLauncher
from parsl.providers import LocalProvider

from pairflow.errors import AcceleratorError, ConfigError, SchedulerError
from pairflow.fleet import sites
from pairflow.fleet.sites.accelerators import discover, torch_device_count
from pairflow.fleet.sites.base import GPU_MAP_HOST_VAR, GPU_MAP_VAR, Grant, Packing, node_name, slot_gpu
from pairflow.fleet.sites.slurm import allocation
from pairflow.plan.config import SCHEMA_PATH, FleetSpec

ROOT = Path(__file__).resolve().parents[1]

SLURM = {"SLURM_JOB_ID": "42", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "gpu07", "SLURM_CPUS_ON_NODE": "16"}
"""A single-node Slurm job's environment (what sbatch sets), without its GPUs."""


# --- accelerator discovery ------------------------------------------------------------------

@pytest.mark.parametrize(("env", "torch_count", "visible", "physical", "source"), [
    ({}, None, (), {}, "none granted"),  # nothing granted: CPU workers
    ({}, 2, (), {}, "none granted"),  # torch sees GPUs nobody granted: still CPU (logged)
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, None, ("0", "1"), {"0": "0", "1": "1"}, "CUDA_VISIBLE_DEVICES"),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, 2, ("0", "1"), {"0": "0", "1": "1"}, "CUDA_VISIBLE_DEVICES"),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, 0, ("0", "1"), {"0": "0", "1": "1"}, "CUDA_VISIBLE_DEVICES"),  # CI's fake gres
    ({"CUDA_VISIBLE_DEVICES": "-1"}, 2, (), {}, "none granted"),
    ({"CUDA_VISIBLE_DEVICES": ""}, None, (), {}, "none granted"),
    ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, None, (), {}, "none granted"),  # Slurm gres without device files
    ({"CUDA_VISIBLE_DEVICES": "GPU-8f2a,GPU-77c1"}, 2, ("GPU-8f2a", "GPU-77c1"),
     {"GPU-8f2a": "GPU-8f2a", "GPU-77c1": "GPU-77c1"}, "CUDA_VISIBLE_DEVICES"),
    ({"CUDA_VISIBLE_DEVICES": "MIG-5c1e"}, 1, ("MIG-5c1e",), {"MIG-5c1e": "MIG-5c1e"}, "CUDA_VISIBLE_DEVICES"),
    # A Kubernetes GPU pod: only NVIDIA_VISIBLE_DEVICES, the host's devices, numbered 0..n-1 inside.
    ({"NVIDIA_VISIBLE_DEVICES": "2,3"}, None, ("0", "1"), {"0": "2", "1": "3"}, "NVIDIA_VISIBLE_DEVICES"),
    ({"NVIDIA_VISIBLE_DEVICES": "GPU-8f2a"}, 1, ("0",), {"0": "GPU-8f2a"}, "NVIDIA_VISIBLE_DEVICES"),
    ({"NVIDIA_VISIBLE_DEVICES": "all"}, 2, ("0", "1"), {"0": "0", "1": "1"}, "NVIDIA_VISIBLE_DEVICES=all and torch"),
    ({"NVIDIA_VISIBLE_DEVICES": "all"}, 0, (), {}, "none granted"),  # a CUDA image run without GPUs
    ({"NVIDIA_VISIBLE_DEVICES": "none"}, None, (), {}, "none granted"),
    ({"NVIDIA_VISIBLE_DEVICES": "void"}, 0, (), {}, "none granted"),
    # Both: CUDA indexes the container's devices; the map names the host's.
    ({"NVIDIA_VISIBLE_DEVICES": "4,5,6", "CUDA_VISIBLE_DEVICES": "1,2"}, 2, ("1", "2"), {"1": "5", "2": "6"},
     "CUDA_VISIBLE_DEVICES"),
    ({"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b", "CUDA_VISIBLE_DEVICES": "GPU-b"}, None, ("GPU-b",),
     {"GPU-b": "GPU-b"}, "CUDA_VISIBLE_DEVICES"),
    ({"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": "0"}, 1, ("0",), {"0": "0"}, "CUDA_VISIBLE_DEVICES"),
    ({"NVIDIA_VISIBLE_DEVICES": "none", "CUDA_VISIBLE_DEVICES": "-1"}, 0, (), {}, "none granted"),
])
def test_discovery_reads_every_source(env, torch_count, visible, physical, source):
    acc = discover(env, torch_count)
    assert (acc.visible, acc.physical, acc.source, acc.torch_count) == (visible, physical, source, torch_count)


@pytest.mark.parametrize(("env", "torch_count", "named"), [
    # CUDA asks for more devices than torch (counting under that very variable) sees.
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 2, ["CUDA_VISIBLE_DEVICES='0,1,2,3'", "device_count() is 2"]),
    ({"NVIDIA_VISIBLE_DEVICES": "0,1"}, 1, ["NVIDIA_VISIBLE_DEVICES='0,1'", "device_count() is 1"]),
    # The container exposes no GPU, or not the one CUDA names.
    ({"NVIDIA_VISIBLE_DEVICES": "void", "CUDA_VISIBLE_DEVICES": "0"}, None,
     ["CUDA_VISIBLE_DEVICES='0'", "NVIDIA_VISIBLE_DEVICES='void'", "nvidia.com/gpu"]),
    ({"NVIDIA_VISIBLE_DEVICES": "2,3", "CUDA_VISIBLE_DEVICES": "0,2"}, None,
     ["device '2'", "NVIDIA_VISIBLE_DEVICES='2,3'", "0..1"]),
    ({"NVIDIA_VISIBLE_DEVICES": "GPU-a", "CUDA_VISIBLE_DEVICES": "GPU-z"}, None, ["device 'GPU-z'", "GPU-a"]),
    # "all" leaves the count to CUDA, and nothing here can count.
    ({"NVIDIA_VISIBLE_DEVICES": "all"}, None, ["NVIDIA_VISIBLE_DEVICES=all", "set CUDA_VISIBLE_DEVICES"]),
])
def test_a_mismatch_between_sources_is_refused_by_name(env, torch_count, named):
    with pytest.raises(AcceleratorError) as err:
        discover(env, torch_count)
    for text in named:
        assert text in str(err.value), (text, str(err.value))


def test_discovery_against_this_process_torch(caplog):
    """The real path: torch imported in this process counts what it can use; a grant it
    agrees with is kept, one it contradicts is refused. Where torch sees no CUDA device
    (a CPU machine, or CI's fake gres), a grant stands and the CPU fallback is logged."""
    torch = pytest.importorskip("torch")
    count = torch_device_count()
    assert count == torch.cuda.device_count()
    agreed = {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(count))} if count else {}
    assert sites.grant_from_env(agreed).accelerators == tuple(str(i) for i in range(count))
    two_more = {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(count + 2))}
    if count:
        with pytest.raises(AcceleratorError, match=f"device_count\\(\\) is {count}"):
            sites.grant_from_env(two_more)
    else:
        with caplog.at_level(logging.WARNING, logger="pairflow.fleet.sites"):
            assert sites.grant_from_env(two_more).accelerators == ("0", "1")
        assert "torch sees no CUDA device" in caplog.text


# --- choosing a site ------------------------------------------------------------------------

def test_auto_picks_slurm_inside_a_slurm_job_and_local_elsewhere():
    assert sites.select(SLURM).name == "slurm" and sites.select({}).name == "local"
    assert sites.select(SLURM, "local").name == "local"  # fleet/site overrides the environment
    inside = sites.grant({**SLURM, "CUDA_VISIBLE_DEVICES": "0"}, "local")
    assert inside.site == "local" and inside.allocation is None and inside.accelerators == ("0",)
    with pytest.raises(SchedulerError, match="fleet/site is slurm but this job has no SLURM_JOB_ID"):
        sites.grant({"CUDA_VISIBLE_DEVICES": "0"}, "slurm")
    # a name no site can ever have (a would-be site such as 'pbs' may be one tomorrow)
    known = ", ".join([sites.AUTO, *sites.SITES])
    with pytest.raises(SchedulerError, match=f"'no such site!', which is no site; known: {known}"):
        sites.select({}, "no such site!")


def test_sites_are_found_by_the_registry_and_auto_tries_the_fallback_last():
    """Every module of the sites package that defines SITE is a site; none is listed by
    hand. auto's order is by priority, so the site that applies everywhere is last."""
    import importlib
    import pkgutil

    modules = [importlib.import_module(f"pairflow.fleet.sites.{m.name}") for m in pkgutil.iter_modules(sites.__path__)]
    assert sorted(sites.SITES) == sorted(m.SITE.name for m in modules if hasattr(m, "SITE"))
    assert {"local", "slurm"} <= set(sites.SITES)
    order = list(sites.SITES.values())
    assert [s.priority for s in order] == sorted((s.priority for s in order), reverse=True)
    assert order[-1].applies({}) and not any(s.applies({}) for s in order[:-1])


def test_every_site_has_its_profile_and_its_docs_row():
    """A site is its module, its test, its profile (``profiles/<name>``) and its row in
    the site table of docs/clusters.md: the table names exactly the registered sites."""
    docs = (ROOT / "docs" / "clusters.md").read_text()
    table = docs.split("\n## A new site\n", 1)[1].split("| site | provider |", 1)[1].split("\n\n", 1)[0]
    assert sorted(re.findall(r"^\| `([\w-]+)` \|", table, re.M)) == sorted(sites.SITES)
    for name in sites.SITES:
        assert (ROOT / "profiles" / name).is_dir(), f"site {name!r} has no Snakemake profile profiles/{name}"


def test_the_schema_offers_exactly_the_registered_sites():
    fleet = yaml.safe_load(Path(SCHEMA_PATH).read_text())["properties"]["fleet"]["properties"]
    assert sorted(fleet["site"]["enum"]) == sorted([sites.AUTO, *sites.SITES])
    assert fleet["site"]["default"] == FleetSpec(1, 0).site == sites.AUTO


def test_grant_maps_visible_devices_to_physical_gpus():
    env = {**SLURM, "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_GPUS": "3,5"}
    g = sites.grant(env)
    assert g.accelerators == ("0", "1") and g.gpus == {"0": "3", "1": "5"} and g.site == "slurm"
    assert g.allocation is not None and g.allocation.job_id == "42" and g.allocation.cpus_on_node == 16
    local = sites.grant({"CUDA_VISIBLE_DEVICES": "-1"})
    assert local == Grant() and allocation({}) is None
    # Slurm's list not lining up with the visible one: the visible names stand.
    assert sites.grant({**SLURM, "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_GPUS": "3"}).gpus == {"0": "0", "1": "1"}


# --- the Parsl config each site composes ------------------------------------------------------

def test_local_site_runs_one_pool_here_with_cpu_workers_or_one_worker_per_gpu(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="pairflow.fleet.sites"):
        config = sites.make_config(tmp_path, FleetSpec(3, 1), Grant())
    ex = config.executors[0]
    assert isinstance(ex.provider, LocalProvider) and isinstance(ex.provider.launcher, SingleNodeLauncher)
    assert ex.provider.nodes_per_block == 1 and (ex.provider.init_blocks, ex.provider.max_blocks) == (1, 1)
    assert ex.max_workers_per_node == 3 and ex.available_accelerators == [] and ex.cpu_affinity == "block"
    assert ex.address == "127.0.0.1" and config.retries == 1
    assert "pairflow.fleet.orphans watch" in ex.provider.worker_init  # the pool ends with its driver
    assert f"site local: Parsl config {config!r}" in caplog.text  # verbatim, in the job log
    gpu = sites.make_config(tmp_path, FleetSpec(3, 1), sites.grant({"NVIDIA_VISIBLE_DEVICES": "2,3"})).executors[0]
    assert gpu.max_workers_per_node == 2 and gpu.available_accelerators == ["0", "1"] and gpu.cpu_affinity == "none"
    assert f"{GPU_MAP_VAR}=0=2,1=3" in gpu.provider.worker_init


def test_every_pool_runs_parsls_pool_through_workerpool_with_its_start_method_and_port_file(tmp_path):
    from parsl.executors.high_throughput.executor import DEFAULT_LAUNCH_CMD

    from pairflow.fleet.executor import port_file

    auto = FleetSpec(1, 0)
    assert auto.worker_start == "auto"  # the default: forkserver without a GPU, spawn with one
    ports = port_file(tmp_path, os.getpid())
    parsl_args = DEFAULT_LAUNCH_CMD.removeprefix("process_worker_pool.py ")
    forked = sites.make_config(tmp_path, auto, Grant()).executors[0].launch_cmd
    assert forked == f"{sys.executable} -m pairflow.fleet.workerpool --start=forkserver --port-file={ports} " + parsl_args
    assert "{{block_id}}" in forked and "{max_workers_per_node}" in forked  # Parsl fills every placeholder
    spawned = sites.make_config(tmp_path, FleetSpec(1, 0, worker_start="spawn"), Grant()).executors[0].launch_cmd
    assert spawned == forked.replace("--start=forkserver", "--start=spawn")  # workers end with their manager
    gpu = sites.grant({**SLURM, "CUDA_VISIBLE_DEVICES": "0"})
    assert sites.make_config(tmp_path, auto, gpu).executors[0].launch_cmd == spawned  # a GPU job spawns
    fork = FleetSpec(1, 0, worker_start="forkserver")
    slurm = sites.make_config(tmp_path, fork, gpu)
    assert slurm.executors[0].launch_cmd == forked  # by name; srun runs the same command on each node


def test_no_site_chooses_a_worker_port_the_interchange_binds_one_from_a_range_and_writes_it(tmp_path):
    """Regression (issue 38 faults, item 3): the driver chose a free port (bind 0, close) that the
    interchange bound a second later; another job's socket took it in between in 1 of 16
    CI jobs. Now no port is chosen before the bind: the interchange binds one of the range
    (trying the next on EADDRINUSE) and the pool reads it from the port file."""
    from pairflow.fleet.executor import EarlyPoolExecutor, port_file

    ex = sites.make_config(tmp_path, FleetSpec(1, 0), Grant()).executors[0]
    assert isinstance(ex, EarlyPoolExecutor) and ex.address == "127.0.0.1"
    assert ex.worker_port is None and ex.worker_port_range == sites.base.WORKER_PORTS
    assert ex.port_file == port_file(tmp_path, os.getpid())
    assert "EarlyPoolExecutor(" in repr(ex) and "worker_port=None" in repr(ex)  # logged verbatim
    assert "--port={worker_port}" in ex.launch_cmd  # None until the interchange bound one
    with pytest.raises(ConfigError, match="port_file=None.*sites.make_config"):
        EarlyPoolExecutor(label="x")._start_local_interchange_process()


def test_two_workers_per_gpu_list_each_device_twice_pinned_past_parsls_mps_rewrite(tmp_path):
    g = sites.grant({"NVIDIA_VISIBLE_DEVICES": "2,3"})
    ex = sites.make_config(tmp_path, FleetSpec(3, 1), g, Packing(per_gpu=2)).executors[0]
    assert ex.available_accelerators == ["0,-1", "0,-1", "1,-1", "1,-1"]
    assert ex.max_workers_per_node == 4 and ex._workers_per_node == 4  # Parsl starts one worker per entry
    # Parsl's worker rewrites an integer name a as a // (workers // nvidia-smi's count) (0,0,1,1 -> 0,0,0,0 on a
    # 2-GPU node); these names are no integer, so it sets each as given; CUDA stops at -1: one device each.
    for name in ex.available_accelerators:
        with pytest.raises(ValueError):
            int(name)
    assert slot_gpu({"CUDA_VISIBLE_DEVICES": "1,-1", GPU_MAP_VAR: "0=2,1=3"}, "h") == "3"
    assert sites.make_config(tmp_path, FleetSpec(3, 1), g).executors[0].available_accelerators == ["0", "1"]
    cpu = sites.make_config(tmp_path, FleetSpec(3, 1), Grant(), Packing(cpu_workers=2)).executors[0]
    assert cpu.max_workers_per_node == 2 and cpu.available_accelerators == []


def test_slurm_site_starts_one_pool_per_node_with_a_worker_per_gpu(tmp_path):
    one = sites.make_config(tmp_path, FleetSpec(1, 0), sites.grant({**SLURM, "CUDA_VISIBLE_DEVICES": "0"}))
    ex = one.executors[0]
    assert isinstance(ex.provider.launcher, SrunLauncher) and "--overlap" in ex.provider.launcher.overrides
    assert ex.provider.nodes_per_block == 1 and ex.address == "127.0.0.1"
    assert "pairflow.fleet.orphans watch" in ex.provider.worker_init
    two = {**SLURM, "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "gpu[07-08]", "CUDA_VISIBLE_DEVICES": "0,1",
           "SLURM_JOB_GPUS": "2,3"}
    ex = sites.make_config(tmp_path, FleetSpec(1, 0), sites.grant(two)).executors[0]
    assert ex.provider.nodes_per_block == 2 and ex.max_workers_per_node == 2  # 2 nodes x 2 GPUs = 4 slots
    assert ex.available_accelerators == ["0", "1"] and ex.address == address_by_hostname()  # workers dial in
    assert "orphans watch" not in ex.provider.worker_init  # Slurm ends the srun steps with the job
    assert f"{GPU_MAP_HOST_VAR}={node_name(os.environ)}" in ex.provider.worker_init
    script = ex.provider.launcher("CMD", 1, 2)
    assert "srun --ntasks 2 -l --overlap --nodes=2 --ntasks-per-node=1" in script  # one pool on each node


def test_gpus_slurm_granted_that_no_variable_names_are_refused():
    """Slurm granting GPUs without device files (``NoDevFiles``) or without setting
    CUDA_VISIBLE_DEVICES would silently give CPU workers on a GPU allocation."""
    for cuda in ({}, {"CUDA_VISIBLE_DEVICES": "NoDevFiles"}):
        with pytest.raises(AcceleratorError, match="SLURM_GPUS_ON_NODE=2.*gres.conf"):
            sites.grant({**SLURM, "SLURM_GPUS_ON_NODE": "2", **cuda})
    assert sites.grant({**SLURM, "SLURM_GPUS_ON_NODE": "2", "CUDA_VISIBLE_DEVICES": "-1"}).accelerators == ()
    assert sites.grant({**SLURM, "SLURM_GPUS_ON_NODE": "0"}).accelerators == ()
    assert sites.grant({**SLURM, "SLURM_GPUS_ON_NODE": "2", "CUDA_VISIBLE_DEVICES": "0,1"}).accelerators == ("0", "1")


def test_a_multi_node_job_whose_first_node_sees_other_gpu_names_is_warned_about(caplog):
    env = {**SLURM, "SLURM_JOB_NUM_NODES": "2", "CUDA_VISIBLE_DEVICES": "2,3"}
    with caplog.at_level(logging.WARNING, logger="pairflow.fleet.sites"):
        assert sites.grant(env).accelerators == ("2", "3")
    assert "spans 2 nodes" in caplog.text and "ConstrainDevices=yes" in caplog.text


def test_a_slot_names_its_physical_gpu_on_every_node():
    here = socket.gethostname()
    mapped = {GPU_MAP_VAR: "0=3,1=5"}
    assert slot_gpu({**mapped, "CUDA_VISIBLE_DEVICES": "1"}, here) == "5"
    assert slot_gpu({"CUDA_VISIBLE_DEVICES": "1"}, here) == "1"  # no map: the visible name
    assert slot_gpu({}, here) is None  # a CPU worker
    # Another node of a multi-node job: its own step GPUs, in the driver's order.
    other = {**mapped, GPU_MAP_HOST_VAR: "gpu07", "SLURM_STEP_GPUS": "6,7"}
    assert slot_gpu({**other, "CUDA_VISIBLE_DEVICES": "1"}, "gpu08") == "7"
    assert slot_gpu({**other, "CUDA_VISIBLE_DEVICES": "1"}, "gpu07") == "5"  # the driver's node: its map
    assert slot_gpu({**mapped, GPU_MAP_HOST_VAR: "gpu07", "CUDA_VISIBLE_DEVICES": "1"}, "gpu08") == "1"


def test_slots_are_named_by_the_scheduler_s_node_name_where_there_is_one():
    """The CI's two Slurm nodes share one machine's host name; their slots must not."""
    assert node_name({"SLURMD_NODENAME": "pf-node2"}) == "pf-node2"
    assert node_name({}) == node_name({"SLURMD_NODENAME": ""}) == socket.gethostname()


def test_each_site_reports_its_exclusivity_outside_a_scheduler():
    local = sites.exclusivity(Grant())
    assert local["scheduler"] == "local" and local["exclusive"] is None


def test_without_slurm_job_start_time_the_start_is_scontrols(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Audit of issue 25, defect 4: Slurm before 23.02 sets no SLURM_JOB_START_TIME, and the
    job window opened at the job process's start (15 s into the allocation, measured).
    The start now comes from ``scontrol show job``'s StartTime, and the record says which
    source it used; where scontrol does not answer, the process start, saying why."""
    from datetime import datetime

    from pairflow.fleet.sites.slurm import allocation_start

    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\necho 'JobId=7 JobName=x StartTime=2026-12-02T12:00:05 EndTime=Unknown NumNodes=1'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    alloc = allocation({"SLURM_JOB_ID": "7"})
    assert alloc is not None and alloc.start is None
    assert allocation_start(alloc) == (datetime.fromisoformat("2026-12-02T12:00:05").timestamp(),
                                       "Slurm allocation start (scontrol show job: StartTime)")
    env = allocation({"SLURM_JOB_ID": "7", "SLURM_JOB_START_TIME": "1700000000"})
    assert env is not None and allocation_start(env) == (1700000000.0, "Slurm allocation start (SLURM_JOB_START_TIME)")
    fake.write_text("#!/bin/sh\necho 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n")
    start, why = allocation_start(alloc)
    assert start is None and "Invalid job id specified" in why and "no SLURM_JOB_START_TIME" in why


def test_a_multi_node_job_counts_every_node_s_slots_even_one_that_never_ran_a_task(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review of issue 25: the slots of a multi-node job came from the spans alone, so a
    node whose pool never started added no slot time and the busy share read high. Slurm's
    own hostlist expansion names every node; without scontrol, this node's slots."""
    from pairflow.fleet.pool import _allocated_slots
    from pairflow.fleet.sites import grant_from_env
    from pairflow.plan.config import FleetSpec

    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODELIST": "pf-node[1-2]",
           "CUDA_VISIBLE_DEVICES": "0,1", "SLURMD_NODENAME": "pf-node1"}
    grant = grant_from_env(env)
    monkeypatch.setenv("SLURMD_NODENAME", "pf-node1")
    fake = tmp_path / "scontrol"
    fake.write_text('#!/bin/sh\n[ "$2" = hostnames ] && [ "$3" = "pf-node[1-2]" ] && printf "pf-node1\\npf-node2\\n"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert _allocated_slots(FleetSpec(1, 0), grant) == ["pf-node1/gpu0", "pf-node1/gpu1", "pf-node2/gpu0", "pf-node2/gpu1"]
    fake.write_text("#!/bin/sh\nexit 1\n")
    assert _allocated_slots(FleetSpec(1, 0), grant) == ["pf-node1/gpu0", "pf-node1/gpu1"]
