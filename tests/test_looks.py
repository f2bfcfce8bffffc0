"""Group-sequential looks wired into a study (``analysis.looks``, ``stages.steps.look_panel``
and ``decide_look``, rule look_panel and checkpoint look): the release per look, the
decision file, and a real study that continues after its first look and stops at its
second of three, never generating the prompts of the third."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import copy_project, reuse_arms_check, run_snakemake, small_config, write_config

from pairflow.analysis import looks
from pairflow.errors import ConfigError
from pairflow.layout import Layout
from pairflow.plan.config import LOOK_FORMAT, look_counts, look_stops, planned_digest, stop_decision, study_from_raw

PAIRFLOW = str(Path(sys.executable).with_name("pairflow"))


def _study(tmp_path: Path, tiny_model: Path, prompts: int, panels: int = 1, **seq: object):
    cfg = small_config(tmp_path, tiny_model)
    sheets = {}
    for j in range(panels):
        sheet = tmp_path / "config" / "panels" / f"p{j}.tsv"
        sheet.write_text("prompt_id\tprompt\n" + "".join(f"q{i}\tprompt {i} of {j}\n" for i in range(prompts + j)))
        sheets[f"p{j}"] = {"sheet": str(sheet), "seeds": [0, 1]}
    cfg["panels"] = sheets
    cfg["sequential"] = {"enabled": True, **seq}
    return cfg, study_from_raw(cfg, tmp_path)


def test_each_look_releases_every_panels_share_in_sheet_order(tmp_path: Path, tiny_model: Path) -> None:
    cfg, study = _study(tmp_path, tiny_model, 8, panels=2, looks=[0.25, 0.5, 1])
    assert look_counts(study) == [{"p0": 2, "p1": 3}, {"p0": 4, "p1": 5}, {"p0": 8, "p1": 9}]
    at = study.at_look(2)
    assert [q.prompt_id for q in at.panel("p1").prompts] == ["q0", "q1", "q2", "q3", "q4"]
    assert at.panel("p1").planned == study.panel("p1").planned and len(at.panel("p1").held) == 4
    assert at.panel_digest("p0") == study.panel_digest("p0")  # a release never changes the plan's digest
    order = looks.release_order(study)
    assert order[:5] == ["p0/q0", "p0/q1", "p1/q0", "p1/q1", "p1/q2"] and len(order) == 17 == len(set(order))
    d = looks.design(study)
    assert d.looks == (5, 9, 17) and d.max_prompts == 17
    rule = looks.stopping_rule(study)
    assert rule["kind"] == "group-sequential" and rule["prompts_at_looks"] == [5, 9, 17]
    assert rule["boundaries_first_share"][0] > rule["boundaries_first_share"][-1]  # O'Brien-Fleming-type


def test_looks_are_refused_where_they_cannot_run(tmp_path: Path, tiny_model: Path) -> None:
    with pytest.raises(ConfigError, match=r"sequential/looks.*ending at 1"):
        _study(tmp_path, tiny_model, 8, looks=[0.5, 0.9])
    with pytest.raises(ConfigError, match=r"first look releases 1 prompt over every panel"):
        _study(tmp_path, tiny_model, 3, looks=[0.2, 1])
    with pytest.raises(ConfigError, match=r"looks 0.5 and 0.6 release the same 2 prompts"):
        _study(tmp_path, tiny_model, 3, looks=[0.5, 0.6, 1])
    with pytest.raises(ConfigError, match=r"sequential/enabled.*fleet/panel_jobs: combined"):
        cfg = small_config(tmp_path, tiny_model, sequential={"enabled": True})
        cfg["fleet"]["panel_jobs"] = "per-stage"
        study_from_raw(cfg, tmp_path)


def _cells(study, looks_n: int, shift: float, seed: int = 0):
    """Per-pair values for the one question of ``small_config`` (pab on temporal_flickering,
    a difference from 0), the prompts released by look ``looks_n``."""
    rng = np.random.default_rng(seed)
    at = study.at_look(looks_n)
    values = {(f"{p.name}/{q.prompt_id}", s): shift + rng.normal(0, 0.01) for p in at.panels for q in p.prompts
              for s in p.seeds}
    (arm, metric, q), = [c for c in looks.questions(study) if c[2] is not None]
    return {(arm, metric): (q, values)}


def test_a_look_stops_only_when_every_question_is_decided(tmp_path: Path, tiny_model: Path) -> None:
    _, study = _study(tmp_path, tiny_model, 12, looks=[0.5, 1], spending="pocock")
    clear = looks.decide(study, 1, _cells(study, 1, 0.5))
    assert clear["stop"] and clear["why"] == "every question decided" and clear["released"] == {"p0": 6}
    (q,) = clear["questions"]
    assert q["decided"] and q["decided_at"] == 1 and q["interval"][0] > 0.4  # the repeated CI holds the shift
    null = looks.decide(study, 1, _cells(study, 1, 0.0))
    assert not null["stop"] and null["why"] == "1 of 1 question(s) undecided"
    last = looks.decide(study, 2, _cells(study, 2, 0.0))
    assert last["stop"] and last["why"].startswith("the last look")
    seq = looks.section(study.at_look(1), clear, {"total_slot_s": 100.0, "unit": "CPU-worker-hours",
                                                   "stage_slot_s": {"generate": 60.0, "score": 20.0, "timing": 10.0}},
                        {"jobs": 1.0, "work_s": 12.0, "slot_s": 30.0})
    assert seq["candidates"] == {"planned": 48, "generated": 24, "saved": 24}
    assert seq["saved_slot_s"] == pytest.approx(40.0)  # half of generation and scoring (timing samples pairs)
    assert seq["measured"]["work_s_per_candidate"] == pytest.approx(0.5)  # 12 s of work for 24 candidates
    assert seq["measured"]["saved_work_s"] == pytest.approx(12.0)
    assert "24 of 48 candidates not generated (50%" in looks.sentence(seq)


def test_a_question_the_static_filter_cut_holds_the_study_open_and_keeps_its_alpha(tmp_path: Path,
                                                                                   tiny_model: Path) -> None:
    """A question missing a released prompt is not monitored: no stop before the last look,
    and the monitored ones share only their part of alpha (here half of it: 2 questions)."""
    _, study = _study(tmp_path, tiny_model, 12, looks=[0.5, 1], spending="pocock", multiplicity="bonferroni")
    cells = _cells(study, 1, 0.5)
    (key, (q, values)), = cells.items()
    cut = {k: v for k, v in values.items() if k[0] != "p0/q0"}
    both = {**cells, ("pab", "cut"): (q, cut)}
    got = looks.decide(study, 1, both)
    assert not got["stop"] and got["why"] == "1 of 2 question(s) undecided"
    rows = {r["metric"]: r for r in got["questions"]}
    assert rows["cut"]["monitored"] is False and "1 of the 6 released prompts have no value" in rows["cut"]["note"]
    assert rows[key[1]]["decided"] and rows[key[1]]["alpha_share"] == pytest.approx(0.05 / 2)
    assert looks.decide(study, 2, {**_cells(study, 2, 0.5), ("pab", "cut"): (q, cut)})["stop"]  # the last look


def test_the_stopping_decision_releases_the_study_and_only_for_its_own_design(tmp_path: Path,
                                                                              tiny_model: Path) -> None:
    """Once a look's decision says stop, the study (as every later job and `pairflow verify`
    build it) holds only the released prompts, the rest ``held``; a decision made for other
    looks or another sheet releases nothing; an unreadable one is refused with the fix."""
    cfg, study = _study(tmp_path, tiny_model, 12, looks=[0.5, 1], spending="pocock")
    decision = looks.decide(study, 1, _cells(study, 1, 0.5))
    path = Layout(study.scratch).look(1)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(decision))
    stopped = study_from_raw(cfg, tmp_path)
    assert [len(p.prompts) for p in stopped.panels] == [6] and len(stopped.panels[0].held) == 6
    assert stopped.panel_digest("p0") == study.panel_digest("p0")
    other = {**cfg, "sequential": {**cfg["sequential"], "looks": [0.25, 1]}}
    assert [len(p.prompts) for p in study_from_raw(other, tmp_path).panels] == [12]
    (tmp_path / "config" / "panels" / "p0.tsv").write_text("prompt_id\tprompt\n" + "".join(
        f"z{i}\tanother prompt {i}\n" for i in range(4)))
    assert [len(p.prompts) for p in study_from_raw(cfg, tmp_path).panels] == [4]
    path.write_text("{not json")
    with pytest.raises(ConfigError, match=r"look-1.json cannot be read.*remove it and rerun"):
        study_from_raw(cfg, tmp_path)


@pytest.mark.slow
def test_an_unreadable_decision_file_is_named_with_its_fix(tmp_path: Path, tiny_model: Path) -> None:
    """A look's decision file that is not JSON, not a JSON object, lacks 'stop', or (when it
    is the study's own stopping decision) releases no prompts: a ConfigError naming the
    file, what is wrong and the fix, from the input function (look_stops) and from planning
    (stop_decision) alike (the unparsable case through study_from_raw is in the test above)."""
    cfg, study = _study(tmp_path, tiny_model, 8, looks=[0.5, 1])
    path = Layout(study.scratch).look(1)
    path.parent.mkdir(parents=True)
    fix = "remove it and rerun"
    for text, why in (("{not json", "Expecting property name"), ("[1, 2]", "a JSON list, not an object")):
        path.write_text(text)
        for read in (lambda: look_stops(path), lambda: stop_decision(study.scratch, study.panels, [0.5, 1])):
            with pytest.raises(ConfigError, match="look-1.json cannot be read") as e:
                read()
            assert why in str(e.value) and fix in str(e.value)
    path.write_text(json.dumps({"format": LOOK_FORMAT}))
    with pytest.raises(ConfigError, match=r"look-1.json cannot be read \(no key 'stop'\).*" + fix):
        look_stops(path)
    own = {"format": LOOK_FORMAT, "planned": planned_digest(study.panels, [0.5, 1]), "stop": True}
    path.write_text(json.dumps({**own, "released": {"p0": 0}}))
    with pytest.raises(ConfigError, match=r"look-1.json releases \{'p0': 0\}: counts must be positive.*" + fix):
        stop_decision(study.scratch, study.panels, [0.5, 1])
    path.write_text(json.dumps({**own, "released": ["p0"]}))
    with pytest.raises(ConfigError, match="look-1.json cannot be read .*" + fix):
        stop_decision(study.scratch, study.panels, [0.5, 1])


def test_a_study_continues_after_look_1_and_stops_at_look_2_of_3(tiny_model: Path, tmp_path: Path) -> None:
    """12 prompts in looks of 3, 6 and 12. A margin of 1 on temporal_flickering (whose
    differences lie within it) is decided as soon as the sign-flip test can: not at 3
    prompts (its smallest p is 0.25), but at 6 (0.031, under the Pocock-type boundary's
    0.045 at alpha 0.1). The third look's prompts are never generated nor missed."""
    project = copy_project(tmp_path / "proj")
    cfg = small_config(project, tiny_model)
    sheet = project / "config" / "panels" / "t.tsv"
    sheet.write_text("prompt_id\tprompt\n" + "".join(f"a{i}\tscene number {i}\n" for i in range(12)))
    cfg["stats"].update(level=0.9, margins={"temporal_flickering": 1.0})
    cfg["sequential"] = {"enabled": True, "looks": [0.25, 0.5, 1], "spending": "pocock"}
    cfg["timing"] = {"repeats": 1}
    write_config(project, cfg)
    reuse_arms_check(project, cfg)
    run_snakemake(project)
    layout = Layout(Path(cfg["storage"]["scratch"]))
    first, second = (json.loads(layout.look(k).read_text()) for k in (1, 2))
    assert not first["stop"] and second["stop"] and second["why"] == "every question decided"
    assert not layout.look(3).exists() and not layout.look_manifest("t", 3, "generation").exists()
    records = sorted(p.stem for p in (layout.panel("t") / "records").rglob("*.json"))
    assert records == sorted(f"a{i}-s0" for i in range(6) for _arm in ("control", "pab"))
    stats = json.loads(layout.study_stats.read_text())
    seq = stats["sequential"]
    assert (seq["look"], seq["prompts"], seq["max_prompts"]) == (2, 6, 12)
    assert seq["candidates"] == {"planned": 24, "generated": 12, "saved": 12}
    assert seq["measured"]["jobs"] == 2 and seq["measured"]["saved_work_s"] > 0  # the two looks' jobs' telemetry
    assert stats["comparisons"][0]["n_prompts"] == 6
    table = layout.study_table().read_text()
    assert "## Group-sequential looks" in table and "Stopped at look 2 (6 prompts; t 6)" in table
    card = json.loads(layout.card.read_text())
    assert card["declared"]["plan"]["stopping_rule"]["prompts_at_looks"] == [3, 6, 12]
    # Nothing the stop left out is missing: verify passes, and a rerun has nothing to do.
    verify = subprocess.run([PAIRFLOW, "verify", str(layout.scratch)], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "Nothing to be done" in run_snakemake(project, "-n")
    assert yaml.safe_load((project / "config" / "config.yaml").read_text())["sequential"]["enabled"]


def test_the_sequential_example_config_is_valid(tmp_path: Path) -> None:
    """config/examples/sequential.yaml (docs/metrics-and-verdicts.md, "Group-sequential
    looks") passes every config check, with iso-compute controls and looks on."""
    root = Path(__file__).resolve().parents[1]
    raw = yaml.safe_load((root / "config" / "examples" / "sequential.yaml").read_text())
    raw["storage"] = {"scratch": str(tmp_path / "s"), "work": str(tmp_path / "w")}
    study = study_from_raw(raw, root)
    assert study.iso_compute and study.sequential is not None
    assert looks.design(study).looks == (10, 20)
