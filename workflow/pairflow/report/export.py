"""Tidy export of a results tree: one row per candidate, one per (arm, metric) summary.

``pairflow export results/scratch --format csv|parquet`` writes two tables a researcher
opens in pandas without reading JSON records:

* ``candidates.<ext>``: one row per candidate (study, panel, prompt id, prompt, seed, arm,
  candidate id), every metric's value, the timed-pass latency (seconds; empty where the
  pair was not sampled), the exact compute (``work_flops``: transformer and verifier
  FLOPs; transformer blocks computed and skipped), and the digests of the generation,
  score and timing records the row was read from (``xxh3_128:<hex>``);
* ``summary.<ext>``: one row per (arm, metric) from the study statistics (the verdict as a
  code, a phrase and the text every report prints with the deciding test's p and family;
  a metric with a margin also carries its tail statement, ``tail_*`` columns),
  plus one ``speedup`` and one ``compute_ratio`` row per arm (``ci_note``: why an interval
  is missing), each with the digest of the ``stats.json`` it came from;
* ``ledger.<ext>``: one row per job of the study (``budget.ledger``): rule, wildcards,
  attempt, status, Slurm job id, what it held (GPUs, CPUs, nodes, from when to when,
  GPU-, CPU- and slot-seconds, and from which source), its work and busy share, each
  with the digest of the ``ledger.json`` it came from (written when a run wrote one);
* ``vbench/<arm>_eval_results.json`` and ``vbench_summary.json``: each arm's VBench
  dimensions in VBench's own result layout, with the total-score normalisation and the
  totals that can or cannot be formed (``report.vbench``).

Records are read through ``records.read_record`` (self-digest and schema checked), so an
altered record is refused rather than exported. Parquet needs pyarrow (optional, not a
dependency); without it the command names the package to install. Imports without torch.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from ..analysis.verdicts import verdict_text
from ..atomic import write_bytes, write_text
from ..errors import ConfigError
from ..identity import digest_file
from ..layout import Layout
from ..plan.candidates import candidates, record_path, score_path, timing_path
from ..plan.config import StudySpec
from ..records.store import identical_to_control, read_record
from .vbench import vbench_files

Format = Literal["csv", "parquet"]
CANDIDATE_ID_COLUMNS = ("study", "panel", "prompt_id", "seed", "arm", "candidate_id")


def candidate_rows(study: StudySpec) -> list[dict[str, Any]]:
    """One dict per candidate with a generation record, in the study's candidate order.
    Metric columns are named by the metric; a candidate not scored (or not timed) has
    empty cells there. Raises RecordError (from ``read_record``) on an altered record."""
    layout = Layout(study.scratch)
    rows = []
    for panel in study.panels:
        cands = [c for c in candidates(study, panel) if record_path(layout, c).is_file()]
        gens = {c.key.candidate_id: read_record(record_path(layout, c), "generation") for c in cands}
        controls = {(c.key.prompt_id, c.key.seed): gens[c.key.candidate_id] for c in cands if c.arm.is_control}
        for c in cands:
            gen = gens[c.key.candidate_id]
            ctrl = controls.get((c.key.prompt_id, c.key.seed))
            compute = gen.get("compute") or {}
            row: dict[str, Any] = {
                "study": study.study, "panel": panel.name, "prompt_id": c.key.prompt_id, "seed": c.key.seed,
                "arm": c.arm.name, "candidate_id": c.key.candidate_id, "prompt": c.prompt.text,
                "video": gen["video"]["path"], "video_digest": gen["video"]["digest"],
                # the one definition (records.identical_to_control); empty for control and for an unpaired video
                "identical_to_control": None if c.arm.is_control or ctrl is None else identical_to_control(ctrl, gen),
                "work_flops": compute.get("work_flops"), "blocks_computed": compute.get("blocks_computed"),
                "blocks_skipped": compute.get("blocks_skipped"),
                "generation_record_digest": gen.get("record_digest")}
            spath = score_path(layout, c)
            if spath.is_file():
                sc = read_record(spath, "score")
                row.update({name: entry["value"] for name, entry in sorted(sc["scores"].items())})
                row["score_record_digest"] = sc.get("record_digest")
            tpath = timing_path(layout, c)
            if tpath.is_file():
                tm = read_record(tpath, "timing")
                row["latency_s"] = tm["timing"].get("latency_s")
                row["timing_record_digest"] = tm.get("record_digest")
            rows.append(row)
    return rows


def summary_rows(stats_path: Path) -> list[dict[str, Any]]:
    """One dict per (arm, metric) of ``stats.json``, plus each arm's speedup and compute
    ratio, each carrying the file's digest. Empty when the statistics are not written yet."""
    if not stats_path.is_file():
        return []
    stats = json.loads(stats_path.read_text())
    digest = digest_file(stats_path)
    rows: list[dict[str, Any]] = []
    for c in stats["comparisons"]:
        base = {"arm": c["treatment"], "n_prompts": c["n_prompts"], "n_pairs": c["n_pairs"],
                "level": stats["level"], "stats_digest": digest}
        sp = c["speedup"]
        rows.append({**base, "metric": "speedup", "estimate": sp["geomean"], "ci_low": sp["ci"][0],
                     "ci_high": sp["ci"][1], "ci_note": sp.get("ci_note"), **latency_columns(c)})
        if c.get("compute"):
            cp = c["compute"]
            rows.append({**base, "metric": "compute_ratio", "estimate": cp["ratio"], "ci_low": cp["ci"][0],
                         "ci_high": cp["ci"][1], "ci_note": cp.get("ci_note"),
                         "blocks_skipped": cp.get("blocks_skipped"), "blocks_computed": cp.get("blocks_computed")})
        for m in c["metrics"]:
            rows.append({**base, **metric_columns(m)})
    return rows


