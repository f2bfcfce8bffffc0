from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
from conftest import generation_record, metric_spec, score_record, timing_record

from pairflow.arms import KINDS, LOADABLE
from pairflow.errors import IntegrityError, RecordSchemaError
from pairflow.identity import digest_obj
from pairflow.records import types as recordtypes
from pairflow.records.store import (
    build_manifest,
    check_schema,
    identical_to_control,
    in_fidelity_mean,
    load_schema,
    read_record,
    seal,
    verify_manifest,
    write_manifest,
    write_record,
)


def note(i: int = 0, **over: object) -> dict:
    """A small complete record (an archive retirement note)."""
    return {"kind": "retirement", "snapshot": f"s{i}", "why": "test", "archive_root_digest": None, "found": [],
            "by": "me@host", "at": "2026-12-01T00:00:00+00:00", **over}


def flip_byte(path: Path, offset: int = -10) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_record_round_trip_and_self_digest(tmp_path: Path) -> None:
    rec = write_record(tmp_path / "r.json", note())
    assert rec["record_digest"].startswith("xxh3_128:")
    assert read_record(tmp_path / "r.json") == rec
    assert seal(rec) == rec  # sealing is idempotent


def test_flipped_value_in_a_record_is_caught(tmp_path: Path) -> None:
    write_record(tmp_path / "r.json", note(why="0.5"))
    text = (tmp_path / "r.json").read_text().replace("0.5", "0.6")
    (tmp_path / "r.json").write_text(text)
    with pytest.raises(IntegrityError, match="r.json: record digest mismatch"):
        read_record(tmp_path / "r.json")


def test_garbage_and_missing_records_name_the_file(tmp_path: Path) -> None:
    write_record(tmp_path / "r.json", note())
    flip_byte(tmp_path / "r.json", 0)  # '{' becomes 'z'
    with pytest.raises(IntegrityError, match="r.json: record is not valid JSON"):
        read_record(tmp_path / "r.json")
    with pytest.raises(IntegrityError, match="missing.json: record is missing"):
        read_record(tmp_path / "missing.json")


def test_manifest_root_changes_when_any_record_changes(tmp_path: Path) -> None:
    files = []
    for i in range(3):
        write_record(tmp_path / f"r{i}.json", note(i))
        files.append(tmp_path / f"r{i}.json")
    root = build_manifest("panel-scores", tmp_path, files)["root_digest"]
    for f in files:
        original = f.read_bytes()
        write_record(f, note(99))
        assert build_manifest("panel-scores", tmp_path, files)["root_digest"] != root, f
        f.write_bytes(original)
    assert build_manifest("panel-scores", tmp_path, files)["root_digest"] == root


def test_verify_manifest_names_mismatch_and_missing(tmp_path: Path) -> None:
    for i in range(2):
        write_record(tmp_path / f"r{i}.json", note(i))
    write_manifest(tmp_path / "m.json", build_manifest("panel-scores", tmp_path, [tmp_path / "r0.json", tmp_path / "r1.json"]))
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


# ---- schemas: one per record kind, validated on write and on read -----------------------

def complete_records() -> dict[str, dict]:
    """One complete record of every kind, shaped as the stages, fleet and archive write them."""
    gen = generation_record("p", "a1", 0, "pab", 7, "v")
    control = generation_record("p", "a1", 0, "control", 7, "c")
    failure = {"kind": "failure", "candidate_id": gen["candidate"]["candidate_id"], "panel": "p", "arm": "pab",
               "prompt_id": "a1", "seed": 0, "label": "generate p", "class": "device_oom",
               "exception": "OutOfMemoryError", "message": "CUDA out of memory", "attempts": 2, "time": 1.0e9,
               "slot": {"host": "h", "device": "cpu0", "name": "h/cpu0", "source": "task", "rank": "0"}}
    return {"generation": gen, "score": score_record(gen, control, {"ssim": (0.9, metric_spec("ssim", "FR"))}),
            "timing": timing_record(gen, 1.5), "failure": failure, "retirement": note()}


