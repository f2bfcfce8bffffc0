"""A panel job's study context: written once, read once per worker, named by its digest.

Parsl serialises every task's arguments with dill in the driver. A task that carries the
whole study (every panel's prompts, the raw config, provenance) costs bytes and driver
time that grow with the study, once per task: the square of the study in all. Instead the
driver pickles what every task of a job shares (the ``StudySpec``, the provenance, the
scorer build) into ``<scratch>/contexts/<hex>.pkl``, named by the xxh3 digest of its
bytes, and a task carries only its candidate and a ``ContextRef``. A worker reads the
file once, checks its bytes against the digest, and keeps it for the process's next task.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..atomic import write_bytes
from ..errors import IntegrityError
from ..identity import digest_bytes
from ..layout import Layout

_LOADED: dict[str, dict[str, Any]] = {}
"""This process's contexts, by digest (a worker reads each file once)."""


@dataclass(frozen=True)
class ContextRef:
    """Where a job's shared context lies and the digest its bytes must have."""

    path: str
    digest: str


def write_context(scratch: Path, shared: dict[str, Any]) -> ContextRef:
    """Pickle ``shared`` under ``scratch/contexts/`` (atomically, named by its digest) and
    return its reference. Rewriting an identical context is a no-op."""
    data = pickle.dumps(shared, protocol=pickle.HIGHEST_PROTOCOL)
    digest = digest_bytes(data)
    path = Layout(scratch).contexts / f"{digest.split(':', 1)[1]}.pkl"
    if not path.exists() or path.stat().st_size != len(data):
        write_bytes(path, data)
    _LOADED[digest] = shared  # the driver has it already (tasks run in-process in tests too)
    return ContextRef(str(path), digest)


def load_context(ref: ContextRef) -> dict[str, Any]:
    """The context ``ref`` names, read and digest-checked on this process's first use.

    Raises IntegrityError naming the file, both digests and the fix when the file was
    altered or replaced after the driver wrote it."""
    if ref.digest in _LOADED:
        return _LOADED[ref.digest]
    try:
        data = Path(ref.path).read_bytes()
    except FileNotFoundError as e:
        raise IntegrityError(f"{ref.path}: the job's study context is missing (removed while the job ran?); "
                             "rerun the job, which writes it again") from e
    got = digest_bytes(data)
    if got != ref.digest:
        raise IntegrityError(f"{ref.path}: the job's study context is {got}, but the driver wrote {ref.digest}; "
                             "another process replaced it. Rerun the job")
    _LOADED[ref.digest] = pickle.loads(data)
    return _LOADED[ref.digest]
