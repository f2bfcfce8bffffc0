"""The executor every site runs: Parsl's HighThroughputExecutor, with its first block
launched while its interchange starts (``EarlyPoolExecutor``), not after.

Parsl's ``start`` starts the interchange (a fresh interpreter importing Parsl, 0.8-1.0 s
on a 2-core machine, BENCHMARKS.md issue 25), waits until it has bound its worker port,
and only then composes the pool's launch command (it names that port); the strategy's
first tick launches the block. The pool's start-up (under ``fleet.worker_start:
forkserver`` its fork server importing torch, diffusers and pyiqa, the longest link of a
panel job's start-up) therefore began only once the interchange was up. Here the worker
port is fixed up front (``free_port``), so the launch command is complete before the
interchange starts, and the init blocks are launched first: the pool's manager waits for
the interchange by itself (Parsl's address probe: 30 s) while its fork server imports.
Everything else is Parsl's: the strategy's first tick finds the init blocks launched, and
later scaling (a block that died) is Parsl's as before. Imported only by a job that
starts a pool (Parsl takes 1-3 s to import).
"""

from __future__ import annotations

import socket

from parsl.executors import HighThroughputExecutor

from ..errors import ConfigError


def free_port(address: str) -> int:
    """A TCP port free on ``address`` now (the kernel's pick), for the interchange to
    bind about a second later. A process that takes it in between makes the interchange
    fail to start, and the job fails as Parsl reports that (rare: the kernel hands out
    ports in turn)."""
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


class EarlyPoolExecutor(HighThroughputExecutor):
    """A HighThroughputExecutor (same arguments, ``worker_port`` required) that launches
    its init blocks before it starts its interchange."""

    # Not in __init__: Parsl's repr (RepresentationMixin) reads the inherited constructor's signature.
    _early_blocks = 0
    _scaling_ready = False

    def _start_local_interchange_process(self) -> None:
        if not self.worker_port:
            raise ConfigError(f"EarlyPoolExecutor {self.label!r} has worker_port={self.worker_port!r}: the pool's "
                              "launch command names the port before the interchange starts; build the executor "
                              "with sites.make_config, which fixes a free one (fleet.executor.free_port)")
        self.initialize_scaling()  # every value of the launch command is known: the port is fixed
        provider = self.provider
        if provider is not None and provider.init_blocks:
            self._early_blocks = len(self.scale_out_facade(provider.init_blocks))
        super()._start_local_interchange_process()

    def initialize_scaling(self) -> None:
        """Compose the launch command once (``start`` calls this again after the interchange)."""
        if not self._scaling_ready:
            super().initialize_scaling()  # type: ignore[no-untyped-call]  # Parsl leaves it untyped
            self._scaling_ready = True

    def scale_out_facade(self, n: int) -> list[str]:
        """Parsl's, except that the strategy's first tick (the init blocks) is already done."""
        early, self._early_blocks = self._early_blocks, 0
        return super().scale_out_facade(n - early) if n > early else []