def reseal(path: Path, edit: typing.Callable[[dict], None]) -> None:
    """Edit a written record and give it a matching digest: only the schema can refuse it."""
    record = json.loads(path.read_text())
    edit(record)
    body = {k: v for k, v in record.items() if k != "record_digest"}
    path.write_text(json.dumps({**body, "record_digest": digest_obj(body)}))


@pytest.mark.parametrize("kind", recordtypes.RECORD_KINDS)
def test_every_kind_round_trips_through_its_schema(tmp_path: Path, kind: str) -> None:
    record = complete_records()[kind]
    sealed = write_record(tmp_path / "r.json", record)
    assert read_record(tmp_path / "r.json", kind) == sealed == read_record(tmp_path / "r.json")
    other = next(k for k in recordtypes.RECORD_KINDS if k != kind)
    with pytest.raises(RecordSchemaError, match=f"r.json: a '{kind}' record where a '{other}' record belongs"):
        read_record(tmp_path / "r.json", other)  # type: ignore[call-overload]


def test_a_not_sampled_timing_record_fits_and_a_sampled_one_needs_its_measurement(tmp_path: Path) -> None:
    gen = generation_record("p", "a1", 0, "pab", 7, "v")
    write_record(tmp_path / "skip.json", timing_record(gen, None))
    sampled = timing_record(gen, 1.0)
    del sampled["timing"]["seconds"]
    with pytest.raises(RecordSchemaError, match="timing field timing/seconds: required field is missing"):
        write_record(tmp_path / "t.json", sampled)


def test_a_record_missing_a_required_field_is_refused_on_write_and_nothing_is_written(tmp_path: Path) -> None:
    gen = generation_record("p", "a1", 0, "pab", 7, "v")
    del gen["candidate"]["stream_seed"]
    path = tmp_path / "records" / "pab" / "a1-s0.json"
    with pytest.raises(RecordSchemaError) as e:
        write_record(path, gen)
    assert str(e.value).startswith(f"{path}: generation field candidate/stream_seed: required field is missing; "
                                   "refused on write: this is a bug in the code that built it; the schema is ")
    assert str(e.value).endswith("record.generation.schema.yaml")
    assert not path.exists() and not list(tmp_path.rglob("*.json"))


def test_a_wrong_enum_is_refused_on_write_naming_the_value_and_the_allowed_ones(tmp_path: Path) -> None:
    control = generation_record("p", "a1", 0, "control", 7, "c")
    score = score_record(control, control, {"ssim": (0.9, metric_spec("ssim", "XR"))})
    with pytest.raises(RecordSchemaError, match=r"s.json: score field scores/ssim/spec/kind: value 'XR' is not one "
                                                r"of \['NR', 'FR', 'prompt'\]; refused on write"):
        write_record(tmp_path / "s.json", score)
    with pytest.raises(RecordSchemaError, match=r"f.json: record kind 'crash' is not one of \['generation', "):
        write_record(tmp_path / "f.json", {**complete_records()["failure"], "kind": "crash"})
    with pytest.raises(RecordSchemaError, match="record kind None is not one of"):
        write_record(tmp_path / "x.json", {"a": 1})


def test_a_resealed_record_that_breaks_its_schema_is_refused_on_read(tmp_path: Path) -> None:
    """The digest matches (someone or other code rewrote the file consistently); the
    schema still refuses it, naming the file, the field, the value and the fix."""
    path = tmp_path / "t.json"
    write_record(path, complete_records()["timing"])
    reseal(path, lambda r: r["timing"].__setitem__("clock", "sundial"))
    with pytest.raises(RecordSchemaError) as e:
        read_record(path, "timing")
    assert str(e.value).startswith(f"{path}: timing field timing/clock: value 'sundial' is not one of "
                                   "['cuda_events', 'perf_counter']; refused on read: it was written by other code "
                                   "or altered (schema ")
    assert str(e.value).endswith("delete it and rerun the workflow, which regenerates it")
    write_record(path, complete_records()["generation"])
    reseal(path, lambda r: r.pop("video"))
    with pytest.raises(RecordSchemaError, match="t.json: generation field video: required field is missing; refused "
                                                "on read"):
        read_record(path)
    assert isinstance(e.value, IntegrityError)  # callers that catch a bad record catch this too


