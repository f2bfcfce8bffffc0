"""The claim card: one page per study that states, before generation, what the study will
claim and from what, and after it, what it found and whether it kept to what it declared.

``pairflow card`` writes, under the study folder (``Layout.card``):

* ``card.json``: the **declared** part, from the config and the plan alone (no record is
  read): the questions (each (arm, metric) cell's hypothesis, margin or floor, and whether it
  is in the multiplicity family), alpha, the family, planned N and the stopping rule; the
  seeds and each prompt sheet's digest; the model weights' digest (computed as every
  generation record computes it: ``generation.provenance``), the scorer weights' digests
  (the mirror's lock), the encoder recipe and fingerprint, the decode mode and the
  static-filter policy; code and environment; the VBench dimensions not scored and the
  totals that cannot be formed (``report.vbench``). It is canonical JSON, sealed: ``seal``
  is ``identity.digest_obj`` of the rest of the card. A sealed card is never rewritten: a
  later run recomputes the declared part and lists every field that changed as a deviation.
* ``card-results.json``: the **results** part, written on every run: once the study
  statistics exist (``finished``), per arm the speedup with its interval, the compute
  ratio, peak device memory (where recorded) and the verdicts against control; the noise
  floor (where repeatability ran), the ledger's slot-seconds and the archive's root digest
  (``latest.json``); and always the comparison with the sealed card: ``as declared``, or
  each deviation (field, declared, found) of the declared part recomputed now and of what
  the records say ran (``as_run``). It names the seal it was read against and carries its
  own digest.
* ``card.md``: both rendered as one Markdown page (one source: the JSON above).

The stopping rule is ``fixed N (no interim looks)`` unless ``sequential/enabled`` (then the
looks, spending function, alpha, multiplicity and first boundaries are declared, and the
results say where the study stopped and what it saved: ``stopped``), and each treatment's
iso-compute control is ``not configured`` unless ``iso_compute/enabled`` (then the rule is
declared, and the plain arms and their verdicts are results). In the workflow (docs/results-and-reports.md,
"Claim card"): the first generation job seals the card before it generates anything
(``sealed_card``, from ``stages.generation``), every generation record names its seal,
rule ``card`` writes the results part after the archive, and ``pairflow verify`` checks an
archived card against the archived records (``evidence.cards``).

Imports without torch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..analysis import looks
from ..analysis.isocompute import eligible
from ..analysis.verdicts import PHRASES, verdict_text
from ..atomic import write_new, write_text
from ..errors import ConfigError, IntegrityError
from ..generation.provenance import arm_record, provenance
from ..identity import digest_file, digest_obj
from ..layout import Layout, as_named
from ..metrics import metric_spec, needed_weights
from ..metrics.weights import read_lock, verify
from ..plan.candidates import candidates, record_path, score_path
from ..plan.config import ArmSpec, StudySpec
from ..records.store import read_record
from ..records.types import Provenance
from .vbench import vbench_coverage

FORMAT = "pairflow-claim-card/1"
FIXED_N = "fixed N (no interim looks)"
NOT_CONFIGURED = "not configured"
NOT_RECORDED = "not recorded"
AS_DECLARED = "as declared"
ISO_RULE = "plain steps of equal counted FLOPs, derived at calibration (both neighbours where none matches)"
NOISE_NOT_MEASURED = "not measured (no repeatability report; `snakemake repeatability` makes one)"
RESULTS_NAME, PAGE_NAME = "card-results.json", "card.md"
"""Beside the sealed card (``Layout.card``): the results part and the page."""


# --- the declared part --------------------------------------------------------------------


def questions(study: StudySpec) -> dict[str, Any]:
    """Each (treatment, metric) cell's pre-registered question, as ``analysis.stats`` will
    ask it: an NR metric with a margin tests non-inferiority at that margin, any other NR
    metric a difference from 0; an FR metric with a floor tests the floor, one without is
    reported as a value only (outside the family). With alpha (1 - ``stats.level``), power,
    and the family: its method and members (the cells with a question)."""
    s = study.stats
    cells = []
    for arm, name, q in looks.questions(study):
        spec = metric_spec(name)
        cells.append({"arm": arm, "metric": name, "kind": spec.kind, "higher_is_better": spec.higher_is_better,
                      "question": q.kind if q else None, "margin": s.margins.get(name),
                      "floor": s.floors.get(name), "hypothesis": q.hypothesis if q else "value only",
                      "null": q.null if q else None, "in_family": q is not None})
    members = [f"{c['arm']}/{c['metric']}" for c in cells if c["in_family"]]
    return {"alpha": round(1 - s.level, 12), "level": s.level, "power": s.power,
            "family": {"method": s.multiplicity, "size": len(members), "members": members},
            "cells": cells}


def plan(study: StudySpec) -> dict[str, Any]:
    """Planned N (the unit of analysis is the prompt; seeds are averaged within it), the
    stopping rule, the timed pass's sample and the repeatability reruns."""
    panels = {p.name: {"prompts": len(p.planned), "seeds": len(p.seeds), "pairs_per_arm": len(p.planned) * len(p.seeds)}
              for p in study.panels}
    pairs = sum(p["pairs_per_arm"] for p in panels.values())
    t = study.timing
    timed = ({"pairs": "auto", "rule": f"two-stage (Stein): {t.pilot_prompts} pilot prompts, then as many as reach "
              f"a speedup interval of relative half-width {t.precision:g}, at most {t.max_prompts}"}
             if t.pairs == "auto" else {"pairs": t.pairs, "rule": "every pair" if t.pairs == "all"
                                        else f"{t.pairs} pairs per panel, a seeded sample (seed {t.seed})"})
    return {"unit": "prompt (the treatment - control difference averaged over its seeds)", "panels": panels,
            "prompts": sum(p["prompts"] for p in panels.values()), "pairs_per_arm": pairs,
            # the declared arms' (iso-compute controls are derived at calibration: results, not the plan)
            "candidates": pairs * len(study.declared_arms),
            "stopping_rule": looks.stopping_rule(study) if study.sequential else
            {"kind": "fixed-n", "text": FIXED_N, "interim_looks": 0},
            "timing": {**timed, "warmup": t.warmup, "repeats": t.repeats},
            "repeatability": {"replicates": study.repeatability.replicates,
                              "panels": list(study.repeatability.panels)}}


