"""The Slurm site, and the seam to Slurm: what this job was granted, read from its
environment and from ``scontrol`` (argv lists, a time limit, stderr carried in the error).

Provider ``LocalProvider`` (the job already holds its allocation: nothing to submit) →
launcher ``SrunLauncher`` (one worker pool per allocated node, ``nodes_per_block`` =
``SLURM_JOB_NUM_NODES``) → the shared executor (``base.parsl_config``), ``Packing.per_gpu``
workers per granted GPU on each node. Parsl pins every node's workers to the driver node's device
list, so each node must see its GPUs under the same names: true under a cgroup device
constraint (``ConstrainDevices=yes``, every node numbers its GPUs 0..n-1) or when each
node grants the same indices (``--gres=gpu:N`` on identical nodes); a multi-node job
whose driver node sees other names is warned about in the job log. Exclusivity:
``scontrol``'s ``OverSubscribe`` for the job.

Imports without torch. Outside a Slurm job ``allocation`` returns None, so the same code
runs on a laptop.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ...errors import AcceleratorError, SchedulerError
from .accelerators import CUDA_VAR, discover
from .base import AllocationInfo, Grant
from .local import local_exclusivity

if TYPE_CHECKING:
    from parsl.providers.base import ExecutionProvider

log = logging.getLogger(__name__)

UNSET_STEP = 'for v in $(compgen -e | grep "^SLURM_"); do [ "$v" = SLURM_JOB_ID ] || unset "$v"; done'
"""Shell line unsetting a job step's SLURM_* variables (not the job id) before srun."""

SRUN_OVERRIDES = "--overlap --nodes={nodes} --ntasks-per-node=1 --cpu-bind=none"
"""srun options for the pools: one pool on each of the allocation's nodes (named
explicitly: the rule itself runs in a one-node step, the Slurm executor plugin's
``srun --nodes=1``, whose ``SLURM_*`` values the pools' srun would otherwise inherit);
``--overlap`` because that step already holds the allocation's CPUs; no CPU binding of
the pool (Parsl places CPU workers itself)."""


def allocation(environ: Mapping[str, str]) -> AllocationInfo | None:
    """The allocation described by a job's environment, or None outside Slurm."""
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if not job:
        return None
    gpus = tuple(g for g in environ.get("SLURM_JOB_GPUS", environ.get("SLURM_STEP_GPUS", "")).split(",") if g)
    cpus = environ.get("SLURM_CPUS_ON_NODE")
    return AllocationInfo(job_id=job, nodes=int(environ.get("SLURM_JOB_NUM_NODES", environ.get("SLURM_NNODES", "1"))),
                          nodelist=environ.get("SLURM_JOB_NODELIST", environ.get("SLURM_NODELIST", "")),
                          cpus_on_node=int(cpus) if cpus and cpus.isdigit() else None, gpus=gpus,
                          partition=environ.get("SLURM_JOB_PARTITION"),
                          start=float(environ["SLURM_JOB_START_TIME"])
                          if environ.get("SLURM_JOB_START_TIME", "").isdigit() else None)


def whole_job(alloc: AllocationInfo | None, environ: Mapping[str, str]) -> AllocationInfo | None:
    """The allocation widened from this job step to the whole job.

    Inside a step (the Slurm executor plugin runs each rule under ``srun -n1``, which
    places one task on one node) the environment describes the step: ``SLURM_NNODES``
    is 1 and ``SLURM_JOB_NUM_NODES`` is absent even when the job holds several nodes.
    There the job's node count and list are read from ``scontrol show job`` (one call);
    in a batch script, or outside Slurm, ``alloc`` is returned as it is. Raises
    SchedulerError (from ``job_details``) when scontrol fails."""
    if alloc is None or "SLURM_JOB_NUM_NODES" in environ or "SLURM_STEP_ID" not in environ:
        return alloc
    details = job_details(alloc.job_id)
    nodes = details.get("NumNodes", "")
    if not nodes.isdigit() or int(nodes) == alloc.nodes:
        return alloc
    return replace(alloc, nodes=int(nodes), nodelist=details.get("NodeList", alloc.nodelist))


