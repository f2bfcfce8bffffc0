"""Progress a running task reports, so the job's stall check sees work, not a live thread.

Code that does a unit of real work calls ``report(what)``: a denoising step finished
(``generate``), a frame encoded (``video.encode``, from ffmpeg's ``-progress`` output), a
metric scored (``scoring.score``). Inside a Parsl task, ``fleet.traced`` installs a sink
that touches the worker's heartbeat file; elsewhere (tests, the CLI) ``report`` does
nothing. A task blocked anywhere (a hung ffmpeg, a deadlocked kernel) reports nothing,
and the driver's stall check (``fleet.stall_timeout_s``) ends the job.

This module imports nothing of the project: every layer may call it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

LOG_ONLY = "pairflow_log_only"
"""Set on a log record (``extra={LOG_ONLY: True}``) to keep it in the job's log and off the
console that a job's progress lines also reach (e.g. the 57-line Parsl config)."""

_lock = threading.Lock()
_sink: Callable[[str], None] | None = None


def report(what: str) -> None:
    """Say that a unit of work just finished (``what``: e.g. ``"denoising step 3/20"``).
    Cheap and thread-safe; a sink's errors never reach the caller's work."""
    sink = _sink
    if sink is not None:
        with _lock, contextlib.suppress(OSError):
            sink(what)


@contextlib.contextmanager
def reporting_to(sink: Callable[[str], None]) -> Iterator[None]:
    """Send this process's ``report`` calls to ``sink`` inside the block (one task)."""
    global _sink
    previous, _sink = _sink, sink
    try:
        yield
    finally:
        _sink = previous
