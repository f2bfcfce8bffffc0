"""Atomic file and directory writes: temp name in the same directory, fsync, rename.

No half-written file is ever visible under a final name: a crash or a kill leaves at
most a ``.tmp-*`` sibling, which readers ignore and the next write replaces.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .errors import StorageError

TMP_PREFIX = ".tmp-"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``final``; on success fsync it and rename over ``final``.

    On any exception the temporary file is removed and ``final`` is untouched.
    """
    final = Path(final)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=TMP_PREFIX + final.name + ".", suffix=final.suffix,
                                    dir=final.parent)
    except OSError as e:
        if e.errno in FULL:
            raise no_space(final, e) from e
        raise
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        _fsync_dir(final.parent)
    except OSError as e:
        if e.errno in FULL:
            raise no_space(final, e) from e
        raise
    finally:
        tmp.unlink(missing_ok=True)


FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
"""Errors that mean the storage is full, over quota, or over a file-size limit."""


def no_space(final: Path, cause: BaseException | str) -> StorageError:
    """The error for a write that ran out of space; nothing is left under ``final``."""
    return StorageError(f"no space left on device writing {final} ({cause}); nothing was written under "
                        f"that name. Free space on {final.parent} (or raise the quota) and rerun: completed "
                        "candidates are kept")


def write_bytes(final: Path, data: bytes) -> None:
    """Atomically write ``data`` to ``final``."""
    with atomic_path(final) as tmp:
        tmp.write_bytes(data)


def write_text(final: Path, text: str) -> None:
    """Atomically write UTF-8 ``text`` to ``final``."""
    write_bytes(final, text.encode("utf-8"))


@contextlib.contextmanager
def replace_dir(final: Path) -> Iterator[Path]:
    """Yield a fresh temporary directory beside ``final``; on success swap it in.

    The old directory (if any) is removed only after the new one is complete.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX + final.name + ".", dir=final.parent))
    old = final.with_name(TMP_PREFIX + final.name + ".old")
    try:
        yield tmp
        for root, _dirs, files in os.walk(tmp):
            for f in files:
                with open(os.path.join(root, f), "rb") as fh:
                    os.fsync(fh.fileno())
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
