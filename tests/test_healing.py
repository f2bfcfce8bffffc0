"""The plan-time memo's signature (``healing._signature``): a stat per file, which every
write through the filesystem changes, even with size and mtime put back."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pairflow.evidence.healing import _signature
from pairflow.evidence.verification import named
from pairflow.layout import Layout
from pairflow.plan.candidates import candidates
from pairflow.plan.config import study_from_raw


def _tree(tmp_path: Path) -> tuple[Path, Path, Path]:
    panel = tmp_path / "panels" / "t"
    (panel / "records" / "control").mkdir(parents=True)
    record = panel / "records" / "control" / "a1-s0.json"
    record.write_text('{"kind": "generation", "x": 1}\n')
    manifest = panel / "generation.json"
    manifest.write_text("{}\n")
    return panel, record, manifest


def _sig(panel: Path, manifest: Path) -> str:
    return _signature((manifest,), (panel / "records", panel / "videos"))


def _edit_keeping_size_and_mtime(path: Path, old: bytes, new: bytes) -> None:
    time.sleep(0.03)  # past the kernel's timestamp tick (a few ms) since the file was written
    st = path.stat()
    data = path.read_bytes()
    assert len(old) == len(new) and old in data
    with open(path, "r+b") as fh:
        fh.seek(data.index(old))
        fh.write(new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # as touch -r, rsync -t
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def test_signature_is_stable_while_nothing_is_written(tmp_path: Path) -> None:
    panel, _, manifest = _tree(tmp_path)
    assert _sig(panel, manifest) == _sig(panel, manifest)


def test_an_edit_in_place_with_size_and_mtime_restored_changes_the_signature(tmp_path: Path) -> None:
    panel, record, manifest = _tree(tmp_path)
    before = _sig(panel, manifest)
    _edit_keeping_size_and_mtime(record, b'"x": 1', b'"x": 2')  # ctime moves: the kernel sets it
    assert _sig(panel, manifest) != before
    before = _sig(panel, manifest)
    _edit_keeping_size_and_mtime(manifest, b"{}", b"[]")
    assert _sig(panel, manifest) != before


def test_a_file_renamed_over_a_record_changes_the_signature(tmp_path: Path) -> None:
    panel, record, manifest = _tree(tmp_path)
    st = record.stat()
    before = _sig(panel, manifest)
    other = tmp_path / "other.json"
    other.write_bytes(record.read_bytes())
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, record)  # same bytes, size and mtime: another inode
    assert _sig(panel, manifest) != before


def test_added_removed_and_symlinked_files_change_the_signature(tmp_path: Path) -> None:
    panel, record, manifest = _tree(tmp_path)
    before = _sig(panel, manifest)
    extra = panel / "records" / "control" / "a2-s0.json"
    extra.write_text("{}\n")
    with_extra = _sig(panel, manifest)
    assert with_extra != before
    extra.unlink()
    extra.symlink_to(record)
    assert _sig(panel, manifest) not in (before, with_extra)
    extra.unlink()
    manifest.unlink()
    assert _sig(panel, manifest) not in (before, with_extra)


def test_the_check_names_candidate_files_as_the_layout_does(tmp_path: Path) -> None:
    """``verification.named`` builds the paths as strings; they are the layout's."""
    (tmp_path / "p.tsv").write_text("prompt_id\tprompt\na1\tone\nb-2\ttwo\n")
    (tmp_path / "model").mkdir()
    study = study_from_raw({"study": "s", "model": {"kind": "local", "path": "model"},
                            "arms": {"control": {"cache": None}, "t": {"cache": None, "steps": 4}},
                            "panels": {"p_1": {"sheet": "p.tsv", "seeds": [0, 7]}}}, tmp_path)
    layout, cands = Layout(study.scratch), candidates(study, study.panels[0])
    for kind in ("records", "videos", "scores", "timing"):
        assert named(layout, "p_1", kind, cands) == [str(layout.output("p_1", kind, c.arm.name, c.stem))
                                                     for c in cands]