def scorer_weight_keys(study: StudySpec) -> list[str]:
    """The weight keys the study's scoring needs: its scorers', plus RAFT when the static
    filter applies. The same keys as ``stages.scoring.study_weights``, which this floor
    cannot import (a test keeps the two in step)."""
    return sorted(set(needed_weights(study.scorers)) | set(["raft_large"] if _static_filter_applies(study) else []))


def scorer_weights(study: StudySpec) -> dict[str, Any]:
    """The weight files the study's scoring needs (``scorer_weight_keys``), each with its
    digest checked against the mirror's lock, and the lock's digest and origin. Raises
    WeightsError (naming the file and the mirror command) when one is missing or altered."""
    keys = scorer_weight_keys(study)
    files = verify(study.weights.mirror, keys, needed_by=f"the claim card's scorers {', '.join(study.scorers)}")
    lock = read_lock(study.weights.mirror) if keys else None
    return {"keys": keys, "files": files, "lock": lock.digest if lock else None,
            "origin": lock.origin if lock else None}


def _static_filter_applies(study: StudySpec) -> bool:
    return study.scoring.static_filter == "intersection" and "temporal_flickering" in study.scorers


def declared(study: StudySpec, prov: Provenance | None = None) -> dict[str, Any]:
    """The declared part of the card, from the config and the plan alone (plus the files
    they name: sheets, model, weight mirror, ffmpeg). Deterministic for the same inputs on
    the same machine and checkout. ``prov``: the study's ``provenance``, where the caller
    already computed it (the model's files are hashed once)."""
    prov = provenance(study) if prov is None else prov
    weights = prov["model"]["weights"]
    env = prov["environment"]
    cov = vbench_coverage(study.scorers)
    return {
        "study": study.study,
        "questions": questions(study),
        "arms": [{"name": a.name, "control": a.is_control, "kinds": arm_record(a)["kinds"],
                  "digest": arm_record(a)["digest"],
                  # Filled by iso-compute controls (issue 43 item 1): the arm each treatment is also read against.
                  "against": [] if a.is_control else ["control"] + (
                      ["plain steps of equal compute"] if _iso_declared(study, a) == ISO_RULE else []),
                  "iso_compute_control": _iso_declared(study, a)} for a in study.declared_arms],
        "plan": plan(study),
        "seeds": {"panels": {p.name: list(p.seeds) for p in study.panels}, "stats": study.stats.seed,
                  "stats_resamples": study.stats.resamples, "timing": study.timing.seed},
        "prompt_sheets": {p.name: {"sheet": str(as_named(p.sheet, study.root)), "sheet_digest": digest_file(p.sheet),
                                   "prompts": len(p.planned),
                                   "prompts_digest": digest_obj([[q.prompt_id, q.digest] for q in p.planned])}
                          for p in study.panels},
        # None when the model path holds no files yet (the embedded tiny model is built by a rule; a hub id has none)
        "model": {**prov["model"],
                  "weights": {"files": len(weights), "digest": digest_obj(weights) if weights else None}},
        "scorers": {"metrics": list(study.scorers), "weights": scorer_weights(study)},
        "encoder": prov["encoder"],
        "scoring": {"decode": study.scoring.decode, "static_filter": study.scoring.static_filter,
                    "static_filter_applies": _static_filter_applies(study)},
        "code": dict(prov["code"]),
        "environment": {"digest": digest_obj(env), "installed_digest": env["installed_digest"],
                        "python": env["python"], "platform": env["platform"], "cuda": env.get("cuda"),
                        "driver": env.get("driver"), "packages": env["packages"]},
        "config_digest": prov["config_digest"],
        "analysis_digest": study.subtree_digest("stats", "scorers", "scoring", "timing"),
        "vbench": {"scored": list(cov.scored), "missing": cov.missing, "formable": list(cov.formable),
                   "cannot_form": {t: list(m) for t, m in cov.cannot_form.items()}},
    }


