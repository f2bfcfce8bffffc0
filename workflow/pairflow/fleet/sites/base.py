"""What every site shares: the grant a job observed, the Site seam, and the Parsl
executor and Config that a site's provider and launcher are composed into.

A site (``local``, ``slurm``) reads its allocation, accelerators and exclusivity from the
job's environment and builds the Parsl provider with its launcher; ``parsl_config`` then
wraps it in the one executor every site runs: a HighThroughputExecutor with
``Packing.per_gpu`` workers on each granted accelerator of each node (one unless the
calibration table shows more fit, ``calibrate.workers_for``), or ``Packing.cpu_workers``
(default ``fleet/cpu_workers``) where none was granted.
"""

from __future__ import annotations

import logging
import os
import shlex
import socket
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ...errors import ConfigError
from ...plan.config import FleetSpec
from .. import orphans, workerpool

if TYPE_CHECKING:
    from parsl.config import Config
    from parsl.providers.base import ExecutionProvider

log = logging.getLogger(__name__)

GPU_MAP_VAR = "PAIRFLOW_GPU_MAP"
"""Set in each worker's environment: visible device index → the node's physical GPU index."""
GPU_MAP_HOST_VAR = "PAIRFLOW_GPU_MAP_HOST"
"""Set beside ``GPU_MAP_VAR``: the host whose devices the map describes (the driver's node)."""

NODE_NAME_VARS = ("SLURMD_NODENAME",)
"""Where a scheduler names the node a process runs on (a new site adds its variable)."""

STRATEGY_PERIOD_S = 0.1
"""Seconds between Parsl's scaling decisions (the first launches the job's one block).
Measured on a 2-core machine: a pool's first result came 5.8-8.4 s after ``parsl.load`` at
Parsl's default of 5 s, 4.3 s of it before the block was even submitted; at 0.5 s the
pool manager started up to 0.5 s after ``parsl.load`` returned (0.45-0.48 s in three of
four panel jobs: Parsl's timer waits a period before its first tick), at 0.1 s 0.00-0.05 s
after (``startup`` marks, BENCHMARKS.md). A tick reads the executor's cached state (no
call to the interchange; the provider is polled at its own interval), so ten a second
cost nothing measurable; the rest of a pool's start is its Python processes starting."""


@dataclass(frozen=True)
class AllocationInfo:
    """The batch allocation a job runs in (observed, never configured).

    ``gpus`` are the node-level (physical) GPU indices the scheduler granted the job on
    the driver's node (Slurm: ``SLURM_JOB_GPUS``), in the order of
    ``CUDA_VISIBLE_DEVICES``; under a cgroup device constraint the visible indices are
    renumbered from 0 while these are not.
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


@dataclass(frozen=True)
class Grant:
    """What this job was given to run on (observed by the rule adapter): the devices its
    workers are pinned to (one worker each, on every node), the batch allocation (None
    outside a scheduler), each device's physical name, and the site that read them."""

    accelerators: tuple[str, ...] = ()
    allocation: AllocationInfo | None = None
    gpus: dict[str, str] = field(default_factory=dict)
    site: str = "local"

    @property
    def nodes(self) -> int:
        """Nodes in the allocation: one Parsl worker pool on each."""
        return self.allocation.nodes if self.allocation else 1


class Site(Protocol):
    """One place the work runs. A new site is one module of ``sites`` whose ``SITE`` is an
    instance of a class implementing this (found by ``sites.SITES``), plus its test, a
    Snakemake profile and its docs row."""

    @property
    def name(self) -> str:
        """The site's name, as ``fleet/site`` and the telemetry record give it."""
        ...

    @property
    def priority(self) -> int:
        """Where ``fleet/site: auto`` tries this site: higher first; a site that applies
        everywhere (local) is lowest."""
        ...

    def applies(self, environ: Mapping[str, str]) -> bool:
        """Whether ``environ`` is a job of this site (``fleet/site: auto`` picks the first)."""
        ...

    def grant(self, environ: Mapping[str, str], torch_count: int | None) -> Grant:
        """The allocation and accelerators ``environ`` describes (pure)."""
        ...

    def provider(self, grant: Grant, worker_init: str) -> ExecutionProvider:
        """The Parsl provider, with its launcher, that starts one worker pool per node of
        ``grant``'s allocation as one block; ``worker_init`` runs before each pool."""
        ...

    def exclusivity(self, grant: Grant) -> dict[str, Any]:
        """Whether the job holds its node(s) alone (for the timed pass's record)."""
        ...


