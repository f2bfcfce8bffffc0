"""Atomic file and directory writes: temp name in the same directory, fsync, rename.

No half-written file is ever visible under a final name. A crash or a kill can leave a
``.tmp-*`` sibling behind: readers (records, manifests, ``pairflow verify``) ignore it,
and every job sweeps the ``.tmp-*`` files older than itself from the folders it writes
(``sweep_temps``); ``pairflow verify`` lists any that remain as safe to delete.

Files and directories are created with the mode the process umask allows (``umask
002`` gives group-readable evidence), not ``tempfile``'s private 0600/0700.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from .errors import StorageError

TMP_PREFIX = ".tmp-"
_UMASK_LOCK = threading.Lock()


def umask() -> int:
    """The process umask. POSIX can only read it by setting it, so set and restore it
    under a lock (no other thread of ours changes it)."""
    with _UMASK_LOCK:
        mask = os.umask(0o077)
        os.umask(mask)
    return mask


def _open_mode(path: Path, directory: bool = False) -> None:
    """Give a temp file (0600) or dir (0700) from ``tempfile`` the mode a plain
    ``open``/``mkdir`` would have had under the umask, before it takes a final name."""
    os.chmod(path, (0o777 if directory else 0o666) & ~umask())


def sweep_temps(folders: Iterable[Path], older_than: float) -> list[Path]:
    """Remove ``.tmp-*`` files and directories directly in ``folders`` last modified
    before ``older_than`` (epoch seconds; a job passes its own start time, so a temp a
    live writer is filling, which is newer, is left alone). Returns what was removed."""
    removed = []
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            continue
        for e in entries:
            if not e.name.startswith(TMP_PREFIX):
                continue
            try:
                if e.stat(follow_symlinks=False).st_mtime >= older_than:
                    continue
                if e.is_dir(follow_symlinks=False):
                    shutil.rmtree(e.path)
                else:
                    os.unlink(e.path)
            except FileNotFoundError:
                continue
            removed.append(Path(e.path))
    return removed


def job_start() -> float:
    """A job's start time for ``sweep_temps`` (one second of slack for coarse mtimes)."""
    return time.time() - 1.0


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(final: Path, *, create: bool = True, fsync: bool = True, clobber: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside ``final``; on success fsync it and rename over ``final``,
    then fsync the directory.

    ``create=False`` yields a fresh name (64 random bits) without creating the file, for a
    tool that creates its output itself (ffmpeg opens it with mode 0666 under the umask,
    as ``open`` does): it saves creating the file twice and a chmod. ``fsync=False``: the
    caller has fsynced the file's data before the block ends (to overlap it with other
    work), so it is not fsynced again; the directory still is, after the rename.
    ``clobber=False`` never replaces an existing ``final``: the temp file is hard-linked
    to it, which raises FileExistsError where the name is taken (a racing writer's file
    stays as it was).
    On any exception the temporary file is removed and ``final`` is untouched.
    """
    final = Path(final)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        if create:
            fd, name = tempfile.mkstemp(prefix=TMP_PREFIX + final.name + ".", suffix=final.suffix,
                                        dir=final.parent)
            os.close(fd)
        else:
            name = str(final.parent / f"{TMP_PREFIX}{final.name}.{secrets.token_hex(8)}{final.suffix}")
    except OSError as e:
        if e.errno in FULL:
            raise no_space(final, e) from e
        raise
    tmp = Path(name)
    try:
        if create:
            _open_mode(tmp)
        yield tmp
        if fsync:
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        if clobber:
            os.replace(tmp, final)
        else:
            os.link(tmp, final)  # atomic create-if-absent; the temp name goes in finally
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


def write_new(final: Path, data: bytes) -> bool:
    """Atomically create ``final`` holding ``data`` unless it exists, never replacing it.
    True when this call created it, False when it was already there (an earlier run's, or
    a racing writer's: whichever linked first wins, whole)."""
    try:
        with atomic_path(final, clobber=False) as tmp:
            tmp.write_bytes(data)
    except FileExistsError:
        return False
    return True


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
        _open_mode(tmp, directory=True)
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