def _iso_declared(study: StudySpec, arm: ArmSpec) -> str | None:
    """What the card declares of ``arm``'s iso-compute control: none for control, ``not
    configured`` where ``iso_compute/enabled`` is false, else the rule (the step counts
    themselves are measured, so they are results, not declarations)."""
    if arm.is_control:
        return None
    if not study.iso_compute:
        return NOT_CONFIGURED
    why = eligible(arm)
    return ISO_RULE if why is None else f"none: {why}"


def seal(study: StudySpec, prov: Provenance | None = None) -> dict[str, Any]:
    """A new sealed card: the declared part, whether generation had begun when it was sealed
    (a card sealed late says so), and its seal: ``digest_obj`` of everything else in it."""
    card = {"kind": "claim-card", "format": FORMAT, "study": study.study, "declared": declared(study, prov),
            "sealed": "after generation had begun" if _generation_started(study) else "before generation"}
    return {**card, "seal": digest_obj(card)}


def _generation_started(study: StudySpec) -> bool:
    layout = Layout(study.scratch)
    return any(next((layout.panel(p.name) / "records").rglob("*.json"), None) is not None for p in study.panels)


def read_card(path: Path) -> dict[str, Any]:
    """A sealed card from ``path``. Raises IntegrityError when it no longer digests to its
    seal (the file was edited), naming both digests and the fix."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise IntegrityError(f"claim card {path} cannot be read ({e}); restore it from the archive, or remove it "
                             "to seal a new card (every field then counts as declared now)") from None
    return card_from_bytes(data, path)


def card_from_bytes(data: bytes, path: Path | str) -> dict[str, Any]:
    """The sealed card in ``data`` (read from ``path``: a file, or an archived one), checked
    as ``read_card`` checks it."""
    try:
        card: dict[str, Any] = json.loads(data)
    except ValueError as e:
        raise IntegrityError(f"claim card {path} cannot be read ({e}); restore it from the archive, or remove it "
                             "to seal a new card (every field then counts as declared now)") from None
    if not isinstance(card, dict) or card.get("format") != FORMAT or "declared" not in card:
        raise IntegrityError(f"{path} is not a claim card ({FORMAT}); move it aside or give another --out")
    found = digest_obj({k: v for k, v in card.items() if k != "seal"})
    if found != card.get("seal"):
        raise IntegrityError(f"claim card {path} was altered after sealing: it digests to {found}, "
                             f"its seal says {card.get('seal')}; restore it from the archive (a sealed card is never "
                             "edited: a change is a deviation)")
    return card


def deviations(sealed: Mapping[str, Any], now: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every leaf of the declared part whose value differs between the sealed card and now,
    as ``{"field": dotted.path, "declared": ..., "found": ...}`` (a field present on one
    side only reads None on the other), in field order."""
    a, b = _leaves(sealed), _leaves(now)
    return [{"field": k, "declared": a.get(k), "found": b.get(k)} for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)]


