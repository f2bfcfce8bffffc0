"""The seam to Slurm: what this job was granted, read from its environment and from
``scontrol`` (argv lists, a time limit, stderr carried in the error).

Imports without torch. Outside a Slurm job every function returns None, so the same
code runs on a laptop.
"""

from __future__ import annotations

import subprocess
from dataclasses import asdict, dataclass, replace
from typing import Any

from .errors import SchedulerError


@dataclass(frozen=True)
class AllocationInfo:
    """The Slurm allocation a job runs in (observed, never configured).

    ``gpus`` are the node-level (physical) GPU indices Slurm granted the job
    (``SLURM_JOB_GPUS``), in the order of ``CUDA_VISIBLE_DEVICES``; under a cgroup
    device constraint the visible indices are renumbered from 0 while these are not.
    """

    job_id: str
    nodes: int
    nodelist: str
    cpus_on_node: int | None
    gpus: tuple[str, ...]
    partition: str | None
    start: float | None = None  # the allocation's start (SLURM_JOB_START_TIME, Slurm 23.02+), epoch s

    def asdict(self) -> dict[str, Any]:
        return asdict(self)


def allocation(environ: dict[str, str]) -> AllocationInfo | None:
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


def whole_job(alloc: AllocationInfo | None, environ: dict[str, str]) -> AllocationInfo | None:
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


def gpu_map(visible: list[str], alloc: AllocationInfo | None) -> dict[str, str]:
    """Map each visible device index to the node's physical GPU index.

    Without Slurm (or when Slurm's list does not line up with the visible list) the
    visible index is the best physical index known."""
    if alloc is not None and len(alloc.gpus) == len(visible):
        return dict(zip(visible, alloc.gpus, strict=True))
    return {v: v for v in visible}


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


def exclusivity(alloc: AllocationInfo | None) -> dict[str, Any]:
    """Whether the job holds its node(s) alone, as Slurm reports it (for the timed
    pass's record). Outside Slurm: the local rule took every core (``local``)."""
    if alloc is None:
        return {"scheduler": "local", "exclusive": None,
                "how": "the rule takes every core of this machine, so Snakemake runs nothing beside it"}
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
    import shutil

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
