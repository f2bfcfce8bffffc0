"""The executor every site runs: Parsl's HighThroughputExecutor, with its first block
launched while its interchange starts (``EarlyPoolExecutor``), not after.

Parsl's ``start`` starts the interchange (a fresh interpreter importing Parsl, 0.8-1.0 s
on a 2-core machine, BENCHMARKS.md issue 25), waits until it has bound its worker port,
and only then composes the pool's launch command (it names that port); the strategy's
first tick launches the block. The pool's start-up (under ``fleet.worker_start:
forkserver`` its fork server importing torch, diffusers and pyiqa, the longest link of a
panel job's start-up) therefore began only once the interchange was up. Here the launch
command names a port *file* instead (``workerpool``'s ``--port-file``, the port itself left
``None``), so it is complete before the interchange starts, and the init blocks are
launched first; the interchange binds a free port of ``worker_port_range`` itself
(zmq's ``bind_to_random_port``: bind, and on EADDRINUSE the next, so no other process can
take the port between a choice and a bind), and the port is written to the file once bound.
The pool manager imports Parsl's pool while it waits for the file, its fork server
importing beside it. Before (issue 38), the driver chose a port by binding port 0 and
closing it, and the interchange bound it about a second later: another job's socket on
the same host took it in between in 1 of 16 CI jobs, and the job failed.
Everything else is Parsl's: the strategy's first tick finds the init blocks launched, and
later scaling (a block that died) is Parsl's as before, its launch command reading the
same file. Imported only by a job that starts a pool (Parsl takes 1-3 s to import).
"""

from __future__ import annotations

from pathlib import Path

from parsl.executors import HighThroughputExecutor

from ..atomic import write_text
from ..errors import ConfigError


def port_file(run_dir: Path, pid: int) -> Path:
    """Where the driver ``pid`` of a job running in ``run_dir`` writes its interchange's
    worker port (on the job's shared storage: every node's pool reads it)."""
    return Path(run_dir) / "workers" / f"worker-port-{pid}"


class EarlyPoolExecutor(HighThroughputExecutor):
    """A HighThroughputExecutor (same arguments, no ``worker_port``: the interchange binds
    one from ``worker_port_range``) that launches its init blocks before it starts its
    interchange; ``port_file`` (set after construction, named in the launch command) gets
    the bound port."""

    # Not in __init__: Parsl's repr (RepresentationMixin) reads the inherited constructor's signature.
    _early_blocks = 0
    _scaling_ready = False
    port_file: Path | None = None

    def _start_local_interchange_process(self) -> None:
        if self.port_file is None or self.worker_port:
            raise ConfigError(f"EarlyPoolExecutor {self.label!r} has port_file={self.port_file!r} and worker_port="
                              f"{self.worker_port!r}: its pool's launch command reads the port from a file the "
                              "interchange's port is written to, and the interchange binds a free one itself; build "
                              "the executor with sites.make_config")
        self.port_file.unlink(missing_ok=True)  # a previous job's: this pool must wait for this interchange's
        self.initialize_scaling()  # every value of the launch command is known: the port comes by file
        provider = self.provider
        if provider is not None and provider.init_blocks:
            self._early_blocks = len(self.scale_out_facade(provider.init_blocks))
        super()._start_local_interchange_process()  # sets worker_port: the port the interchange bound
        write_text(self.port_file, str(self.worker_port))

    def initialize_scaling(self) -> None:
        """Compose the launch command once (``start`` calls this again after the interchange)."""
        if not self._scaling_ready:
            super().initialize_scaling()  # type: ignore[no-untyped-call]  # Parsl leaves it untyped
            self._scaling_ready = True

    def scale_out_facade(self, n: int) -> list[str]:
        """Parsl's, except that the strategy's first tick (the init blocks) is already done."""
        early, self._early_blocks = self._early_blocks, 0
        return super().scale_out_facade(n - early) if n > early else []