def gpu_map(visible: list[str], alloc: AllocationInfo | None,
            fallback: Mapping[str, str] | None = None) -> dict[str, str]:
    """Map each visible device index to the node's physical GPU index.

    Without Slurm (or when Slurm's list does not line up with the visible list) the
    ``fallback`` (default: the visible index itself) is the best physical name known."""
    if alloc is not None and len(alloc.gpus) == len(visible):
        return dict(zip(visible, alloc.gpus, strict=True))
    return dict(fallback) if fallback is not None else {v: v for v in visible}


@dataclass(frozen=True)
class SlurmSite:
    """A Slurm job (``SLURM_JOB_ID`` set): the allocation's nodes, one pool on each via srun."""

    name: str = "slurm"
    priority: int = 10  # a Slurm job is tried before the local fallback

    def applies(self, environ: Mapping[str, str]) -> bool:
        return allocation(environ) is not None

    def grant(self, environ: Mapping[str, str], torch_count: int | None) -> Grant:
        """Raises SchedulerError outside a Slurm job (``fleet/site: slurm`` forced), and
        AcceleratorError where the accelerator sources disagree (``accelerators.discover``)."""
        alloc = whole_job(allocation(environ), environ)  # a rule's srun step sees one node of the job's
        if alloc is None:
            raise SchedulerError("fleet/site is slurm but this job has no SLURM_JOB_ID: it does not run inside a "
                                 "Slurm allocation; run it through the Slurm profile (snakemake --profile "
                                 "profiles/slurm) or set fleet/site to auto or local")
        acc = discover(environ, torch_count)
        on_node = environ.get("SLURM_GPUS_ON_NODE", "")
        if on_node.isdigit() and int(on_node) > 0 and not acc.visible and environ.get(CUDA_VAR, "").strip() != "-1":
            raise AcceleratorError(
                f"Slurm granted this job {on_node} GPU(s) on this node (SLURM_GPUS_ON_NODE={on_node}) but "
                f"{CUDA_VAR}={environ.get(CUDA_VAR)!r} names none, so every worker would run on the CPU: give the "
                "node's GPUs device files in gres.conf (File=/dev/nvidia0, ...) so Slurm sets it, or set "
                f"{CUDA_VAR}=-1 to run this job on CPU workers on purpose")
        n = len(acc.visible)
        if alloc.nodes > 1 and n and acc.visible != tuple(str(i) for i in range(n)):
            log.warning("Slurm job %s spans %d nodes and its first node sees GPUs %s, not 0..%d: Parsl pins every "
                        "node's workers to these names, so another node with other GPU indices would use the wrong "
                        "devices; constrain devices (cgroup ConstrainDevices=yes) or request whole-node GPUs",
                        alloc.job_id, alloc.nodes, ",".join(acc.visible), n - 1)
        return Grant(acc.visible, alloc, gpu_map(list(acc.visible), alloc, acc.physical), self.name)

    def provider(self, grant: Grant, worker_init: str) -> ExecutionProvider:
        from parsl.launchers import SrunLauncher  # Parsl's providers: 1-3 s to import, only for a pool
        from parsl.providers import LocalProvider

        return LocalProvider(
            launcher=SrunLauncher(debug=False, overrides=SRUN_OVERRIDES.format(nodes=grant.nodes)
                                  + (f" --jobid={grant.allocation.job_id}" if grant.allocation and grant.nodes > 1
                                     else "")),
            nodes_per_block=grant.nodes,  # one pool per allocated node
            # Exactly one block: this allocation. min 0 lets the idle timeout release it.
            init_blocks=1, min_blocks=0, max_blocks=1,
            # Across nodes the srun names the whole allocation (--jobid, --nodes) with the
            # SLURM_* of the rule's one-node step unset: Snakemake's Slurm plugin starts the
            # rule with srun -n1, whose step variables (SLURM_JOB_NODELIST narrowed to its
            # node, its task and CPU counts) would confine the pools to one node ("Only
            # allocated 1 nodes asked for 2", "More processors requested than permitted").
            worker_init=worker_init + (f"\n{UNSET_STEP}" if grant.nodes > 1 else ""),
        )

    def exclusivity(self, grant: Grant) -> dict[str, Any]:
        return exclusivity(grant.allocation)


