"""Atomic writes: modes follow the umask; leftovers of killed writes are swept."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pairflow.atomic import replace_dir, sweep_temps, write_new, write_text


@pytest.mark.parametrize("mask, file_mode, dir_mode", [(0o002, 0o664, 0o775), (0o022, 0o644, 0o755),
                                                       (0o077, 0o600, 0o700)])
def test_outputs_follow_the_process_umask(tmp_path: Path, mask: int, file_mode: int, dir_mode: int) -> None:
    old = os.umask(mask)
    try:
        write_text(tmp_path / "a" / "r.json", "{}\n")
        with replace_dir(tmp_path / "d") as d:
            (d / "x").write_text("x")
    finally:
        os.umask(old)
    assert (tmp_path / "a" / "r.json").stat().st_mode & 0o777 == file_mode
    assert (tmp_path / "d").stat().st_mode & 0o777 == dir_mode


def test_sweep_removes_only_temps_older_than_the_job(tmp_path: Path) -> None:
    """A killed write's ``.tmp-*`` (file or directory) older than the job goes; a newer one
    (a live writer's) and every final name stay."""
    started = time.time()
    old_file, old_dir = tmp_path / ".tmp-r.json.abc.json", tmp_path / ".tmp-d.xyz"
    old_file.write_text('{"half')
    old_dir.mkdir()
    (old_dir / "f").write_text("x")
    for p in (old_file, old_dir):
        os.utime(p, (started - 60, started - 60))
    live, final = tmp_path / ".tmp-s.json.def.json", tmp_path / "r.json"
    live.write_text("{")
    final.write_text("{}")
    os.utime(final, (started - 60, started - 60))
    assert sorted(sweep_temps([tmp_path, tmp_path / "absent"], started)) == [old_dir, old_file]
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name, "r.json"]




def test_write_new_creates_once_and_never_replaces(tmp_path: Path) -> None:
    """``write_new``: the first call creates the file whole; a second (an earlier run's
    file, or a racing writer's) leaves it byte for byte and says so; no temp is left."""
    final = tmp_path / "sub" / "card.json"
    assert write_new(final, b"first\n") is True
    assert write_new(final, b"second\n") is False
    assert final.read_bytes() == b"first\n" and sorted(p.name for p in final.parent.iterdir()) == ["card.json"]