def test_manifests_are_validated_on_write_and_by_verify(tmp_path: Path) -> None:
    write_record(tmp_path / "r0.json", note())
    manifest = build_manifest("timing", tmp_path, [tmp_path / "r0.json"])
    with pytest.raises(RecordSchemaError, match="m.json: manifest field kind: value 'panel' is not one of"):
        write_manifest(tmp_path / "m.json", {**manifest, "kind": "panel"})  # type: ignore[typeddict-item]
    assert not (tmp_path / "m.json").exists()
    write_manifest(tmp_path / "m.json", manifest)
    broken = json.loads((tmp_path / "m.json").read_text())
    del broken["files"]
    (tmp_path / "m.json").write_text(json.dumps(broken))
    problems = verify_manifest(tmp_path / "m.json")
    assert len(problems) == 1 and problems[0].startswith(
        f"{tmp_path / 'm.json'}: manifest field files: required field is missing; refused on read")


TYPES = {"generation": recordtypes.GenerationRecord, "score": recordtypes.ScoreRecord,
         "timing": recordtypes.TimingRecord, "failure": recordtypes.FailureRecord,
         "retirement": recordtypes.RetirementRecord}


@pytest.mark.parametrize("kind", recordtypes.RECORD_KINDS)
def test_each_typeddict_and_its_schema_name_the_same_fields(kind: str) -> None:
    """The types mypy checks and the schemas the files are checked against stay in step:
    the same top-level fields, and a field the type requires is one the schema requires."""
    schema, td = load_schema(f"record.{kind}"), TYPES[kind]
    assert set(schema["properties"]) == set(td.__annotations__), kind
    required = set(schema["required"]) | set(schema.get("then", {}).get("required", []))
    assert td.__required_keys__ <= required, kind
    assert required - {"schema_version", "record_digest"} <= set(td.__annotations__), kind
    assert typing.get_args(td.__annotations__["kind"]) == (schema["properties"]["kind"]["const"],)


def test_the_failure_slot_type_and_its_schema_name_the_same_fields() -> None:
    slot = load_schema("record.failure")["properties"]["slot"]["oneOf"][0]
    assert set(slot["properties"]) == set(recordtypes.FailureSlot.__annotations__)
    assert set(slot["required"]) == recordtypes.FailureSlot.__required_keys__
    assert set(typing.get_args(recordtypes.FailureSlot.__annotations__["source"])) == set(
        slot["properties"]["source"]["enum"])


def test_the_typed_enums_are_the_schemas_enums() -> None:
    score = load_schema("record.score")
    spec = score["properties"]["scores"]["additionalProperties"]["properties"]
    assert set(typing.get_args(recordtypes.MetricKind)) == set(spec["spec"]["properties"]["kind"]["enum"])
    assert set(typing.get_args(recordtypes.Decoding)) == set(spec["decoded_with"]["enum"])
    assert set(typing.get_args(recordtypes.FailureClass)) == set(
        load_schema("record.failure")["properties"]["class"]["enum"])
    assert set(typing.get_args(recordtypes.ManifestKind)) == set(load_schema("manifest")["properties"]["kind"]["enum"])
    arm = load_schema("record.generation")["$defs"]["arm"]
    assert arm["properties"]["kinds"]["items"]["enum"] == [k.name for k in KINDS]
    assert set(arm["properties"]) == {"name", "kinds", "digest"} | {f for k in KINDS for f in k.record_schema}
    # every field typed in ArmFields is one a registered kind declares (none left over)
    assert set(recordtypes.ArmFields.__annotations__) - {"name", "kinds", "digest"} <= set(arm["properties"])
    assert load_schema("record.generation")["$defs"]["generation_settings"]["properties"]["dtype"]["enum"] == list(
        LOADABLE)


