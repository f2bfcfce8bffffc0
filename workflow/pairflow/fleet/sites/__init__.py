"""Where the work runs: one module per site, each reading its allocation, accelerators,
launcher and exclusivity from the job's environment and composing Parsl's provider and
launcher; ``base.parsl_config`` adds the executor every site shares.

    local   this machine (LocalProvider + SingleNodeLauncher)
    slurm   a Slurm job (LocalProvider + SrunLauncher, one pool per allocated node)

``fleet/site`` names one (``auto``, the default, picks the first in ``SITES`` whose
``applies`` says the job runs there: Slurm when ``SLURM_JOB_ID`` is set, else local). A
new site (PBS, Kubernetes) is one module of this package defining ``SITE``, an instance
of a class implementing ``base.Site``; the registry finds it (as the arm kinds and the
metrics are found). With it come its test, its Snakemake profile (``profiles/<name>``)
and its row in docs/clusters.md's site table; tests hold the config schema's ``fleet.site``
enum, the profiles and the table to ``SITES``.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import SchedulerError
from ...plan.config import FleetSpec
from ...progress import LOG_ONLY
from .accelerators import ALL, CUDA_VAR, NVIDIA_VAR, parse_cuda, parse_nvidia, torch_device_count
from .base import ONE_PER_GPU, AllocationInfo, Grant, Packing, Site, parsl_config, worker_init

if TYPE_CHECKING:
    from parsl.config import Config

log = logging.getLogger(__name__)

__all__ = ["ONE_PER_GPU", "SITES", "AllocationInfo", "Grant", "Packing", "Site", "grant", "grant_from_env",
           "make_config", "select"]


def _discover() -> dict[str, Site]:
    """Every module of this package that defines ``SITE``, by the site's name, in the
    order ``auto`` tries them: highest ``priority`` first (local, which applies
    everywhere, has the lowest), then by name."""
    found: list[Site] = []
    for info in pkgutil.iter_modules(__path__):
        site = getattr(importlib.import_module(f".{info.name}", __name__), "SITE", None)
        if site is not None:
            found.append(site)
    return {s.name: s for s in sorted(found, key=lambda s: (-s.priority, s.name))}


SITES: dict[str, Site] = _discover()
"""Every site, in the order ``auto`` tries them."""
AUTO = "auto"


def select(environ: Mapping[str, str], name: str = AUTO) -> Site:
    """The site ``name`` (``fleet/site``), or with ``auto`` the first whose ``applies``.
    Raises SchedulerError for a name no site has."""
    if name == AUTO:
        return next(s for s in SITES.values() if s.applies(environ))
    if name not in SITES:
        raise SchedulerError(f"fleet/site is {name!r}, which is no site; known: {AUTO}, {', '.join(SITES)}")
    return SITES[name]


def grant(environ: Mapping[str, str], site: str = AUTO, torch_count: int | None = None) -> Grant:
    """What ``environ`` grants at site ``site`` (pure: ``torch_count`` is torch's device
    count, None where torch is not imported). Raises SchedulerError or AcceleratorError."""
    return select(environ, site).grant(environ, torch_count)


def grant_from_env(environ: Mapping[str, str], site: str = AUTO) -> Grant:
    """``grant`` for this process's job: torch's count where torch is imported (imported
    for ``NVIDIA_VISIBLE_DEVICES=all`` alone, which leaves the count to CUDA)."""
    count_all = parse_cuda(environ.get(CUDA_VAR)) is None and parse_nvidia(environ.get(NVIDIA_VAR)) == ALL
    return grant(environ, site, torch_device_count(import_torch=count_all))


def make_config(run_dir: Path, fleet: FleetSpec, g: Grant, packing: Packing = ONE_PER_GPU) -> Config:
    """The Parsl Config for a job holding grant ``g``: its site's provider and launcher
    composed into the shared executor, with ``packing``'s workers per device (or CPU
    workers); ``repr`` of it (the constructor call) is logged."""
    site = SITES[g.site]
    # On one node a watchdog in the pool's process group ends the pool when the driver
    # dies (orphans); across nodes Slurm ends the srun steps with the job.
    provider = site.provider(g, worker_init(g, watchdog=g.nodes == 1))
    config = parsl_config(Path(run_dir), fleet, g, provider, packing)
    log.info("site %s: Parsl config %r", site.name, config, extra={LOG_ONLY: True})  # the log's, not the console's
    return config


def exclusivity(g: Grant) -> dict[str, Any]:
    """Whether the job holds its node(s) alone, as its site reports it."""
    return SITES[g.site].exclusivity(g)
