"""Records and manifests: one self-digesting JSON per candidate, one manifest per panel.

A record's ``record_digest`` is the xxh3 of its canonical JSON without that field; a
reader recomputes it, so a flipped byte is caught before statistics see the record.
A manifest lists every record's file digest and a root digest over the sorted list.

Every record has a ``kind`` (``recordtypes.RECORD_KINDS``) and fits that kind's JSON
Schema (``workflow/schemas/record.<kind>.schema.yaml``); every manifest fits
``manifest.schema.yaml``. A record is validated before it is written and after its
digest is checked on read, so a record that a reader holds has its kind's required
fields, enums and types. Validators are compiled once per process.
Imports without torch.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, cast, overload

from ..arms.registry import record_defs
from ..atomic import write_text
from ..errors import IntegrityError, RecordSchemaError
from ..identity import canonical_json, digest_bytes, digest_file, digest_obj
from .types import (
    RECORD_KINDS,
    FailureRecord,
    GenerationRecord,
    Manifest,
    ManifestKind,
    RecordKind,
    RetirementRecord,
    ScoreRecord,
    TimingRecord,
)

# Lazy on purpose: yaml and the JSON-schema validators are imported when a schema is first read: planning
# imports this module.

SCHEMA_VERSION = 1
SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas"
RUN_SPECIFIC = ("timing", "worker", "site", "memory")
"""Top-level record fields that legitimately differ between two runs of the same candidate
(wall times, where it ran, peak memory per phase)."""
COMPUTE_PROVENANCE = ("method", "table", "cross_check")
"""Fields of a record's ``compute`` that say how its FLOPs were obtained (counted in full,
or derived from a table and perhaps cross-checked): which candidate is counted in full
depends on task order, while the figures are exact either way (tests/test_compute.py)."""

_R = TypeVar("_R", bound=Mapping[str, Any])


def schema_path(name: str) -> Path:
    """The schema file of ``name``: ``record.<kind>`` or ``manifest``."""
    return SCHEMA_DIR / f"{name}.schema.yaml"


def _inline(node: Any, common: str) -> Any:
    """``node`` with references to the shared definitions made local (``#/$defs/...``)."""
    if isinstance(node, dict):
        return {k: (v.replace(f"{common}#", "#") if k == "$ref" and isinstance(v, str) else _inline(v, common))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_inline(v, common) for v in node]
    return node


@functools.cache
def load_schema(name: str) -> dict[str, Any]:
    """Schema ``name`` (``record.<kind>`` or ``manifest``) with the shared definitions
    (``record.common``) inlined, so it stands alone; each arm kind's record fields and
    the precision enum come from ``pairflow.arms`` (``registry.record_defs``)."""
    import yaml

    common = yaml.safe_load(schema_path("record.common").read_text(encoding="utf-8"))
    schema = yaml.safe_load(schema_path(name).read_text(encoding="utf-8"))
    return {**_inline(schema, common["$id"]), "$defs": _inline(record_defs(common["$defs"]), common["$id"])}


@functools.cache
def validator(name: str) -> Callable[[Any], Any]:
    """Schema ``name`` compiled once per process (records are validated per candidate):
    fastjsonschema's generated code checks a generation record over ten times faster
    than jsonschema's interpreter (0.26 ms against 3.5 ms here). fastjsonschema reads
    the 2020-12 ``$schema`` with its draft 2019-09 generator, so the schemas use only
    keywords both drafts read alike (no ``prefixItems``, ``$dynamicRef``); jsonschema
    explains a refusal. ``use_default=False``: validation never fills in a value (a
    record's bytes are what its digest covers)."""
    import fastjsonschema

    return cast("Callable[[Any], Any]", fastjsonschema.compile(load_schema(name), use_default=False))


def _describe(e: Any) -> tuple[str, str]:
    """(field path, what is wrong) for one schema error, e.g. ``("scores/ssim/spec/kind",
    "'XR' is not one of ['NR', 'FR', 'prompt']")``."""
    where = "/".join(str(p) for p in e.absolute_path) or "<top level>"
    if e.validator == "required":
        missing = e.message.split("'")[1] if "'" in e.message else e.message
        where = f"{where}/{missing}" if where != "<top level>" else missing
        return where, "required field is missing"
    value = repr(e.instance)
    value = value if len(value) <= 80 else value[:77] + "..."
    if e.validator in ("enum", "const"):
        allowed = e.validator_value if e.validator == "enum" else [e.validator_value]
        return where, f"value {value} is not one of {allowed}"
    if e.validator == "additionalProperties":
        return where, e.message
    return where, f"value {value}: {e.message}"


def check_schema(obj: Mapping[str, Any], path: Path | str, when: Literal["write", "read"],
                 name: str | None = None) -> None:
    """Validate a record (schema ``record.<its kind>``) or, with ``name="manifest"`` or
    ``name="stats"``, a manifest or a table's statistics. Raises RecordSchemaError naming
    the file, the field's path, the value, the schema file and the fix (on write: the code
    that built it; on read: rerun)."""
    if name is None:
        kind = obj.get("kind")
        if kind not in RECORD_KINDS:
            raise RecordSchemaError(
                f"{path}: record kind {kind!r} is not one of {list(RECORD_KINDS)}; "
                + ("give the record its kind (pairflow.records.types)" if when == "write"
                   else "not a PairFlow record of this version: delete it and rerun the panel"))
        name = f"record.{kind}"
    from fastjsonschema import JsonSchemaValueException

    try:
        validator(name)(obj)
        return
    except JsonSchemaValueException as fast:
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import best_match

        err = best_match(Draft202012Validator(load_schema(name)).iter_errors(obj))
        # Both libraries read these schemas alike; should jsonschema find nothing, say fastjsonschema's finding.
        where, what = _describe(err) if err is not None else (
            "/".join(str(p) for p in fast.path[1:]) or "<top level>", fast.message)
    fix = (f"this is a bug in the code that built it; the schema is {schema_path(name)}" if when == "write" else
           f"it was written by other code or altered (schema {schema_path(name)}); delete it and rerun the "
           "workflow, which regenerates it")
    raise RecordSchemaError(f"{path}: {name.removeprefix('record.')} field {where}: {what}; refused on {when}: "
                            f"{fix}")


def seal(record: _R) -> _R:
    """Return ``record`` with ``schema_version`` and its own ``record_digest``."""
    body = {k: v for k, v in record.items() if k != "record_digest"}
    body["schema_version"] = SCHEMA_VERSION
    return cast(_R, {**body, "record_digest": digest_obj(body)})


def write_record(path: Path, record: _R) -> _R:
    """Seal, validate against its kind's schema, and atomically write ``record``; returns
    the sealed record. Raises RecordSchemaError (nothing written) when it does not fit."""
    sealed = seal(record)
    check_schema(sealed, path, "write")
    write_text(Path(path), json.dumps(sealed, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    return sealed


@overload
def read_record(path: Path, kind: Literal["generation"]) -> GenerationRecord: ...
@overload
def read_record(path: Path, kind: Literal["score"]) -> ScoreRecord: ...
@overload
def read_record(path: Path, kind: Literal["timing"]) -> TimingRecord: ...
@overload
def read_record(path: Path, kind: Literal["failure"]) -> FailureRecord: ...
@overload
def read_record(path: Path, kind: Literal["retirement"]) -> RetirementRecord: ...
@overload
def read_record(path: Path, kind: None = None) -> dict[str, Any]: ...


def read_record(path: Path, kind: RecordKind | None = None) -> Any:
    """Read a record, check its self-digest, then validate it against its kind's schema;
    with ``kind``, also that it is a record of that kind (and typed as one).

    Raises IntegrityError naming the file if it is a symlink, unreadable, not JSON, or altered, and
    its subclass RecordSchemaError if it does not fit its schema or is of another kind.
    """
    path = Path(path)
    if path.is_symlink():  # evidence is a regular file in its tree (verify and the archive agree)
        raise IntegrityError(f"{path}: a symlink (to {os.readlink(path)}), not a record; evidence must be a "
                             "regular file inside its tree. Delete the link and rerun the panel, which "
                             "regenerates it")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise IntegrityError(f"{path}: record is missing; rerun the panel to regenerate it") from None
    return parse_record(data, path, kind)


def parse_record(data: bytes, path: Path | str, kind: RecordKind | None = None) -> Any:
    """``read_record`` of bytes already read (``path`` names where they came from, e.g. a
    member of an archive pack). Raises as ``read_record`` does."""
    try:
        record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise IntegrityError(f"{path}: record is not valid JSON ({e}); delete it and rerun the panel") from e
    if not isinstance(record, dict) or "record_digest" not in record:
        raise IntegrityError(f"{path}: not a PairFlow record (no record_digest); delete it and rerun")
    body = {k: v for k, v in record.items() if k != "record_digest"}
    actual = digest_obj(body)
    if actual != record["record_digest"]:
        raise IntegrityError(f"{path}: record digest mismatch (stored {record['record_digest']}, "
                             f"computed {actual}); the file was altered, delete it and rerun the panel")
    if kind is not None and record.get("kind") != kind:
        raise RecordSchemaError(f"{path}: a {record.get('kind')!r} record where a {kind!r} record belongs; "
                                "delete it and rerun the workflow, which regenerates it")
    check_schema(record, path, "read")
    return record


def check_video(record: GenerationRecord | Mapping[str, Any], path: Path) -> None:
    """Raise IntegrityError if the record's video is missing or its bytes changed."""
    video = record["video"]
    vpath = Path(path).parents[2] / video["path"]  # records/<arm>/<file> -> the panel directory
    if vpath.is_symlink():
        raise IntegrityError(f"{vpath}: video of record {path} is a symlink (to {os.readlink(vpath)}); evidence "
                             "must be a regular file inside its tree. Delete the link and rerun the panel")
    if not vpath.is_file():
        raise IntegrityError(f"{vpath}: video of record {path} is missing; rerun the panel to regenerate")
    actual = digest_file(vpath)
    if actual != video["digest"]:
        raise IntegrityError(f"{vpath}: video digest {actual} differs from {video['digest']} in "
                             f"{path}; the video changed after it was recorded, delete both and rerun")


def stale_link(record: Mapping[str, Any], generation: Mapping[str, Any]) -> str | None:
    """Why a score or timing ``record`` is not bound to ``generation`` (its candidate's
    current generation record), or None when it names that record's digest. The one
    check behind evidence's link problems, the statistics' refusal and the timed pass's
    re-timing."""
    named, current = record.get("generation_record_digest"), generation.get("record_digest")
    return None if named == current else f"names generation record {named}, the current one is {current}"


def timing_frames_differ(record: Mapping[str, Any]) -> bool:
    """Whether a sampled timing ``record``'s run computed other frames than the bulk run
    (its latency is then not reported and the pair is re-timed). The check behind the
    timed pass's reuse and verify's ``frames`` problems."""
    return bool(record.get("sampled", True)) and record.get("matches_bulk_frames") is not True


IDENTICAL = "identical to control"
"""How every view names a pair whose treatment frames equal control's (``identical_to_control``)."""


def identical_to_control(control: Mapping[str, Any], treatment: Mapping[str, Any]) -> bool:
    """Whether a pair's treatment video is identical to its control's: the digests of the
    uncompressed frames (``video.raw_digest`` of the two generation records) are equal,
    bit for bit. The one definition every view reads (statistics, table, plots, gallery,
    export, tracker): such a pair's fidelity to control is perfect by construction (PSNR
    infinite, read as the metric's cap; SSIM 1), so it is marked ``IDENTICAL`` and left
    out of every fidelity mean, and counted apart (``in_fidelity_mean``)."""
    return bool(control["video"]["raw_digest"] == treatment["video"]["raw_digest"])


def in_fidelity_mean(kind: str, identical: bool) -> bool:
    """Whether a pair's value of a metric of ``kind`` ("FR": fidelity to control; "NR":
    per video) counts toward that metric's mean: every pair for an NR metric (an identical
    pair's difference is 0, a real result), only pairs not identical to control for an FR
    metric (``identical_to_control``)."""
    return kind != "FR" or not identical


def stable_view(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record without run-specific fields (what must match across reruns)."""
    out = {k: v for k, v in record.items() if k not in RUN_SPECIFIC + ("record_digest",)}
    if isinstance(out.get("compute"), Mapping):
        out["compute"] = {k: v for k, v in out["compute"].items() if k not in COMPUTE_PROVENANCE}
    return out


def relative_posix(path: Path | str, root: Path | str) -> str:
    """``path`` relative to ``root`` as a POSIX string; either may be relative to the
    working directory (Snakemake names outputs relative to it) or absolute."""
    return Path(path).absolute().relative_to(Path(root).absolute()).as_posix()


def stable_root(root: Path, records: Mapping[Path, Mapping[str, Any]]) -> str:
    """Digest over records' stable views (run-specific fields removed), keyed by path
    relative to ``root``: equal for two runs that computed the same things, however they
    were scheduled or interrupted."""
    return digest_obj({relative_posix(f, root): digest_obj(stable_view(r))
                       for f, r in sorted(records.items())})


def build_manifest(kind: ManifestKind, root: Path, files: list[Path], extra: dict[str, Any] | None = None,
                   base: str = ".") -> Manifest:
    """A manifest of ``files`` (paths relative to ``root``) with their digests and a root
    digest over the sorted (path, digest) list and ``extra``. ``base`` is ``root`` as seen
    from the directory the manifest will be written to (e.g. ``".."``)."""
    entries = {relative_posix(f, root): digest_file(f) for f in sorted(files)}
    body = {"kind": kind, "schema_version": SCHEMA_VERSION, "base": base, "files": entries, **(extra or {})}
    return cast(Manifest, {**body, "root_digest": digest_obj(body)})


def write_manifest(path: Path, manifest: Manifest) -> None:
    """Validate ``manifest`` (``manifest.schema.yaml``) and write it atomically. Raises
    RecordSchemaError (nothing written) when it does not fit."""
    check_schema(manifest, path, "write", "manifest")
    write_text(Path(path), json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def verify_manifest(path: Path) -> list[str]:
    """Re-hash every file a manifest lists (relative to the manifest's directory).

    Returns one line per problem: mismatched, missing, or a bad root digest. Files
    under the directory that the manifest does not list are reported as extra.
    """
    path = Path(path)
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        return [f"{path}: unreadable manifest ({e})"]

    def on_disk(f: Path) -> str | None:
        return None if f.is_symlink() or not f.is_file() else digest_file(f)

    return check_manifest(manifest, path, on_disk)


def check_manifest(manifest: Any, path: Path, digest_of: Callable[[Path], str | None],
                   exclude: tuple[str, ...] = ()) -> list[str]:
    """The checks of ``verify_manifest`` on a parsed ``manifest`` that was read from
    ``path``, with ``digest_of(file)`` giving a listed file's digest (None: missing);
    fields in ``exclude`` are left out of the root digest (an archive's packing)."""
    try:
        check_schema(manifest, path, "read", "manifest")
    except RecordSchemaError as e:
        return [str(e)]
    problems: list[str] = []
    root = path.parent / manifest.get("base", ".")
    body = {k: v for k, v in manifest.items() if k != "root_digest" and k not in exclude}
    if digest_obj(body) != manifest.get("root_digest"):
        problems.append(f"{path}: root digest mismatch; the manifest itself was altered")
    listed = manifest.get("files", {})
    for rel, digest in sorted(listed.items()):
        f = root / rel
        if (actual := digest_of(f)) is None:
            problems.append(f"{f}: missing (listed in {path})")
        elif actual != digest:
            problems.append(f"{f}: digest {actual} differs from {digest} listed in {path}")
    return problems


def check_streams(records: Sequence[GenerationRecord]) -> None:
    """Refuse records of different pairs that replayed one random stream (a seeding bug or
    two workers handed the same stream): the arms of one pair share a stream, nothing else.
    """
    seen: dict[int, tuple[str, str, int]] = {}
    for r in sorted(records, key=lambda r: (r["candidate"]["panel"], r["candidate"]["prompt_id"],
                                            int(r["candidate"]["seed"]), r["arm"]["name"])):
        c = r["candidate"]
        pair = (c["panel"], c["prompt_id"], int(c["seed"]))
        other = seen.setdefault(int(c["stream_seed"]), pair)
        if other != pair:
            raise IntegrityError(f"two candidates replay the same random stream {c['stream_seed']}: "
                                 f"{other[0]}/{other[1]} seed {other[2]} and {pair[0]}/{pair[1]} seed {pair[2]}; "
                                 "their records must not count; regenerate them")


__all__ = [
    "build_manifest",
    "canonical_json",
    "check_manifest",
    "check_schema",
    "check_streams",
    "check_video",
    "digest_bytes",
    "parse_record",
    "read_record",
    "seal",
    "stable_view",
    "stale_link",
    "timing_frames_differ",
    "validator",
    "verify_manifest",
    "write_manifest",
    "write_record",
]
