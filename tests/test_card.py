"""The claim card: sealed before generation from the config and the plan alone, never
rewritten; its results part read from stats.json; every change to what it declared listed
as a deviation; VBench coverage named; the command's errors in one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, generation_record, small_config, write_config

from pairflow.analysis.verdicts import verdict_text
from pairflow.cli import main
from pairflow.errors import IntegrityError
from pairflow.generation.provenance import provenance
from pairflow.identity import digest_file, digest_obj
from pairflow.layout import Layout
from pairflow.plan.candidates import candidates, record_path
from pairflow.plan.config import StudySpec, load_study, study_from_raw
from pairflow.records.store import write_record
from pairflow.report.card import (
    AS_DECLARED,
    FIXED_N,
    NOISE_NOT_MEASURED,
    NOT_CONFIGURED,
    NOT_RECORDED,
    as_run,
    declared,
    deviations,
    read_card,
    scorer_weight_keys,
    seal,
    write_card,
)
from pairflow.report.vbench import vbench_coverage
from pairflow.stages.scoring import study_weights

STATS = {"level": 0.95, "comparisons": [{
    "treatment": "pab", "n_prompts": 2, "n_pairs": 2, "speedup": {"geomean": 1.8, "ci": [1.5, 2.1]},
    "compute": {"ratio": 0.6, "ci": [None, None], "ci_note": "compute ratio: no interval: zero spread"},
    "efficiency": {"control": {"peak_memory_gib": 3.5}, "treatment": {"peak_memory_gib": None}},
    "metrics": [{"metric": "temporal_flickering", "kind": "NR", "higher_is_better": True, "diff": -0.02,
                 "ci": [-0.5, 0.46], "control_mean": 0.905, "treatment_mean": 0.885, "p_value": 0.9,
                 "verdict": "worse, non-inferiority not shown", "verdict_code": "worse_non_inferiority_not_shown",
                 "p_verdict": 0.003, "p_verdict_test": "difference from 0",
                 "p_verdict_family": "outside the family, scaled to this cell's Holm level"}]}]}


@pytest.fixture
def project(tmp_path: Path, tiny_model: Path) -> Path:
    """A project with the test config (2 prompts x 1 seed, control + pab), nothing run."""
    cfg = small_config(tmp_path, tiny_model, scorers=["temporal_flickering", "psnr", "ssim"],
                       stats={"resamples": 200, "margins": {"temporal_flickering": 0.01}, "floors": {"psnr": 30.0}})
    write_config(tmp_path, cfg)
    return tmp_path


def _study(project: Path) -> StudySpec:
    return load_study(project / "config" / "config.yaml", project)


def test_the_declared_card_states_questions_plan_seeds_digests_and_what_is_not_there_yet(project: Path) -> None:
    study = _study(project)
    card, res, found, paths = write_card(study)
    layout = Layout(study.scratch)
    assert paths == [layout.card, layout.study / "card-results.json", layout.study / "card.md"]
    assert not res["finished"] and "arms" not in res and res["comparison"] == AS_DECLARED and found == []
    assert card["seal"] == digest_obj({k: v for k, v in card.items() if k != "seal"})
    assert json.loads(layout.card.read_text()) == card
    assert card["sealed"] == "before generation"
    d = card["declared"]
    q = d["questions"]
    assert (q["alpha"], q["family"]) == (0.05, {"method": "holm", "size": 2,
                                                "members": ["pab/temporal_flickering", "pab/psnr"]})
    cells = {c["metric"]: c for c in q["cells"]}
    assert cells["temporal_flickering"]["hypothesis"] == "loss = margin 0.01 (non-inferiority)"
    assert cells["psnr"]["hypothesis"] == "mean value = floor 30" and cells["psnr"]["in_family"]
    assert cells["ssim"]["hypothesis"] == "value only" and not cells["ssim"]["in_family"]  # FR without a floor
    p = d["plan"]
    assert (p["prompts"], p["pairs_per_arm"], p["candidates"]) == (2, 2, 4)
    assert p["stopping_rule"] == {"kind": "fixed-n", "text": FIXED_N, "interim_looks": 0}
    assert [a["iso_compute_control"] for a in d["arms"]] == [None, NOT_CONFIGURED]  # iso_compute off
    assert d["seeds"]["panels"] == {"t": [0]}
    sheet = project / "config" / "panels" / "t.tsv"
    assert d["prompt_sheets"]["t"]["sheet_digest"] == digest_file(sheet)
    assert d["prompt_sheets"]["t"]["sheet"] == "config/panels/t.tsv"
    # the model's weights digested over the files every generation record lists
    assert d["model"]["weights"]["files"] == len(list(p for p in Path(study.model.path).rglob("*") if p.is_file()))
    assert d["scorers"]["weights"] == {"keys": [], "files": {}, "lock": None, "origin": None}
    assert (d["scoring"]["decode"], d["scoring"]["static_filter"]) == (study.scoring.decode, "none")
    assert d["encoder"]["recipe_digest"].startswith("xxh3_128:") and "digest" in d["environment"]
    page = (layout.study / "card.md").read_text()
    assert FIXED_N in page and f"pab: {NOT_CONFIGURED}" in page and "No study statistics yet" in page
    assert AS_DECLARED.capitalize() in page


def test_the_card_names_the_vbench_dimensions_not_scored_and_the_totals_that_cannot_be_formed(project: Path) -> None:
    study = _study(project)
    cov = vbench_coverage(study.scorers)
    d = declared(study)
    assert d["vbench"]["missing"] == cov.missing and set(d["vbench"]["cannot_form"]) == set(cov.cannot_form)
    assert d["vbench"]["scored"] == ["temporal_flickering"]
    write_card(study)
    page = (Layout(study.scratch).study / "card.md").read_text()
    assert "totals that cannot be formed: quality_score (lacks subject_consistency" in page
    assert "overall_consistency" in page


def test_the_seal_is_the_same_in_another_process(project: Path) -> None:
    """Canonical JSON: the same inputs seal to the same digest, here and in a fresh `pairflow card`."""
    study = _study(project)
    first = seal(study)
    assert seal(study)["seal"] == first["seal"]
    out = project / "elsewhere"
    proc = subprocess.run([sys.executable, "-m", "pairflow.cli", "card", "--directory", str(project), "--out",
                           str(out)], capture_output=True, text=True, cwd=project, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "workflow")})
    assert proc.returncode == 0, proc.stderr
    other = json.loads((out / "card.json").read_text())
    assert other["seal"] == first["seal"], deviations(first["declared"], other["declared"])
    assert f"claim card {first['seal']}" in proc.stdout


def test_a_prompt_sheet_changed_after_sealing_is_a_deviation_and_the_sealed_card_is_kept(project: Path) -> None:
    study = _study(project)
    write_card(study)
    sealed = Layout(study.scratch).card.read_bytes()
    sheet = project / "config" / "panels" / "t.tsv"
    sheet.write_text(sheet.read_text() + "a3\ta kite over a field\n")
    card, _, found, paths = write_card(_study(project))
    assert Layout(study.scratch).card.read_bytes() == sealed and Layout(study.scratch).card not in paths
    fields = {f["field"]: f for f in found}
    assert {"prompt_sheets.t.sheet_digest", "prompt_sheets.t.prompts_digest", "prompt_sheets.t.prompts",
            "plan.prompts", "plan.candidates"} <= set(fields)
    assert fields["prompt_sheets.t.prompts"]["declared"] == 2 and fields["prompt_sheets.t.prompts"]["found"] == 3
    assert fields["prompt_sheets.t.sheet_digest"] == {"field": "prompt_sheets.t.sheet_digest",
                                                      "declared": card["declared"]["prompt_sheets"]["t"]["sheet_digest"],
                                                      "found": digest_file(sheet)}
    page = (Layout(study.scratch).study / "card.md").read_text()
    assert f"{len(found)} deviation(s) from the sealed card" in page and "prompt_sheets.t.sheet_digest" in page
    assert main(["card", "--directory", str(project)]) == 1  # the command says so in its exit code


def test_an_edited_sealed_card_is_refused(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    study = _study(project)
    write_card(study)
    path = Layout(study.scratch).card
    card = json.loads(path.read_text())
    card["declared"]["questions"]["alpha"] = 0.1
    path.write_text(json.dumps(card))
    with pytest.raises(IntegrityError, match="altered after sealing"):
        read_card(path)
    assert main(["card", "--directory", str(project)]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "was altered after sealing" in err


def test_the_results_part_carries_stats_json_numbers_the_noise_floor_and_the_archive_root(project: Path) -> None:
    study = _study(project)
    write_card(study)  # sealed before the study
    layout = Layout(study.scratch)
    layout.study_stats.write_text(json.dumps(STATS))
    latest = study.work / study.study / "latest.json"
    latest.parent.mkdir(parents=True)
    latest.write_text(json.dumps({"snapshot": "snapshots/abc", "root_digest": "xxh3_128:" + "1" * 32}))
    card, res, found, paths = write_card(study)
    assert res["finished"] and found == [] and res["comparison"] == AS_DECLARED
    assert paths == [layout.study / "card-results.json", layout.study / "card.md"]
    assert json.loads((layout.study / "card-results.json").read_text()) == res
    assert res["seal"] == card["seal"] and res["digest"] == digest_obj({k: v for k, v in res.items() if k != "digest"})
    assert res["stats"]["digest"] == digest_file(layout.study_stats)
    (arm,) = res["arms"]
    c = STATS["comparisons"][0]
    assert arm["arm"] == "pab"
    assert arm["speedup"] == {"estimate": c["speedup"]["geomean"], "ci": c["speedup"]["ci"], "ci_note": None}
    assert arm["compute_ratio"]["estimate"] == c["compute"]["ratio"] and arm["compute_ratio"]["ci"] == [None, None]
    assert arm["peak_memory_gib"] == {"control": 3.5, "treatment": NOT_RECORDED}
    (v,) = arm["against_control"]
    assert v["verdict_code"] == "worse_non_inferiority_not_shown" and v["p_verdict"] == 0.003
    assert v["text"] == verdict_text(c["metrics"][0]) and v["text"].startswith("worse, non-inferiority not shown")
    assert arm["against_iso_compute_control"] == NOT_CONFIGURED
    assert res["archive"] == {"snapshot": "snapshots/abc", "root_digest": "xxh3_128:" + "1" * 32}
    assert res["noise_floor"] == NOISE_NOT_MEASURED
    assert res["ledger"] == NOT_RECORDED
    floor = {"temporal_flickering": {"max_range": 0.001, "median_range": 0.0, "max_sd": 0.0005, "candidates": 4}}
    layout.repeatability().parent.mkdir(parents=True)
    layout.repeatability().write_text(json.dumps({"noise_floor": floor, "noise_flags": ["a flag"],
                                                  "latency_cv": {"across_runs_median": 0.01}}))
    res = write_card(study)[1]
    assert res is not None and res["noise_floor"]["noise_floor"] == floor
    assert res["noise_floor"]["noise_flags"] == ["a flag"]
    assert res["noise_floor"]["digest"] == digest_file(layout.repeatability())
    jobs = {f"j{i}": {"held": {"slot_s": 10.0 * i, "gpu_s": 5.0 * i},
                      "rows": [{"arm": "pab", "stage": "generate", "kind": "work", "slot_s": 3.0 * i},
                               {"arm": "control", "stage": "generate", "kind": "work", "slot_s": 2.0 * i}]}
            for i in (1, 2)}
    layout.ledger().write_text(json.dumps({"jobs": jobs}))
    res = write_card(study)[1]
    assert res is not None and res["ledger"] == {"jobs": 2, "slot_s": 30.0, "gpu_s": 15.0, "digest": digest_file(
        layout.ledger()), "slot_s_by_arm": {"control": 6.0, "pab": 9.0}}
    assert "- **Ledger**: 2 job(s), 30.0 slot-seconds (15.0 GPU-seconds)." in (layout.study / "card.md").read_text()
    page = (layout.study / "card.md").read_text()
    assert "| pab | 1.8× [1.5, 2.1] | 0.6× (no interval" in page and "3.5 / not recorded" in page
    assert "root `xxh3_128:" + "1" * 32 in page


def test_what_the_records_say_ran_is_read_against_the_seal(project: Path) -> None:
    """A generation record made at another commit than the sealed card's is a deviation
    ("as run"), counted; its other provenance equals the card's and is not listed."""
    study = _study(project)
    card = write_card(study)[0]
    layout = Layout(study.scratch)
    prov = provenance(study)
    c = candidates(study, study.panels[0])[1]
    gen = generation_record("t", c.key.prompt_id, 0, c.arm.name, 1, "v")
    gen.update({k: prov[k] for k in ("environment", "model", "encoder", "config_digest")},
               code={"commit": "0" * 40, "dirty": False})
    write_record(record_path(layout, c), gen)
    assert as_run(study, card["declared"]) == [{"field": "as run: code.commit", "declared": card["declared"]["code"][
        "commit"], "found": "0" * 40, "records": 1}]
    layout.study_stats.write_text(json.dumps(STATS))
    res = write_card(study)[1]
    assert res is not None and res["comparison"]["deviations"][-1]["field"] == "as run: code.commit"
    assert "| as run: code.commit |" in (layout.study / "card.md").read_text()


