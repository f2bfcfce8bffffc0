"""export: tidy tables from sealed records, one row per candidate and per (arm, metric),
each row naming the digest of the record it was read from."""

from __future__ import annotations

import csv
import importlib.util
import json
import re
from pathlib import Path

import pytest
from conftest import generation_record, metric_spec, score_record, small_config, timing_record, write_config

from pairflow.cli import main
from pairflow.errors import IntegrityError
from pairflow.identity import digest_file
from pairflow.layout import Layout
from pairflow.plan.candidates import candidates, record_path, score_path, timing_path
from pairflow.plan.config import StudySpec, study_from_raw
from pairflow.records.store import build_manifest, write_manifest, write_record
from pairflow.report.export import candidate_rows, export, summary_rows

FLICKER = {("a1", "control"): 0.91, ("a1", "pab"): 0.85, ("a2", "control"): 0.90, ("a2", "pab"): 0.92}


@pytest.fixture
def scratch(tmp_path: Path, tiny_model: Path) -> StudySpec:
    """A recorded study (2 prompts x 1 seed, control + pab): sealed generation, score and
    timing records where the stages put them, a generation manifest recording the config
    (so `pairflow export <scratch>` finds the study) and a study stats.json."""
    from pairflow.generation.provenance import config_snapshot

    cfg = small_config(tmp_path, tiny_model)
    write_config(tmp_path, cfg)
    study = study_from_raw(cfg, tmp_path)
    for c in candidates(study, study.panels[0]):
        pid, arm = c.key.prompt_id, c.arm.name
        gen = generation_record("t", pid, 0, arm, 1, f"{pid}{arm}")
        gen["candidate"]["candidate_id"] = c.key.candidate_id
        gen["compute"] = {"work_flops": 1e9 if arm == "control" else 6e8, "blocks_computed": 30, "blocks_skipped": 0}
        ctrl = generation_record("t", pid, 0, "control", 1, f"{pid}control")
        gen = write_record(record_path(Layout(study.scratch), c), gen)
        metrics = {"temporal_flickering": (FLICKER[(pid, arm)], metric_spec("temporal_flickering"))}
        if arm != "control":
            metrics["ssim"] = (0.5 if pid == "a1" else 0.75, metric_spec("ssim", "FR"))
        write_record(score_path(Layout(study.scratch), c), score_record(gen, ctrl, metrics))
        write_record(timing_path(Layout(study.scratch), c), timing_record(gen, 2.0 if arm == "control" else 1.0))
    layout = Layout(study.scratch)
    write_manifest(layout.generation_manifest("t"), build_manifest(
        "panel-generation", layout.panel("t"), [], {"config": config_snapshot(study)}))
    stats = {"level": 0.95, "comparisons": [{
        "treatment": "pab", "n_prompts": 2, "n_pairs": 2, "speedup": {"geomean": 2.0, "ci": [1.5, 2.5]},
        "compute": {"ratio": 0.6, "ci": [None, None], "ci_note": "compute ratio: no interval: every prompt's ratio "
                    "is 0.6 (zero spread)"},
        "metrics": [{"metric": "temporal_flickering", "kind": "NR", "higher_is_better": True, "diff": -0.02,
                     "ci": [-0.5, 0.46], "control_mean": 0.905, "treatment_mean": 0.885, "p_value": 0.9,
                     "verdict": "worse, non-inferiority not shown", "verdict_code": "worse_non_inferiority_not_shown",
                     "p_verdict": 0.003, "p_verdict_test": "difference from 0",
                     "p_verdict_family": "outside the family, scaled to this cell's Holm level"}]}]}
    layout.study_stats.parent.mkdir(parents=True, exist_ok=True)
    layout.study_stats.write_text(json.dumps(stats))
    return study