def metric_columns(m: Mapping[str, Any]) -> dict[str, Any]:
    """One (arm, metric) cell of ``stats.json`` as the export's columns. ``n_prompts`` and
    ``n_pairs`` are the metric's own: the prompts its mean is over and the pairs it was
    analysed on, of which ``n_identical_pairs`` are identical to control and, for a
    fidelity metric, left out of the mean (``records.in_fidelity_mean``). ``p_verdict`` is
    the one p every report prints beside the verdict: the deciding test's, named by
    ``p_verdict_test`` and ``p_verdict_family`` (``verdicts.verdict_text``); the cell's own
    question (``question``) has its raw and family-adjusted p apart, as ``question_p_raw``
    and ``question_p_adjusted``."""
    point = m["diff"] if m.get("diff") is not None else m.get("treatment_mean")
    return {"metric": m["metric"], "kind": m["kind"], "higher_is_better": m["higher_is_better"],
            "n_prompts": m.get("n_prompts"), "n_pairs": m.get("n_pairs"),
            "n_identical_pairs": m.get("n_identical_pairs"),
            "estimate": point, "ci_low": m["ci"][0], "ci_high": m["ci"][1], "ci_level": m.get("ci_level"),
            "control_mean": m.get("control_mean"), "treatment_mean": m.get("treatment_mean"),
            "verdict": m.get("verdict"), "verdict_code": m.get("verdict_code"),
            "p_verdict": m.get("p_verdict"), "p_verdict_test": m.get("p_verdict_test"),
            "p_verdict_family": m.get("p_verdict_family"),
            "verdict_text": verdict_text(m), "verdict_detail": m.get("verdict_detail"),
            "question": m.get("hypothesis"), "question_p_raw": m.get("p_value"),
            "question_p_adjusted": m.get("p_adjusted"), "wins": m.get("wins"), "ties": m.get("ties"),
            "losses": m.get("losses"), "signflip_min_p": m.get("signflip_min_p"),
            "diagnostics": "; ".join(m.get("diagnostics") or []) or None, **tail_columns(m.get("tail"))}


def latency_columns(c: Mapping[str, Any]) -> dict[str, Any]:
    """A comparison's latency and timed-pass columns (the study table's): each arm's
    geometric-mean latency (s) over the timed pairs, their count and the pairs sampled,
    repeats per candidate (``/``-joined), the median repeat CV per arm and the pairs over
    ``timing/max_cv``; each arm's estimated MFU and peak device memory (GiB) where measured."""
    lat = c.get("latency") or {}
    eff = c.get("efficiency") or {}
    return {"control_latency_s": lat.get("control_geomean_s"), "treatment_latency_s": lat.get("treatment_geomean_s"),
            "timed_pairs": lat.get("n_pairs"), "sampled_pairs": lat.get("sampled_pairs"),
            "repeats": "/".join(str(r) for r in lat.get("repeats", [])) or None,
            "control_cv_median": lat.get("control_cv_median"), "treatment_cv_median": lat.get("treatment_cv_median"),
            "pairs_over_max_cv": lat.get("pairs_over_max_cv"),
            **{f"{arm}_{what}": (eff.get(arm) or {}).get(key) for arm in ("control", "treatment")
               for what, key in (("mfu", "mfu_median"), ("peak_memory_gib", "peak_memory_gib"))}}