@dataclass(frozen=True)
class Packing:
    """How many workers a job's pool runs per node: ``per_gpu`` pinned to each granted
    accelerator, or ``cpu_workers`` (None: ``fleet/cpu_workers``) where none was granted;
    ``record`` says where the figure came from (``calibrate.workers_for``), for the log
    and the job's telemetry record."""

    per_gpu: int = 1
    cpu_workers: int | None = None
    record: dict[str, Any] = field(default_factory=lambda: {"source": "default: one worker per GPU"})

    def per_node(self, fleet: FleetSpec, grant: Grant) -> int:
        """Worker processes on each node of ``grant``'s allocation."""
        if grant.accelerators:
            return len(grant.accelerators) * self.per_gpu
        return self.cpu_workers or fleet.cpu_workers

    def accelerators(self, grant: Grant) -> list[str]:
        """What Parsl pins its workers to, ``per_gpu`` entries per granted device (see
        ``PIN_SUFFIX``)."""
        if self.per_gpu == 1:
            return list(grant.accelerators)
        return [a + PIN_SUFFIX for a in grant.accelerators for _ in range(self.per_gpu)]


ONE_PER_GPU = Packing()
"""Today's pool: one worker per granted GPU, ``fleet/cpu_workers`` on CPU."""

PIN_SUFFIX = ",-1"
"""Appended to a device name Parsl pins more than one worker to. Parsl's worker
(``process_worker_pool.worker``) reads ``nvidia-smi -L``'s device count and, where it
can, rewrites an integer name ``a`` as ``a // (workers // devices)`` (its MPS
convention, which maps a repeated list such as 0,0,1,1 onto 0,0,0,0); a name that is no
integer is set as given. ``CUDA_VISIBLE_DEVICES=1,-1`` is device 1 alone (CUDA stops at
the first invalid index), so the worker sees exactly its device. ``slot_gpu`` strips it."""


def worker_init(grant: Grant, watchdog: bool) -> str:
    """The shell lines run before a pool starts: this interpreter's bin/ first on PATH
    (workers find ``process_worker_pool.py`` and import the driver's environment), the
    GPU map of the driver's node, and with ``watchdog`` a process in the pool's group
    that ends the pool when the driver dies (``orphans``; on one node only)."""
    bindir = Path(sys.executable).parent
    gmap = ",".join(f"{v}={p}" for v, p in grant.gpus.items())
    line = (f"export PATH={shlex.quote(str(bindir))}:$PATH {GPU_MAP_VAR}={shlex.quote(gmap)}"
            + (f" {GPU_MAP_HOST_VAR}={shlex.quote(node_name(os.environ))}" if grant.nodes > 1 else ""))
    return line + ("\n" + orphans.watch_command(os.getpid()) if watchdog else "")


WORKER_PORTS = (54000, 55000)
"""Where the interchange binds its worker port (Parsl's default range), trying ports at
random until one binds."""

POOL_SCRIPT = "process_worker_pool.py "
"""How Parsl's default launch command starts a pool (``launch_command`` replaces it)."""


def worker_start(fleet: FleetSpec, grant: Grant) -> str:
    """How this job's pools start their workers: ``fleet.worker_start``, with ``auto`` (the
    default) resolved to ``forkserver`` where the job was granted no GPU and ``spawn``
    where it was. A process forked after CUDA was initialised cannot use CUDA, and the
    fork server's imports reach CUDA on a GPU node (bitsandbytes, which pyiqa and
    diffusers' quantizers import, asks torch for the device's capability when CUDA is
    visible); ``preload`` hides the GPUs while it imports, but that has not run on a GPU
    yet, so GPU jobs fork only when ``forkserver`` is asked for by name."""
    if fleet.worker_start == "auto":
        return "spawn" if grant.accelerators else "forkserver"
    return fleet.worker_start


def launch_command(fleet: FleetSpec, grant: Grant, port_file: Path) -> str:
    """The pool's launch command: Parsl's default with its pool script replaced by
    ``python -m pairflow.fleet.workerpool --start=<worker_start> --port-file=<port_file>``
    (workers forked from a preloaded fork server, or spawned, each ending with its pool
    manager; the interchange's port read from ``port_file``), every argument and
    placeholder kept. Raises ConfigError where this Parsl's default command differs."""
    # lazy: Parsl's executors take 1-3 s to import; only a job that starts a pool pays for it
    from parsl.executors.high_throughput.executor import DEFAULT_LAUNCH_CMD

    if not DEFAULT_LAUNCH_CMD.startswith(POOL_SCRIPT):
        raise ConfigError(f"PairFlow's worker pools need Parsl's launch command to start with "
                          f"{POOL_SCRIPT.strip()!r}; this Parsl's is {DEFAULT_LAUNCH_CMD[:60]!r}...: install the "
                          "Parsl version envs/pairflow.yaml pins")
    file = shlex.quote(str(port_file)).replace("{", "{{").replace("}", "}}")  # Parsl formats the command
    start = f"{workerpool.START_OPTION}{worker_start(fleet, grant)}"
    return (f"{shlex.quote(sys.executable)} -m {workerpool.__name__} {start} {workerpool.PORT_FILE_OPTION}{file} "
            + DEFAULT_LAUNCH_CMD[len(POOL_SCRIPT):])


