"""Exclusive locks on what a job writes, so two runs cannot write the same panel.

``fcntl.flock`` locks die with their process, so a SIGKILLed run leaves no stale lock;
the lock file holds the holder's host and pid for the message the second run gets.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from .errors import LockError


@contextlib.contextmanager
def hold(directory: Path, what: str) -> Iterator[None]:
    """Hold ``directory/.pairflow.lock`` for the block, or raise LockError at once."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / ".pairflow.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = Path(path).read_text(errors="replace").strip() or "unknown"
            raise LockError(f"{what}: {directory} is being written by another run ({holder}); wait "
                            "for it to finish, or point this run at another storage.scratch") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"host {socket.gethostname()} pid {os.getpid()}".encode())
        yield
    finally:
        os.close(fd)