def tail_columns(t: dict[str, Any] | None) -> dict[str, Any]:
    """A metric row's tail statement (``analysis.tail``; empty for a metric without a
    margin): prompts losing more than the margin, the exact upper bound of that share and its
    level, the outlier flag and robust z, the prompts that would bound the share below the
    target, and the worst prompts as ``panel/prompt:seed=loss`` joined by ``;``."""
    if not t:
        return {}
    return {"tail_exceed": t["exceed"], "tail_upper": t["upper"], "tail_upper_level": t["upper_level"],
            "tail_flag": t["flag"], "tail_outlier_z": t["outlier_z"], "tail_target_share": t["target_share"],
            "tail_prompts_to_bound": t["prompts_to_bound"],
            "tail_worst": ";".join(f"{w['prompt']}:{w['seed']}={w['loss']:.6g}" for w in t["worst"]),
            "tail_worst_videos": ";".join(w["treatment_video"] for w in t["worst"])}


LEDGER_COLUMNS = ("job", "rule", "wildcards", "attempt", "status", "slurm_job", "host", "start", "end", "elapsed_s",
                  "gpus", "cpus", "nodes", "gpu_s", "cpu_s", "slot", "slot_s", "held_from", "work_slot_s",
                  "work_from", "busy_share", "ledger_digest")


def ledger_rows(ledger_path: Path) -> list[dict[str, Any]]:
    """One row per job in the ledger at ``ledger_path`` (in start order); none without one."""
    if not ledger_path.is_file():
        return []
    book = json.loads(ledger_path.read_text())
    digest = digest_file(ledger_path)
    rows = []
    for j in sorted(book.get("jobs", {}).values(), key=lambda j: (j["held"]["start"], j["job"])):
        h = j["held"]
        rows.append({"job": j["job"], "rule": j["rule"],
                     "wildcards": ",".join(f"{k}={v}" for k, v in sorted((j.get("wildcards") or {}).items())),
                     "attempt": j.get("attempt"), "status": j["status"], "slurm_job": j.get("slurm_job"),
                     "host": j.get("host"), "start": h["start"], "end": h.get("end"), "elapsed_s": h["elapsed_s"],
                     "gpus": h["gpus"], "cpus": h["cpus"], "nodes": h["nodes"], "gpu_s": h["gpu_s"],
                     "cpu_s": h["cpu_s"], "slot": h["slot"], "slot_s": h["slot_s"], "held_from": h["from"],
                     "work_slot_s": j["work"]["slot_s"], "work_from": j["work"]["from"],
                     "busy_share": j.get("busy_share"), "ledger_digest": digest})
    return rows


def _columns(rows: Sequence[dict[str, Any]], first: Sequence[str]) -> list[str]:
    seen = list(first)
    for r in rows:
        seen += [k for k in r if k not in seen]
    return seen


def _csv(rows: Sequence[dict[str, Any]], columns: list[str]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, columns, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r[k]) for k in columns})
    return buf.getvalue()


def _parquet(rows: Sequence[dict[str, Any]], columns: list[str]) -> bytes:
    try:
        import pyarrow as pa  # type: ignore[import-untyped,import-not-found,unused-ignore]  # optional: only --format parquet needs it
        import pyarrow.parquet as pq  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError as e:
        raise ConfigError("--format parquet needs the pyarrow package, which is not installed here; install it "
                          "(pip install pyarrow) or export with --format csv") from e
    table = pa.Table.from_pylist([{k: r.get(k) for k in columns} for r in rows])
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return bytes(sink.getvalue().to_pybytes())


def export(study: StudySpec, out: Path, fmt: Format) -> list[Path]:
    """Write ``candidates.<fmt>``, ``summary.<fmt>``, (where a run wrote a ledger)
    ``ledger.<fmt>`` and VBench's layout under ``vbench/`` (``report.vbench``) under ``out``
    (atomically); returns their paths. Raises ConfigError when ``fmt`` is parquet and
    pyarrow is missing, before anything is written."""
    cand = candidate_rows(study)
    summ = summary_rows(Layout(study.scratch).study_stats)
    tables = {"candidates": (cand, _columns(cand, CANDIDATE_ID_COLUMNS)),
              "summary": (summ, _columns(summ, ("arm", "metric")))}
    jobs = ledger_rows(Layout(study.scratch).ledger())
    if jobs:
        tables["ledger"] = (jobs, list(LEDGER_COLUMNS))
    encoded: dict[Path, str | bytes] = {}
    for name, (rows, cols) in tables.items():
        encoded[out / f"{name}.{fmt}"] = _csv(rows, cols) if fmt == "csv" else _parquet(rows, cols)
    encoded.update({out / name: text for name, text in vbench_files(study).items()})
    for path, data in encoded.items():
        if isinstance(data, str):
            write_text(path, data)
        else:
            write_bytes(path, data)
    return list(encoded)
