"""The one seam to external tools (ffmpeg): argv lists, a timeout derived from the work,
stdin fed without a deadlock, a hung tool killed and named."""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, cast

from .. import progress
from ..errors import (
    ToolTimeoutError,
)

TOOL_TIMEOUT_FLOOR_S = 120.0
"""Every ffmpeg run may take at least this long, however little its work (start-up on a
loaded node, a slow file system)."""
TOOL_TIMEOUT_S_PER_PIXEL = 1e-6
"""...plus this much per pixel it reads or writes: 1 M pixels/s, about 30x slower than
the project's recipe encodes 832x480 on two cores (BENCHMARKS.md), so only a hung or
pathologically slow tool reaches it."""


def tool_timeout(frames: int, height: int, width: int) -> float:
    """Seconds an ffmpeg run over ``frames`` frames of ``width`` x ``height`` may take
    (``TOOL_TIMEOUT_FLOOR_S`` + ``TOOL_TIMEOUT_S_PER_PIXEL`` per pixel)."""
    return TOOL_TIMEOUT_FLOOR_S + frames * height * width * TOOL_TIMEOUT_S_PER_PIXEL


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """Kill ``proc`` if it still runs, reap it and close its pipes."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _timed_out(argv: list[str], path: Path, timeout_s: float, bound: str = "") -> ToolTimeoutError:
    name = Path(argv[0]).name
    bound = bound or (f"derived from the work: {TOOL_TIMEOUT_FLOOR_S:.0f} s + {TOOL_TIMEOUT_S_PER_PIXEL:g} s per "
                      "pixel")
    return ToolTimeoutError(
        f"{path}: {name} ran past its {timeout_s:.0f} s timeout ({bound}) and was killed; command: "
        f"{subprocess.list2cmdline(argv)[:2000]}. The tool hung or the node is overloaded: run that command "
        "by hand to see which (set 'encoder/ffmpeg' to a working ffmpeg, or leave it empty for the bundled "
        "one), then rerun")


def _pidfd(pid: int) -> int:
    """A pidfd of ``pid`` (readable once it exits), or -1 where the OS gives none."""
    try:
        return os.pidfd_open(pid) if hasattr(os, "pidfd_open") else -1
    except OSError:  # ENOSYS before Linux 5.3, EPERM under some seccomp profiles
        return -1


WRITE_BYTES = 1 << 20
"""The most ``run_tool`` writes to a tool's stdin per wake-up (a pipe takes 64 KiB)."""


def run_tool(argv: list[str], path: Path, timeout_s: float, feed: memoryview | None = None,
             chunk: int = 1 << 20, progress_lines: bool = False,
             at_end: Callable[[], object] | None = None, bound: str = "") -> tuple[int, bytes, bytes]:
    """Run an external tool (argv, no shell) about ``path``, feeding it ``feed`` on stdin;
    return (exit code, stderr, stdout).

    Every ``chunk`` bytes the tool consumes are reported as progress (``progress.report``),
    and with ``progress_lines`` so is each ``frame=N`` line on its stdout (ffmpeg's
    ``-progress pipe:1``), so the job's stall check sees the work advance. With
    ``progress_lines``, ``at_end`` is called once when the tool writes ``progress=end``
    (ffmpeg writes it after closing its outputs, then tears down and exits: work on the
    output overlaps that); it must not raise what it means the caller to see before the
    exit code. After ``timeout_s`` the tool is killed and ToolTimeoutError names the
    file, the command, where the limit came from (``bound``; default ``tool_timeout``'s
    derivation) and the fix.

    One loop over a selector, as ``Popen.communicate`` does, but reporting progress while
    it runs (``communicate`` says nothing until the tool ends). Not threads: starting the
    three a tool needs cost about 10 ms beside a starting tool, and ``wait(timeout=)``
    polls with sleeps of up to 50 ms (measured at 64x64: 37 ms per write against bare
    ffmpeg's 22 ms with both; 26 ms without)."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE if feed is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    name = Path(argv[0]).name
    deadline = time.monotonic() + timeout_s
    out_fd, err_fd = cast(IO[bytes], proc.stdout).fileno(), cast(IO[bytes], proc.stderr).fileno()
    chunks: dict[int, list[bytes]] = {out_fd: [], err_fd: []}
    line = bytearray()  # the part of stdout's last line not yet ended
    view = feed if feed is not None else memoryview(b"")
    sent = reported = 0
    # The tool's exit as an event of the same loop (Linux's pidfd): ``wait(timeout=)``
    # after its pipes close would poll with sleeps from 0.5 ms up. Where there is no pidfd
    # (another OS, a kernel before 5.3, a seccomp filter) the pipes' end is the signal.
    pid_fd = _pidfd(proc.pid)
    try:
        with selectors.DefaultSelector() as sel:
            for fd in chunks:
                sel.register(fd, selectors.EVENT_READ)
            if pid_fd >= 0:
                sel.register(pid_fd, selectors.EVENT_READ)
            stdin = proc.stdin
            in_fd = stdin.fileno() if stdin is not None else -1
            if stdin is not None:
                os.set_blocking(in_fd, False)
                sel.register(in_fd, selectors.EVENT_WRITE)
            while sel.get_map():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _timed_out(argv, path, timeout_s, bound)
                for key, _ in sel.select(remaining):
                    fd = int(key.fd)
                    if fd == in_fd:
                        try:
                            # As much as the pipe takes: writing a chunk (a frame) per
                            # wake-up cost 0.5 ms of a 21 ms encode at 64x64.
                            sent += os.write(fd, view[sent:sent + WRITE_BYTES])
                        except BlockingIOError:
                            continue
                        except OSError:  # the tool exited early (a broken pipe): its exit code and stderr say why
                            sent = reported = len(view)
                            progress.report(f"{name}: consumed {sent} of {len(view)} bytes for {path.name}")
                        while sent - reported >= chunk or (sent == len(view) and reported < sent):
                            reported = min(reported + chunk, sent)  # one report per chunk, as before
                            progress.report(f"{name}: consumed {reported} of {len(view)} bytes for {path.name}")
                        if sent == len(view):
                            sel.unregister(fd)
                            cast(IO[bytes], stdin).close()
                        continue
                    if fd == pid_fd:
                        sel.unregister(fd)
                        continue
                    data = os.read(fd, 1 << 16)
                    if not data:
                        sel.unregister(fd)
                        continue
                    chunks[fd].append(data)
                    if progress_lines and fd == out_fd:
                        line += data
                        *done, rest = bytes(line).split(b"\n")
                        line[:] = rest
                        for text in done:
                            if text.startswith(b"frame="):
                                progress.report(f"{name}: {text.decode(errors='replace').strip()} of {path.name}")
                            elif text.strip() == b"progress=end" and at_end is not None:
                                at_end()
                                at_end = None
        try:
            code = proc.wait(max(deadline - time.monotonic(), 1.0))  # it closed its output: it is ending
        except subprocess.TimeoutExpired:
            raise _timed_out(argv, path, timeout_s, bound) from None
    finally:
        # Whatever ends the loop (a timeout, SIGTERM's exception, an interrupt), the tool
        # does not outlive it and no descriptor leaks.
        if pid_fd >= 0:
            os.close(pid_fd)
        _kill(proc)
    return code, b"".join(chunks[err_fd]), b"".join(chunks[out_fd])