def _leaves(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, Mapping) and obj:
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: obj}


# --- the results part ---------------------------------------------------------------------


def _json_or_none(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def arm_results(comparison: Mapping[str, Any], iso: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One treatment's line of the card from its ``stats.json`` comparison: speedup and
    compute ratio with their intervals, each arm's peak device memory (GiB) where the
    timed pass recorded it, each metric's verdict against control (``verdict_text``), and
    against each of its plain arms of equal compute (``iso``: stats.json's ``iso_compute``;
    ``not configured`` without one, the reason where the arm has none)."""
    sp = comparison["speedup"]
    cp = comparison.get("compute")
    eff = comparison.get("efficiency") or {}
    peak = {arm: (eff.get(arm) or {}).get("peak_memory_gib") for arm in ("control", "treatment")}
    return {
        "arm": comparison["treatment"], "n_prompts": comparison.get("n_prompts"), "n_pairs": comparison.get("n_pairs"),
        "speedup": {"estimate": sp["geomean"], "ci": sp["ci"], "ci_note": sp.get("ci_note")},
        "compute_ratio": ({"estimate": cp["ratio"], "ci": cp["ci"], "ci_note": cp.get("ci_note")} if cp
                          else NOT_RECORDED),
        "peak_memory_gib": {k: (v if v is not None else NOT_RECORDED) for k, v in peak.items()},
        "against_control": [{"metric": m["metric"], "verdict_code": m.get("verdict_code"),
                             "verdict": m.get("verdict"), "p_verdict": m.get("p_verdict"),
                             "text": verdict_text(m)} for m in comparison["metrics"]],
        "against_iso_compute_control": _iso_results(comparison["treatment"], iso),
    }


def _iso_results(arm: str, iso: Mapping[str, Any] | None) -> Any:
    if iso is None:
        return NOT_CONFIGURED
    rows = [r for r in iso["comparisons"] if r["arm"] == arm]
    if not rows:
        return f"none: {iso.get('skipped', {}).get(arm, 'no plain arm derived')}"
    return [{"against": r["reference"], "steps": r["steps"], "side": r["side"],
             "compute_ratio": (r["comparison"].get("compute") or {}).get("ratio"),
             "speedup": r["comparison"]["speedup"]["geomean"],
             "verdicts": [{"metric": m["metric"], "verdict_code": m.get("verdict_code"), "text": verdict_text(m)}
                          for m in r["comparison"]["metrics"]]} for r in rows]


def results(study: StudySpec) -> dict[str, Any] | None:
    """The results part, or None while the study statistics are not written. Every value is
    read from the file named beside it with that file's digest."""
    layout = Layout(study.scratch)
    stats = _json_or_none(layout.study_stats)
    if stats is None:
        return None
    rep = _json_or_none(layout.repeatability())
    noise: Any = ({"noise_floor": rep.get("noise_floor"), "noise_flags": rep.get("noise_flags", []),
                   "latency_cv": rep.get("latency_cv"), "digest": digest_file(layout.repeatability())}
                  if rep is not None else
                  NOISE_NOT_MEASURED)
    book = _json_or_none(layout.ledger())
    ledger: Any = NOT_RECORDED
    if book is not None:
        jobs = list(book.get("jobs", {}).values())
        by_arm: dict[str, float] = {}
        for j in jobs:
            for r in j.get("rows", []):
                by_arm[r["arm"]] = by_arm.get(r["arm"], 0.0) + r["slot_s"]
        ledger = {"jobs": len(jobs), "slot_s": sum(j["held"]["slot_s"] for j in jobs),
                  "gpu_s": sum(j["held"]["gpu_s"] for j in jobs), "slot_s_by_arm": dict(sorted(by_arm.items())),
                  "digest": digest_file(layout.ledger())}
    latest_path = study.work / study.study / "latest.json"
    latest = _json_or_none(latest_path)
    archive: Any = ({"snapshot": latest["snapshot"], "root_digest": latest["root_digest"]} if latest
                    else "not archived yet (no latest.json)")
    return {"stats": {"path": str(as_named(layout.study_stats, study.root)), "digest": digest_file(layout.study_stats),
                      "level": stats.get("level")},
            "arms": [arm_results(c, stats.get("iso_compute")) for c in stats["comparisons"]],
            "noise_floor": noise, "ledger": ledger, "archive": archive,
            **({"stopped": _stopped(stats["sequential"])} if stats.get("sequential") else {})}


def _stopped(seq: Mapping[str, Any]) -> dict[str, Any]:
    """Where a group-sequential study stopped and what that saved (stats.json's ``sequential``)."""
    return {"look": seq["look"], "looks": seq["looks"], "prompts": seq["prompts"], "max_prompts": seq["max_prompts"],
            "why": seq["why"], "candidates": seq["candidates"], "saved_slot_s": seq.get("saved_slot_s"),
            "unit": seq.get("unit"), "text": looks.sentence(seq)}


AS_RUN: dict[str, tuple[str, Any]] = {
    "code.commit": ("generation", lambda r: r["code"]["commit"]),
    "environment.installed_digest": ("generation", lambda r: r["environment"].get("installed_digest")),
    "model.weights.digest": ("generation", lambda r: digest_obj(r["model"]["weights"]) if r["model"]["weights"]
                             else None),
    "encoder.recipe_digest": ("generation", lambda r: r["encoder"]["recipe_digest"]),
    "encoder.fingerprint.digest": ("generation", lambda r: r["encoder"]["fingerprint"]["digest"]),
    "config_digest": ("generation", lambda r: r["config_digest"]),
    "scorers.weights.lock": ("score", lambda r: r["scorer"]["weights_lock"]),
    "scoring.decode": ("score", lambda r: r["scorer"]["decode"]),
    "scoring.static_filter": ("score", lambda r: r["scorer"]["static_filter"]),
}
"""Declared fields every generation or score record also states, and how to read them
from one (the record's provenance: what really ran, wherever it ran)."""


def as_run(study: StudySpec, sealed: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every value the study's records state for an ``AS_RUN`` field that differs from the
    sealed card's, as ``{"field": "as run: <field>", "declared", "found", "records"}`` (how
    many records say so). Records are read through their self-digest check (RecordError on
    an altered one)."""
    layout = Layout(study.scratch)

    def records() -> Iterator[Mapping[str, Any]]:
        for panel in study.panels:
            for c in candidates(study, panel):
                if record_path(layout, c).is_file():
                    yield read_record(record_path(layout, c), "generation")
                if score_path(layout, c).is_file():
                    yield read_record(score_path(layout, c), "score")

    return as_run_of(records(), sealed)


def as_run_of(records: Iterable[Mapping[str, Any]], sealed: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``as_run`` over ``records`` (generation and score records, by their ``kind``; others
    are passed over), wherever they were read from: a results tree or an archive."""
    seen: dict[tuple[str, str], int] = {}
    for rec in records:
        for name, (k, read) in AS_RUN.items():
            if k == rec.get("kind"):
                key = (name, json.dumps(read(dict(rec))))
                seen[key] = seen.get(key, 0) + 1
    want = _leaves(sealed)
    return [{"field": f"as run: {name}", "declared": want.get(name), "found": json.loads(value), "records": n}
            for (name, value), n in sorted(seen.items()) if json.loads(value) != want.get(name)]


def result_card(study: StudySpec, sealed: Mapping[str, Any]) -> dict[str, Any]:
    """The results part against the sealed card ``sealed``: the study's results once its
    statistics exist (``finished``; ``results``), and always the comparison: every deviation
    of the declared part recomputed now, then of what the records written so far say ran
    (``as_run``), or ``as declared``."""
    body = results(study)
    found = deviations(sealed["declared"], declared(study)) + as_run(study, sealed["declared"])
    out = {"kind": "claim-card-results", "format": FORMAT, "study": study.study, "seal": sealed["seal"],
           "finished": body is not None, **(body or {}),
           "comparison": AS_DECLARED if not found else {"deviations": found}}
    return {**out, "digest": digest_obj(out)}


# --- writing and rendering ----------------------------------------------------------------


def sealed_card(study: StudySpec, path: Path | None = None,
                prov: Provenance | None = None) -> tuple[dict[str, Any], bool]:
    """(the study's sealed card at ``path`` (default ``Layout.card``), whether this call
    sealed it). A card already there is read and checked (IntegrityError when altered,
    ConfigError when it is another study's) and never rewritten; else one is sealed now
    and created without replacing anything (``atomic.write_new``: of two panel jobs
    sealing at once, the first to land wins and the other reads it)."""
    path = Layout(study.scratch).card if path is None else path
    created = False
    if not path.exists():
        card = seal(study, prov)
        created = write_new(path, (json.dumps(card, indent=1, sort_keys=True) + "\n").encode())
    card = read_card(path)
    if card["study"] != study.study:
        raise ConfigError(f"{path} is the claim card of study {card['study']!r}, not {study.study!r}; give "
                          "another --out, or the config of that study")
    return card, created


def write_card(study: StudySpec, out: Path | None = None) -> tuple[dict[str, Any], dict[str, Any],
                                                                   list[dict[str, Any]], list[Path]]:
    """Seal the card in ``out`` (default: the study folder) unless a sealed one is there
    (kept byte for byte; IntegrityError when it was altered, ConfigError when it is another
    study's), write the results part (``result_card``) beside it and render ``card.md``
    from both. Returns (card, results part, its deviations, the paths written)."""
    default = Layout(study.scratch).card
    folder = out if out is not None else default.parent
    path, rpath, mpath = folder / default.name, folder / RESULTS_NAME, folder / PAGE_NAME
    card, created = sealed_card(study, path)
    written = [path] if created else []
    res = result_card(study, card)
    write_text(rpath, json.dumps(res, indent=1, sort_keys=True) + "\n")
    found = [] if res["comparison"] == AS_DECLARED else res["comparison"]["deviations"]
    write_text(mpath, markdown(card, res))
    return card, res, found, [*written, rpath, mpath]


def _iso_cell(v: Any) -> str:
    if isinstance(v, str):
        return v
    return "; ".join(f"{r['against']} ({r['side']}): " + ", ".join(f"{x['metric']} {PHRASES[x['verdict_code']]}"
                                                                    for x in r["verdicts"] if x["verdict_code"])
                     for r in v)


def _num(x: Any, spec: str = ".3g") -> str:
    return NOT_RECORDED if x is None else x if isinstance(x, str) else format(x, spec)


def _ci(v: Any) -> str:
    if isinstance(v, str):
        return v
    lo, hi = v["ci"]
    ci = f" [{_num(lo)}, {_num(hi)}]" if lo is not None and hi is not None else " (no interval: ci_note in the JSON)"
    return f"{_num(v['estimate'])}×{ci}"


def markdown(card: Mapping[str, Any], res: Mapping[str, Any]) -> str:
    """The card as one Markdown page: the declared part, then the results (or that the
    study has none yet), then the comparison with the seal. Rendered from the JSON only."""
    found = [] if res["comparison"] == AS_DECLARED else res["comparison"]["deviations"]
    lines = [f"# Claim card: {card['declared']['study']}", "",
             f"Sealed {card['sealed']}: `{card['seal']}` ({FORMAT}).", "", "## Declared", ""]
    lines += _declared_lines(card["declared"]) + ["", "## Results", ""] + _result_lines(res)
    lines += ["## Against the seal", ""]
    if not found:
        lines.append(f"{AS_DECLARED.capitalize()}: the declared part recomputed now equals the sealed one, and so "
                     "does what every record written so far says ran.")
    else:
        lines += [f"{len(found)} deviation(s) from the sealed card:", "", "| field | declared | found |",
                  "|---|---|---|"]
        lines += [f"| {f['field']} | `{json.dumps(f['declared'])}` | `{json.dumps(f['found'])}`"
                  + (f" ({f['records']} record(s))" if "records" in f else "") + " |" for f in found]
    return "\n".join(lines) + "\n"


def _declared_lines(d: Mapping[str, Any]) -> list[str]:
    q, p = d["questions"], d["plan"]
    lines = [f"**Questions** (alpha {q['alpha']:g}, power {q['power']:g}; family: {q['family']['method']} over "
             f"{q['family']['size']} tests):", "",
             "| arm | metric | question | margin / floor | in the family |", "|---|---|---|---|---|"]
    for c in q["cells"]:
        edge = c["margin"] if c["margin"] is not None else c["floor"]
        lines.append(f"| {c['arm']} | {c['metric']} | {c['hypothesis']} | {'' if edge is None else f'{edge:g}'} | "
                     f"{'yes' if c['in_family'] else 'no'} |")
    panels = ", ".join(f"{n}: {v['prompts']} prompts x {v['seeds']} seeds" for n, v in p["panels"].items())
    iso = "; ".join(f"{a['name']}: {a['iso_compute_control'] or NOT_CONFIGURED}" for a in d["arms"] if not a["control"])
    lines += ["", f"- **Planned N**: {p['prompts']} prompts, {p['pairs_per_arm']} pairs per arm, {p['candidates']} "
              f"candidates ({panels}); unit: {p['unit']}.",
              f"- **Stopping rule**: {p['stopping_rule']['text']}. **Timed pass**: {p['timing']['rule']}.",
              f"- **Arms**: {', '.join(a['name'] for a in d['arms'])}; iso-compute control: {iso}.",
              f"- **Seeds**: {json.dumps(d['seeds']['panels'])}; statistics seed {d['seeds']['stats']}, timing seed "
              f"{d['seeds']['timing']}.", "", "| panel | sheet | sheet digest | prompts digest |", "|---|---|---|---|"]
    lines += [f"| {n} | `{s['sheet']}` | `{s['sheet_digest']}` | `{s['prompts_digest']}` |"
              for n, s in d["prompt_sheets"].items()]
    w = d["scorers"]["weights"]
    enc = d["encoder"]
    mw = d["model"]["weights"]
    lines += ["", f"- **Model**: {d['model']['kind']} {d['model']['id']}"
              + (f" (revision {d['model']['revision']})" if d["model"]["revision"] else "") + ", weights "
              + (f"`{mw['digest']}` over {mw['files']} file(s)." if mw["digest"] else
                 "not found at the model path when the card was sealed (a model a rule builds is not built yet)."),
              f"- **Scorers**: {', '.join(d['scorers']['metrics'])}; weights: "
              + (f"lock `{w['lock']}` ({w['origin']}), {len(w['files'])} file(s)" if w["keys"] else "none needed")
              + ".",
              f"- **Encoder**: recipe `{enc['recipe_digest']}`, fingerprint `{enc['fingerprint']['digest']}`; "
              f"**decode**: {d['scoring']['decode']}; **static filter**: {d['scoring']['static_filter']}"
              + ("" if d["scoring"]["static_filter_applies"] else " (applies to no scorer)") + ".",
              f"- **Code**: {d['code']['commit'] or 'not a git checkout'}"
              + (" (uncommitted changes)" if d["code"]["dirty"] else "")
              + f"; **environment**: `{d['environment']['digest']}` (Python {d['environment']['python']}).",
              f"- **VBench**: scored {', '.join(d['vbench']['scored']) or 'none'}; not scored: "
              f"{', '.join(d['vbench']['missing'])}; totals that cannot be formed: "
              + ("; ".join(f"{t} (lacks {', '.join(m)})" for t, m in d["vbench"]["cannot_form"].items()) or "none")
              + "."]
    return lines


def _result_lines(res: Mapping[str, Any]) -> list[str]:
    lines: list[str] = []
    if not res["finished"]:
        lines += ["No study statistics yet: the results part is added when the study has finished.", ""]
    else:
        lines += [f"From `{res['stats']['path']}` (`{res['stats']['digest']}`).", "",
                  "| arm | speedup | compute ratio | peak memory GiB (control / treatment) | against control | "
                  "against the iso-compute control |", "|---|---|---|---|---|---|"]
        for a in res["arms"]:
            mem = a["peak_memory_gib"]
            verdicts = "; ".join(f"{v['metric']}: {v['text']}" for v in a["against_control"])
            lines.append(f"| {a['arm']} | {_ci(a['speedup'])} | {_ci(a['compute_ratio'])} | "
                         f"{_num(mem['control'])} / {_num(mem['treatment'])} | {verdicts} | "
                         f"{_iso_cell(a['against_iso_compute_control'])} |")
        nf = res["noise_floor"]
        ar = res["archive"]
        led = res["ledger"]
        if res.get("stopped"):
            lines += ["", f"- **Stopped**: {res['stopped']['text']}."]
        lines += ["", "- **Ledger**: " + (led if isinstance(led, str) else
                                          f"{led['jobs']} job(s), {_num(led['slot_s'], '.1f')} slot-seconds "
                                          f"({_num(led['gpu_s'], '.1f')} GPU-seconds)") + ".",
                  "- **Noise floor**: " + (nf if isinstance(nf, str) else ", ".join(
            f"{m}: max range {_num(v['max_range'])}" for m, v in (nf["noise_floor"] or {}).items())) + ".",
            "- **Archive**: "
            + (ar if isinstance(ar, str) else f"snapshot {ar['snapshot']}, root `{ar['root_digest']}`") + ".", ""]
    return lines