def test_the_scorer_weights_are_the_ones_scoring_verifies(tmp_path: Path) -> None:
    """The card's weight keys are ``stages.scoring.study_weights`` (which its floor cannot import)."""
    for static in ("none", "intersection"):
        for scorers in (["temporal_flickering", "psnr"], ["subject_consistency", "lpips", "temporal_flickering"]):
            cfg = small_config(tmp_path, tmp_path / "model", scorers=scorers, scoring={"static_filter": static})
            study = study_from_raw(cfg, tmp_path)
            assert scorer_weight_keys(study) == study_weights(study)


def _default_project(dest: Path) -> Path:
    """The project's own config and prompt sheets in ``dest``, nothing run: a card of it
    never reads the checkout's own results (a main job run there would be its records)."""
    shutil.copytree(ROOT / "config", dest / "config")
    return dest


def test_the_default_config_gets_a_card(tmp_path: Path) -> None:
    """The project's own config (config/config.yaml): 3 treatments x 3 tested metrics in one Holm family."""
    assert main(["card", "--directory", str(_default_project(tmp_path / "proj")), "--out", str(tmp_path)]) == 0
    card = read_card(tmp_path / "card.json")
    assert card["study"] == "tiny-default" and card["declared"]["questions"]["family"]["size"] == 9
    assert (tmp_path / "card.md").read_text().startswith("# Claim card: tiny-default")