def test_every_shipped_schema_is_valid_draft_2020_12() -> None:
    from jsonschema import Draft202012Validator

    for name in [f"record.{k}" for k in recordtypes.RECORD_KINDS] + ["manifest"]:
        Draft202012Validator.check_schema(load_schema(name))


def test_check_schema_accepts_what_the_stats_tests_build() -> None:
    """tests/test_stats.py builds its records with conftest's factories: they are records
    of the real shape, not partial dicts."""
    for kind, record in complete_records().items():
        check_schema(seal(record), f"{kind}.json", "write")


MUTATIONS = {
    "drop video": ("generation", lambda r: r.pop("video")),
    "unknown top-level field": ("generation", lambda r: r.update(extra=1)),
    "arm kind": ("generation", lambda r: r["arm"]["kinds"].append("magic")),
    "frames as text": ("generation", lambda r: r["video"].update(frames="9")),
    "short digest": ("generation", lambda r: r["video"].update(digest="xxh3_128:00")),
    "metric kind": ("score", lambda r: r["scores"]["ssim"]["spec"].update(kind="XR")),
    "weights pair": ("score", lambda r: r["scores"]["ssim"]["spec"].update(weights=[["a"]])),
    "sampled without seconds": ("timing", lambda r: r["timing"].pop("seconds")),
    "not sampled with a latency": ("timing", lambda r: r.update(sampled=False, matches_bulk_frames=None)),
    "zero latency": ("timing", lambda r: r["timing"].update(latency_s=0.0)),
    "failure class": ("failure", lambda r: r.update({"class": "gremlins"})),
    "attempts": ("failure", lambda r: r.update(attempts=0)),
    "unchanged": ("retirement", lambda r: None),
}


@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_the_compiled_validator_and_jsonschema_agree(case: str) -> None:
    """Records are checked by fastjsonschema's compiled code and refusals explained by
    jsonschema: both must accept and refuse the same records."""
    from fastjsonschema import JsonSchemaValueException
    from jsonschema import Draft202012Validator

    from pairflow.records.store import validator

    kind, mutate = MUTATIONS[case]
    record = seal(complete_records()[kind])
    mutate(record)
    try:
        validator(f"record.{kind}")(record)
        fast = True
    except JsonSchemaValueException:
        fast = False
    assert fast == Draft202012Validator(load_schema(f"record.{kind}")).is_valid(record) == (case == "unchanged")


def test_stale_link_names_both_digests_or_none_when_bound() -> None:
    from pairflow.records.store import stale_link

    gen = {"record_digest": "xxh3_128:aa"}
    assert stale_link({"generation_record_digest": "xxh3_128:aa"}, gen) is None
    assert stale_link({"generation_record_digest": "xxh3_128:bb"}, gen) == (
        "names generation record xxh3_128:bb, the current one is xxh3_128:aa")


def test_identical_to_control_is_equal_raw_frames_and_leaves_only_fidelity_means() -> None:
    """The one definition of an identical pair (issue 41): equal raw-frame digests, whatever
    the encoded files; it leaves FR means and keeps NR differences."""
    ctrl = generation_record("t", "a1", 0, "control", 1, "same")
    same = generation_record("t", "a1", 0, "pab", 1, "same")
    same["video"]["digest"] = "xxh3_128:" + "f" * 32  # another encoded file of the same frames
    other = generation_record("t", "a1", 0, "pab", 1, "other")
    assert identical_to_control(ctrl, same) and not identical_to_control(ctrl, other)
    assert [in_fidelity_mean(kind, ident) for kind in ("FR", "NR") for ident in (True, False)] == [
        False, True, True, True]
