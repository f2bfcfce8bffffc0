"""The local site: this machine, no scheduler. One worker pool, started by a shell.

Provider ``LocalProvider`` (runs the block's command here) → launcher
``SingleNodeLauncher`` (one pool) → the shared executor (``base.parsl_config``).
Exclusivity: the local rule takes every core, so Snakemake runs nothing beside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .accelerators import discover
from .base import Grant

if TYPE_CHECKING:
    from parsl.providers.base import ExecutionProvider


@dataclass(frozen=True)
class LocalSite:
    """This machine; always applies (the last site ``auto`` tries)."""

    name: str = "local"
    priority: int = 0  # applies everywhere: the last site auto tries

    def applies(self, environ: Mapping[str, str]) -> bool:
        return True

    def grant(self, environ: Mapping[str, str], torch_count: int | None) -> Grant:
        acc = discover(environ, torch_count)
        return Grant(acc.visible, None, dict(acc.physical), self.name)

    def provider(self, grant: Grant, worker_init: str) -> ExecutionProvider:
        from parsl.launchers import SingleNodeLauncher  # Parsl's providers: 1-3 s to import, only for a pool
        from parsl.providers import LocalProvider

        return LocalProvider(
            launcher=SingleNodeLauncher(),
            nodes_per_block=1,
            # Exactly one block: this machine. min 0 lets the idle timeout release it.
            init_blocks=1, min_blocks=0, max_blocks=1,
            worker_init=worker_init,
        )

    def exclusivity(self, grant: Grant) -> dict[str, Any]:
        return local_exclusivity()


def local_exclusivity() -> dict[str, Any]:
    """The local rule took every core of this machine (``exclusivity`` outside a scheduler)."""
    return {"scheduler": "local", "exclusive": None,
            "how": "the rule takes every core of this machine, so Snakemake runs nothing beside it"}


SITE = LocalSite()
"""This module's site (``sites.SITES`` finds it)."""