def test_one_row_per_candidate_with_every_metric_latency_compute_and_digests(scratch: StudySpec) -> None:
    rows = candidate_rows(scratch)
    assert [(r["prompt_id"], r["arm"]) for r in rows] == [("a1", "control"), ("a1", "pab"), ("a2", "control"),
                                                          ("a2", "pab")]
    for r in rows:
        c = next(c for c in candidates(scratch, scratch.panels[0])
                 if (c.key.prompt_id, c.arm.name) == (r["prompt_id"], r["arm"]))
        records = {kind: json.loads(path(Layout(scratch.scratch), c).read_text())
                   for kind, path in (("generation", record_path), ("score", score_path), ("timing", timing_path))}
        assert r["candidate_id"] == c.key.candidate_id and r["seed"] == 0 and r["study"] == "test"
        assert r["temporal_flickering"] == FLICKER[(r["prompt_id"], r["arm"])]
        assert ("ssim" in r) == (r["arm"] == "pab")
        assert r["latency_s"] == records["timing"]["timing"]["latency_s"]
        assert r["work_flops"] == records["generation"]["compute"]["work_flops"]
        for kind in records:
            assert r[f"{kind}_record_digest"] == records[kind]["record_digest"]


def test_summary_rows_carry_the_stats_digest(scratch: StudySpec) -> None:
    path = Layout(scratch.scratch).study_stats
    rows = summary_rows(path)
    assert [(r["arm"], r["metric"]) for r in rows] == [("pab", "speedup"), ("pab", "compute_ratio"),
                                                       ("pab", "temporal_flickering")]
    assert {r["stats_digest"] for r in rows} == {digest_file(path)}
    flick = rows[2]
    assert (flick["estimate"], flick["ci_low"], flick["ci_high"], flick["verdict"]) == (
        -0.02, -0.5, 0.46, "worse, non-inferiority not shown")
    # the verdict as every report words it: phrase, the deciding test's p and its family (issue 39)
    assert flick["verdict_code"] == "worse_non_inferiority_not_shown" and flick["verdict_text"] == (
        "worse, non-inferiority not shown (p 0.003: difference from 0, outside the family, scaled to this cell's "
        "Holm level)")
    assert rows[1]["ci_low"] is None and "zero spread" in rows[1]["ci_note"]


def test_cli_writes_csv_a_reader_opens_and_refuses_an_altered_record(scratch: StudySpec,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(scratch.scratch), "--format", "csv"]) == 0
    out = Path(scratch.scratch) / "study" / "export"
    assert capsys.readouterr().out.split() == [str(out / "candidates.csv"), str(out / "summary.csv")] + [
        str(out / name) for name in ("vbench/control_eval_results.json", "vbench/pab_eval_results.json",
                                     "vbench_summary.json")]
    with (out / "candidates.csv").open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == 4 and float(table[1]["temporal_flickering"]) == FLICKER[("a1", "pab")]
    assert table[0]["ssim"] == ""  # control has no FR value: an empty cell, not 0
    # an edited record is refused, not exported
    c = candidates(scratch, scratch.panels[0])[1]
    rec = json.loads(score_path(Layout(scratch.scratch), c).read_text())
    rec["scores"]["temporal_flickering"]["value"] = 0.99
    score_path(Layout(scratch.scratch), c).write_text(json.dumps(rec))
    with pytest.raises(IntegrityError):
        export(scratch, out, "csv")


@pytest.mark.parametrize("out, why", [("/proc/x", "creating a file in /proc failed (No such file or directory)"),
                                      ("/sys/x", "creating a file in /sys failed (Permission denied)"),
                                      ("FILE/x", ": FILE is a file, not a folder;")])
def test_an_out_path_that_cannot_be_written_is_one_line_naming_it_and_the_fix(
        scratch: StudySpec, tmp_path: Path, capsys: pytest.CaptureFixture[str], out: str, why: str) -> None:
    """Issue 40: ``--out /proc/x`` ended in a raw FileNotFoundError traceback."""
    (tmp_path / "f").write_text("")
    out, why = out.replace("FILE", str(tmp_path / "f")), why.replace("FILE", str(tmp_path / "f"))
    assert main(["export", str(scratch.scratch), "--out", out]) == 3
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot write --out {out}: ") and why in err and err.endswith(
        "give a path on a file system this user can write (missing folders are created)\n"), err
    assert len(err.splitlines()) == 1