def test_bad_out_and_a_card_of_another_study_are_refused_in_one_line(project: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "a-file"
    file.write_text("x")
    assert main(["card", "--directory", str(project), "--out", str(file)]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: --out {file}") and "is a file, not a folder" in err
    assert main(["card", "--directory", str(project / "nowhere")]) == 3
    assert "--directory" in capsys.readouterr().err
    other = tmp_path / "other"
    assert main(["card", "--directory", str(_default_project(tmp_path / "proj")), "--out",
                 str(other)]) == 0  # tiny-default's card
    capsys.readouterr()
    assert main(["card", "--directory", str(project), "--out", str(other)]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is the claim card of study 'tiny-default', not 'test'" in err


def test_a_card_of_the_finished_study_carries_its_numbers_and_finds_it_as_declared(finished_study: Path,
                                                                                  tmp_path: Path) -> None:
    """On the session's finished study (real Snakemake, every arm kind, the archive
    promoted): sealed now on the same machine and checkout, the records say it ran as
    declared; every arm's numbers are stats.json's; the archive root is latest.json's."""
    from conftest import study_config

    study = study_from_raw(study_config(finished_study), finished_study)
    card, res, found, _ = write_card(study, tmp_path)
    assert card["sealed"] == "after generation had begun"
    assert found == [] and res["comparison"] == AS_DECLARED, found
    stats = json.loads(Layout(study.scratch).study_stats.read_text())
    assert [a["arm"] for a in res["arms"]] == [c["treatment"] for c in stats["comparisons"]]
    for arm, c in zip(res["arms"], stats["comparisons"], strict=True):
        assert (arm["speedup"]["estimate"], arm["speedup"]["ci"]) == (c["speedup"]["geomean"], c["speedup"]["ci"])
        assert (arm["compute_ratio"]["estimate"], arm["compute_ratio"]["ci"]) == (c["compute"]["ratio"],
                                                                                  c["compute"]["ci"])
        assert [(v["metric"], v["verdict_code"], v["text"]) for v in arm["against_control"]] == [
            (m["metric"], m["verdict_code"], verdict_text(m)) for m in c["metrics"]]
    latest = json.loads((study.work / study.study / "latest.json").read_text())
    assert res["archive"] == {"snapshot": latest["snapshot"], "root_digest": latest["root_digest"]}
    # temporal_flickering only: psnr and ssim have no floor here, so they are values outside the family
    assert card["declared"]["questions"]["family"]["size"] == len(study.treatments)



def test_the_workflow_seals_the_card_before_generation_and_every_record_names_it(
        finished_study: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On the session's finished study (real Snakemake): the first generation job sealed
    the card before it generated anything; every generation record names that seal; rule
    card wrote the results part, as declared, against it; ``pairflow verify`` of the
    archive finds the archived card holding (so it adds nothing to its output)."""
    from conftest import study_config

    study = study_from_raw(study_config(finished_study), finished_study)
    layout = Layout(study.scratch)
    card = read_card(layout.card)
    assert card["sealed"] == "before generation"
    records = [json.loads(p.read_text()) for p in layout.panels.glob("*/records/*/*.json")]
    assert records and {r["card_seal"] for r in records} == {card["seal"]}
    res = json.loads((layout.study / "card-results.json").read_text())
    assert res["seal"] == card["seal"] and res["comparison"] == AS_DECLARED and res["finished"]
    work = finished_study / "results" / "work" / study.study
    assert main(["verify", str(work)]) == 0
    assert capsys.readouterr().out == f"verify {work}: OK\n"  # the archived card holds: nothing to add