def job_details(job_id: str, timeout_s: float = 30.0) -> dict[str, str]:
    """``scontrol show job -o JOB`` as a mapping (e.g. ``OverSubscribe``, ``NumNodes``,
    ``TRES``). Raises SchedulerError naming the command and its stderr if it fails."""
    argv = ["scontrol", "show", "job", "-o", str(job_id)]
    try:
        out = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=timeout_s).stdout
    except FileNotFoundError as e:
        raise SchedulerError(f"{argv[0]} not found on PATH inside Slurm job {job_id}; load the site's "
                            "Slurm module in the job environment") from e
    except subprocess.CalledProcessError as e:
        raise SchedulerError(f"{' '.join(argv)} failed ({e.returncode}): {e.stderr.strip()}") from e
    except subprocess.TimeoutExpired as e:
        raise SchedulerError(f"{' '.join(argv)} did not answer in {timeout_s:.0f}s; is slurmctld up?") from e
    fields = {}
    for token in out.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    return fields


START_SOURCES = {"env": "Slurm allocation start (SLURM_JOB_START_TIME)",
                 "scontrol": "Slurm allocation start (scontrol show job: StartTime)"}
"""What ``allocation_start`` read the allocation's start from, as the telemetry record says it."""


def allocation_start(alloc: AllocationInfo, timeout_s: float = 10.0) -> tuple[float | None, str]:
    """(when the allocation started, epoch seconds; where that was read): the job's
    ``SLURM_JOB_START_TIME`` (``alloc.start``: Slurm 23.02+), else ``scontrol show job``'s
    ``StartTime`` (older Slurm: the controller's record, printed in this process's local
    time). (None, why) when neither answers: the caller falls back to the job process's
    start and says why. Never raises: a job's accounting must not fail its work."""
    if alloc.start is not None:
        return alloc.start, START_SOURCES["env"]
    try:
        text = job_details(alloc.job_id, timeout_s).get("StartTime", "")
    except SchedulerError as e:
        return None, f"no allocation start from Slurm (no SLURM_JOB_START_TIME; {e})"
    try:
        return datetime.fromisoformat(text).timestamp(), START_SOURCES["scontrol"]
    except ValueError:
        return None, f"no allocation start from Slurm (no SLURM_JOB_START_TIME; scontrol StartTime={text!r})"


def node_names(nodelist: str, timeout_s: float = 10.0) -> list[str]:
    """The node names of a Slurm hostlist expression (``pf-node[1-2]``), as
    ``scontrol show hostnames`` expands it (Slurm's own grammar), or [] when it cannot
    (no scontrol, an error, an empty list). Never raises: it sizes accounting only."""
    if not nodelist:
        return []
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], check=True, capture_output=True,
                             text=True, timeout=timeout_s).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return out.split()


def exclusivity(alloc: AllocationInfo | None) -> dict[str, Any]:
    """Whether the job holds its node(s) alone, as Slurm reports it (for the timed
    pass's record). Outside Slurm: the local rule took every core (``local``)."""
    if alloc is None:
        return local_exclusivity()
    details = job_details(alloc.job_id)
    return {"scheduler": "slurm", "job_id": alloc.job_id,
            "exclusive": details.get("OverSubscribe") == "NO",
            "oversubscribe": details.get("OverSubscribe"), "nodelist": details.get("NodeList"),
            "tres": details.get("TRES")}


def cluster_unavailable(timeout_s: float = 15.0) -> str | None:
    """Why no Slurm cluster answers here (None when one does): ``sinfo`` must be on the
    PATH, answer within ``timeout_s`` and show a node that can run jobs (idle, mixed or
    allocated). A client installed with no cluster behind it ("Could not establish a
    configuration source") is unavailable, not an error. Used to skip Slurm-dependent
    tests and benchmark sections with this reason."""
    if shutil.which("sinfo") is None:
        return "no Slurm client here (sinfo not found); start the CI cluster with bash .ci/slurm-up"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"sinfo did not answer in {timeout_s:.0f}s; no Slurm controller answers (bash .ci/slurm-up starts one)"
    if out.returncode != 0:
        why = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        return f"no Slurm cluster answers (sinfo: {why}); bash .ci/slurm-up starts one"
    if not any(s in out.stdout for s in ("idle", "mix", "alloc")):
        return f"Slurm answers but shows no usable node (states: {' '.join(out.stdout.split()) or 'none'})"
    return None


SITE = SlurmSite()
"""This module's site (``sites.SITES`` finds it)."""