def test_parquet_round_trips_or_names_the_missing_package(scratch: StudySpec, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    if importlib.util.find_spec("pyarrow") is None:
        assert main(["export", str(scratch.scratch), "--format", "parquet", "--out", str(tmp_path / "x")]) == 3
        assert "needs the pyarrow package" in capsys.readouterr().err
        assert not (tmp_path / "x").exists()
        return
    import pyarrow.parquet as pq

    written = export(scratch, tmp_path / "pq", "parquet")
    table = pq.read_table(written[0]).to_pylist()
    assert [r["temporal_flickering"] for r in table] == [FLICKER[("a1", "control")], FLICKER[("a1", "pab")],
                                                         FLICKER[("a2", "control")], FLICKER[("a2", "pab")]]
    assert pq.read_table(written[1]).num_rows == 3


def test_parquet_without_pyarrow_names_the_package_and_writes_nothing(scratch: StudySpec, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` raises ImportError, as when not installed
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    assert main(["export", str(scratch.scratch), "--format", "parquet", "--out", str(tmp_path / "x")]) == 3
    err = capsys.readouterr().err
    assert "needs the pyarrow package" in err and "--format csv" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_the_ledger_exports_one_row_per_job_with_its_digest(scratch: StudySpec, capsys: pytest.CaptureFixture[str]) -> None:
    """Where a run wrote a ledger, ``ledger.csv`` holds one row per job: what it held (and
    from which source), its work and busy share, and the ledger's digest."""
    from pairflow.budget.ledger import FORMAT, job_entry, totals

    acc = {"kind": "job-account", "job": "timed_pass", "rule": "timed_pass", "wildcards": {}, "attempt": 2,
           "pid": 1, "host": "n1", "start": 10.0, "end": 30.0, "status": "ok", "threads": 2, "resources": {},
           "slurm_job": "41", "notes": {}, "cpu_s": {"self": 1.0, "children": 0.0}}
    sched = {"source": "scontrol", "job_id": "41", "state": "COMPLETED", "terminal": True, "start": 5.0, "end": 35.0,
             "elapsed_s": 30.0, "nodes": 1, "cpus": 8, "gpus": 2}
    jobs = {"job-x": job_entry(acc, sched, 1.0, 40.0)}
    path = Layout(scratch.scratch).ledger()
    path.write_text(json.dumps({"kind": "ledger", "format": FORMAT, "jobs": jobs, "totals": totals(jobs.values())}))
    assert main(["export", str(scratch.scratch), "--format", "csv"]) == 0
    out = Path(scratch.scratch) / "study" / "export"
    assert capsys.readouterr().out.split()[2] == str(out / "ledger.csv")  # after the two tables, before vbench/
    with (out / "ledger.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    assert (row["rule"], row["attempt"], row["slurm_job"], row["gpus"], row["cpus"]) == ("timed_pass", "2", "41", "2", "8")
    assert float(row["gpu_s"]) == 60.0 and row["held_from"].startswith("scheduler")
    assert float(row["busy_share"]) == 0.0 and row["ledger_digest"] == digest_file(path)


def test_a_metric_with_a_margin_exports_its_tail_statement() -> None:
    """Issue 39: the tail statement travels into the summary table as ``tail_*`` columns;
    a metric without a margin has none."""
    from test_stats import with_metric

    from pairflow.analysis.stats import analyse
    from pairflow.plan.config import StatsSpec
    from pairflow.report.export import tail_columns

    d = [0.01, -0.02, 0.0, 0.015, -0.01, -2.0, 0.005, -0.015, 0.02, -0.005]
    m = analyse(*with_metric("q", {"treat": d}), ["treat"],
                StatsSpec(2000, 0.95, 0, margins={"q": 0.5}))["comparisons"][0]["metrics"][0]
    cols = tail_columns(m["tail"])
    assert (cols["tail_exceed"], cols["tail_flag"], cols["tail_upper_level"]) == (1, True, 0.95)
    assert cols["tail_upper"] == m["tail"]["upper"] and cols["tail_worst"].startswith("p/p05:0=2;")
    assert cols["tail_worst_videos"].split(";")[0] == m["tail"]["worst"][0]["treatment_video"]
    assert tail_columns(None) == {}


NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def _shown(value: object, token: str) -> bool:
    """Whether ``value`` prints as ``token`` in one of the table's formats: fixed decimals,
    significant digits, a percentage, or the p format ("< 0.0001" aside)."""
    if value is None or value == "" or isinstance(value, bool):
        return False
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    decimals = len(token.split(".")[1]) if "." in token and "e" not in token else 0
    return token in {f"{x:.{decimals}f}", *(f"{x:.{k}g}" for k in range(1, 7)), f"{100 * x:.{max(decimals, 1)}f}"}


def test_the_export_reproduces_every_number_of_the_study_table(finished_study: Path, tmp_path: Path) -> None:
    """Issue 41: one number for one cell. On the session's finished study (real Snakemake,
    an arm with pairs identical to control), every number of the study table's rows is a
    number of the export's summary rows for that arm, the verdict is worded with the same
    p, and pandas over the candidates (identical pairs left out, per prompt then over
    prompts: the estimand) gives the table's fidelity and difference estimates."""
    import pandas as pd
    from conftest import study_config

    study = study_from_raw(study_config(finished_study), finished_study)
    export(study, tmp_path, "csv")
    summary = pd.read_csv(tmp_path / "summary.csv", keep_default_na=False)
    cand = pd.read_csv(tmp_path / "candidates.csv")
    lines = (Layout(study.scratch).study_stats.parent / "table.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| arm | pairs |"))
    head = [h.strip() for h in lines[start].strip("|").split("|")]
    body = lines[start + 2:lines.index("", start)]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in body]
    metrics = [h.split(" ")[0].rstrip(":") for h in head[6:]]
    assert len(rows) == 5 and metrics == ["psnr", "ssim", "temporal_flickering"]
    seen_identical = 0
    for row in rows:
        arm = row[0].split(" ")[0]
        mine = summary[summary.arm == arm]
        values = [v for _i, r in mine.iterrows() for v in r.values] + [
            int(mine[mine.metric == "compute_ratio"].blocks_skipped.iloc[0])
            + int(mine[mine.metric == "compute_ratio"].blocks_computed.iloc[0])]
        for column, text in zip(head[1:], row[1:], strict=True):
            # the verdict's own words carry its p and its family (the family's size is a number too)
            for token in NUMBER.findall(text.replace("< 0.0001", "")):
                assert any(_shown(v, token) for v in values), (arm, column, token, text)
        for name, text in zip(metrics, row[6:], strict=True):
            m = mine[mine.metric == name].iloc[0]
            assert text.startswith(m.verdict_text + ": ") == bool(m.verdict_code), (text, m.verdict_text)
            if m.verdict_code:  # the table's p is the export's p_verdict, labelled by the same test and family
                assert f"(p {m.verdict_text.split('(p ')[1].split(':')[0]}: {m.p_verdict_test}, " in text
            estimate = text[len(m.verdict_text) + 2:] if m.verdict_code else text
            point = estimate.split(" ")[0]
            assert _shown(m.estimate, point), (arm, name, point, m.estimate)
            if m.wins != "":  # small counts: matched by place, not only by value
                assert f"W/T/L {int(m.wins)}/{int(m.ties)}/{int(m.losses)}" in text, (arm, name, text)
            if int(m.n_identical_pairs or 0):
                seen_identical += 1
                assert f"{m.n_identical_pairs} of {m.n_pairs} pairs identical to control, left out of the mean" in text
            # pandas over the candidates: the estimand, with the one definition of an identical pair
            treat = cand[cand.arm == arm].set_index(["panel", "prompt_id", "seed"])
            ctrl = cand[cand.arm == "control"].set_index(["panel", "prompt_id", "seed"])
            if m.kind == "FR":
                per_pair = treat[treat.identical_to_control == False][name]  # noqa: E712 (a pandas mask)
            else:
                per_pair = treat[name] - ctrl[name]
            by_prompt = per_pair.groupby(level=["panel", "prompt_id"]).mean()
            assert len(by_prompt) == int(m.n_prompts) and _shown(by_prompt.mean(), point), (arm, name, point)
    assert seen_identical == 2  # best2's psnr and ssim: the study has identical pairs, and says so
    best2 = cand[(cand.arm == "best2") & cand.psnr.notna()]
    assert best2.psnr.max() == 80.0 and (best2[best2.psnr == 80.0].identical_to_control == True).all()  # noqa: E712