def parsl_config(run_dir: Path, fleet: FleetSpec, grant: Grant, provider: ExecutionProvider,
                 packing: Packing = ONE_PER_GPU) -> Config:
    """The Config every site runs: one HighThroughputExecutor (label ``slots``; its
    subclass ``executor.EarlyPoolExecutor``, which launches the pool while the interchange
    starts) over ``provider``, ``packing.per_gpu`` workers on each granted accelerator of
    each node, else ``packing.cpu_workers`` (default ``fleet.cpu_workers``) per node."""
    # lazy: Parsl's executors take 1-3 s to import: only a job that starts a pool pays for it
    # (``pairflow status`` and the timed pass import this package and never do).
    from parsl.addresses import address_by_hostname
    from parsl.config import Config

    from ..executor import EarlyPoolExecutor, port_file

    acc = packing.accelerators(grant)
    bindir = Path(sys.executable).parent
    address = "127.0.0.1" if grant.nodes == 1 else address_by_hostname()
    ports = port_file(run_dir, os.getpid())
    executor = EarlyPoolExecutor(
        label="slots",
        # The pool waits for the interchange's port in ``ports`` (executor), so it is
        # launched while the interchange starts.
        launch_cmd=launch_command(fleet, grant, ports),
        # The driver may run without the venv activated (.venv/bin/snakemake): name
        # Parsl's interchange script by its full path in this interpreter's bin/.
        # It gets the kernel's parent-death signal, so it ends with the driver (orphans).
        interchange_launch_cmd=orphans.exec_command(os.getpid(), [str(bindir / "interchange.py")]),
        # One node: loopback, no interface probing. Several: workers dial this host.
        address=address,
        # The interchange binds a free port of this range itself (no race: executor).
        worker_port_range=WORKER_PORTS,
        max_workers_per_node=packing.per_node(fleet, grant),  # per_gpu slots per accelerator, else CPU workers
        available_accelerators=acc,            # Parsl pins each worker to one entry: one granted device
        cpu_affinity="block" if not acc else "none",  # keep CPU workers off each other's cores
        heartbeat_period=5, heartbeat_threshold=20,  # notice a killed worker in ~20 s, not minutes
        worker_logdir_root=str(run_dir / "workers"),
        provider=provider,
    )
    executor.port_file = ports
    return Config(executors=[executor], retries=fleet.retries, run_dir=str(run_dir / "parsl"),
                  # "simple" scales an idle block in after max_idletime, returning unused
                  # allocation; a lost manager then does not fail every later task.
                  strategy="simple", max_idletime=float(fleet.idle_timeout_s),
                  # The strategy's first tick launches the init block: at Parsl's default
                  # period (5 s) every job waited 5 s before its pool even began to start.
                  strategy_period=STRATEGY_PERIOD_S,
                  initialize_logging=False, usage_tracking=0)


def node_name(environ: Mapping[str, str]) -> str:
    """The node a process runs on, as its scheduler names it (``SLURMD_NODENAME``), else
    the host name. Slots are named by it: several Slurm nodes may share one host name
    (the CI's two-node cluster on one machine), never one node name."""
    return next((environ[v] for v in NODE_NAME_VARS if environ.get(v)), None) or socket.gethostname()


def slot_gpu(environ: Mapping[str, str], host: str) -> str | None:
    """The physical GPU a worker process uses, from its own environment: its
    ``CUDA_VISIBLE_DEVICES`` (Parsl set it to one granted device) through the driver
    node's GPU map. On another node of a multi-node job the map is the driver's, so the
    node's own step GPUs (``SLURM_STEP_GPUS``, in the same order) name the device; where
    neither fits, the visible name itself. None for a CPU worker."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    pairs = [p.split("=", 1) for p in environ.get(GPU_MAP_VAR, "").split(",") if "=" in p]
    gmap = dict(pairs)
    map_host = environ.get(GPU_MAP_HOST_VAR)
    if visible is None or visible == "":
        return visible
    visible = visible.removesuffix(PIN_SUFFIX)
    if map_host and map_host != host:
        order = [v for v, _ in pairs]
        step = [g for g in environ.get("SLURM_STEP_GPUS", "").split(",") if g]
        return step[order.index(visible)] if visible in order and len(step) == len(order) else visible
    return gmap.get(visible, visible)
