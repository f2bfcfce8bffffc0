from __future__ import annotations

import json
from pathlib import Path

import pytest

from pairflow.errors import IntegrityError
from pairflow.records import build_manifest, read_record, seal, verify_manifest, write_manifest, write_record


def flip_byte(path: Path, offset: int = -10) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_record_round_trip_and_self_digest(tmp_path: Path) -> None:
    rec = write_record(tmp_path / "r.json", {"a": 1, "scores": {"x": 0.5}})
    assert rec["record_digest"].startswith("xxh3_128:")
    assert read_record(tmp_path / "r.json") == rec
    assert seal(rec) == rec  # sealing is idempotent


def test_flipped_value_in_a_record_is_caught(tmp_path: Path) -> None:
    write_record(tmp_path / "r.json", {"a": 1, "value": 0.5})
    text = (tmp_path / "r.json").read_text().replace("0.5", "0.6")
    (tmp_path / "r.json").write_text(text)
    with pytest.raises(IntegrityError, match="r.json: record digest mismatch"):
        read_record(tmp_path / "r.json")


def test_garbage_and_missing_records_name_the_file(tmp_path: Path) -> None:
    write_record(tmp_path / "r.json", {"a": 1})
    flip_byte(tmp_path / "r.json", 0)  # '{' becomes 'z'
    with pytest.raises(IntegrityError, match="r.json: record is not valid JSON"):
        read_record(tmp_path / "r.json")
    with pytest.raises(IntegrityError, match="missing.json: record is missing"):
        read_record(tmp_path / "missing.json")


def test_manifest_root_changes_when_any_record_changes(tmp_path: Path) -> None:
    files = []
    for i in range(3):
        write_record(tmp_path / f"r{i}.json", {"i": i})
        files.append(tmp_path / f"r{i}.json")
    root = build_manifest("panel", tmp_path, files)["root_digest"]
    for f in files:
        original = f.read_bytes()
        write_record(f, {"i": 99})
        assert build_manifest("panel", tmp_path, files)["root_digest"] != root, f
        f.write_bytes(original)
    assert build_manifest("panel", tmp_path, files)["root_digest"] == root


def test_verify_manifest_names_mismatch_and_missing(tmp_path: Path) -> None:
    for i in range(2):
        write_record(tmp_path / f"r{i}.json", {"i": i})
    write_manifest(tmp_path / "m.json", build_manifest("panel", tmp_path, [tmp_path / "r0.json", tmp_path / "r1.json"]))
    assert verify_manifest(tmp_path / "m.json") == []
    flip_byte(tmp_path / "r0.json")
    (tmp_path / "r1.json").unlink()
    problems = verify_manifest(tmp_path / "m.json")
    assert any("r0.json: digest" in p for p in problems)
    assert any("r1.json: missing" in p for p in problems)
    m = json.loads((tmp_path / "m.json").read_text())
    m["files"]["r0.json"] = "xxh3_128:" + "0" * 32
    (tmp_path / "m.json").write_text(json.dumps(m))
    assert any("root digest mismatch" in p for p in verify_manifest(tmp_path / "m.json"))
