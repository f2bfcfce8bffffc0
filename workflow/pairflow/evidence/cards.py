"""The claim card against its archive, offline: what ``pairflow verify`` adds for an
archive or a snapshot that holds a sealed card (``report.card``).

From the snapshot alone (no config, no scratch, no model): the archived ``card.json``
still digests to its seal; every generation record of the study's panels names that
seal (``card_seal``); and what the archived generation and score records say ran
(``report.card.AS_RUN``: model weights, encoder, code, environment, scorer weights,
decode, static filter) is compared with what the card declared. A card that no longer
digests to its seal, or records generated under another card, are problems (the evidence
is not what the card binds); a record made before the workflow sealed cards (no
``card_seal``) and each deviation are notes: a deviation is stated, never hidden, and
does not make the evidence incomplete. Where the records kept to the card, verify adds
nothing to its output (its lines and summary stay those of an archive without a card);
``--json`` carries the same. A snapshot without a card (a study archived
before cards) is verified as it always was, with nothing added.

Imports without torch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import PairFlowError
from ..layout import Layout
from ..records.packs import Pack
from ..report.card import as_run_of, card_from_bytes
from .archive import is_record_path, load_manifest, read_file, snapshot_files
from .verification import Report

CARD = Layout(Path(".")).card.as_posix()
"""The sealed card's path inside a results tree or snapshot (``study/card.json``)."""


def check_archive_card(dest: Path, report: Report) -> None:
    """``check_snapshot_card`` for the snapshot ``latest.json`` of archive ``dest`` points
    at (nothing where there is none: ``verify_archive`` reports that)."""
    try:
        target = Path(dest) / json.loads((Path(dest) / "latest.json").read_text())["snapshot"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    check_snapshot_card(target, report)


def check_snapshot_card(sdir: Path, report: Report) -> None:
    """Add to ``report`` what the snapshot ``sdir``'s records say against its sealed card
    (see the module). A snapshot whose files cannot be read is left to ``verify_tree``."""
    try:
        manifest = load_manifest(sdir)
    except (OSError, ValueError, PairFlowError):
        return
    listed = set(manifest.get("files", {})) | set((manifest.get("packing") or {}).get("chunks") or {})
    where = Path(sdir) / CARD
    if CARD not in listed:  # archived before the workflow sealed cards: verified as it always was
        return
    try:
        card = card_from_bytes(read_file(sdir, CARD), where)
    except PairFlowError as e:
        report.add("card", where, str(e))
        return
    seal = card["seal"]
    records = list(_records(sdir, manifest))
    generation = [(rel, r) for rel, r in records if r.get("kind") == "generation"]
    unsealed = [rel for rel, r in generation if "card_seal" not in r]
    other = [(rel, r["card_seal"]) for rel, r in generation if "card_seal" in r and r["card_seal"] != seal]
    for rel, found in other:
        report.add("card", Path(sdir) / rel, f"generated under claim card {found}, not the archived card "
                   f"{seal}; the card was replaced after generation began. Restore the card these records "
                   "were made under, or regenerate them under this one (remove them and rerun the workflow)")
    if unsealed:
        report.add("declared", Path(sdir) / unsealed[0],
                   f"{len(unsealed)} generation record(s) name no claim card (made before the workflow sealed "
                   f"cards), e.g. this one")
    for d in as_run_of((r for _, r in records), card["declared"]):
        report.add("deviation", where, f"{d['field']}: declared {json.dumps(d['declared'])}, "
                   f"found {json.dumps(d['found'])} in {d['records']} record(s) (claim card {seal})")


def _records(sdir: Path, manifest: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, record) of every readable generation and score record of the study's panels
    in the snapshot, packed or plain; replicates' and unreadable ones are passed over
    (``verify_tree`` reports damage)."""
    packs, plain = snapshot_files(sdir, manifest)
    for path in sorted(packs.values()):
        try:
            pack = Pack(path)
        except PairFlowError:
            continue
        for member, data in pack.items():
            if not isinstance(data, bytes) or not _panel_record(member.path):
                continue
            yield member.path, json.loads(data)
    for rel, file in sorted(plain.items()):
        if _panel_record(rel):
            try:
                yield rel, json.loads(file.read_bytes())
            except (OSError, ValueError):
                continue


def _panel_record(rel: str) -> bool:
    return is_record_path(rel) and rel.startswith("panels/") and "/timing/" not in rel
