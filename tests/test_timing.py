"""timing: the timed pass's order, pair sample, repeat CV, phase split and CUDA record.

The pass runs in this process on the embedded tiny model; bulk records come from the
real generation task, called in-process (the same function Parsl workers run)."""

from __future__ import annotations

import copy
import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import score_record, small_config

from pairflow.analysis import sequential
from pairflow.analysis.stats import analyse
from pairflow.generation.provenance import provenance
from pairflow.layout import Layout
from pairflow.plan.candidates import candidates, panel_dir, record_path, task_identity, timing_path
from pairflow.plan.config import StatsSpec, study_from_raw
from pairflow.plan.context import write_context
from pairflow.records.store import read_record
from pairflow.stages.generation import generate_task
from pairflow.stages.timing import cv, run_order, run_timed_pass, sampled_pairs


def _study(tmp: Path, model: Path, **timing: object):  # type: ignore[no-untyped-def]
    cfg = small_config(tmp, model, timing={"warmup": 1, "repeats": 2, **timing})
    return study_from_raw(copy.deepcopy(cfg), tmp, source="test")


def _bulk(study) -> None:  # type: ignore[no-untyped-def]
    """Generation records for every candidate, made by the worker's own task function."""
    ref = write_context(study.scratch, {"study": study, "provenance": provenance(study)})
    for p in study.panels:
        for c in candidates(study, p):
            generate_task({"context": ref, "candidate": c, "identity": task_identity(c)})


def test_run_order_is_seeded_keeps_pairs_adjacent_and_varies_which_arm_runs_first() -> None:
    pairs = [[f"c{i}", f"t{i}"] for i in range(6)]
    first = run_order(pairs, 7, 0)
    assert first == run_order(pairs, 7, 0)  # seeded: the same order on a rerun
    assert sorted(first) == sorted(x for p in pairs for x in p)
    for i in range(0, len(first), 2):  # a pair's arms run back to back
        assert first[i][1:] == first[i + 1][1:]
    leaders = {run_order(pairs, 7, r)[0][0] for r in range(12)} | {x[0] for x in first[::2]}
    assert leaders == {"c", "t"}  # neither arm always goes first
    assert run_order(pairs, 7, 1) != first


def test_cv_is_sample_sd_over_mean() -> None:
    assert cv([1.0]) is None
    assert cv([1.0, 3.0]) == pytest.approx(2 ** 0.5 / 2)


def test_pair_sample_is_per_panel_seeded_and_all_by_default(tiny_model: Path, tmp_path: Path) -> None:
    assert len(sampled_pairs(_study(tmp_path, tiny_model, pairs="all"), ["t"])) == 2
    one = sampled_pairs(_study(tmp_path, tiny_model, pairs=1), ["t"])
    assert len(one) == 1 and one == sampled_pairs(_study(tmp_path, tiny_model, pairs=1), ["t"])
    seeds = {frozenset(sampled_pairs(_study(tmp_path, tiny_model, pairs=1, seed=s), ["t"])) for s in range(8)}
    assert len(seeds) == 2  # the seed chooses the sample


def test_timed_pass_samples_pairs_splits_phases_and_reports_cv(tiny_model: Path, tmp_path: Path) -> None:
    study = _study(tmp_path, tiny_model, pairs=1, max_cv=1e-9)
    _bulk(study)
    out = study.scratch / "study" / "timing.json"
    run_timed_pass(study, ["t"], out)
    cs = candidates(study, study.panels[0])
    recs = {(c.arm.name, c.key.prompt_id): read_record(timing_path(Layout(study.scratch), c)) for c in cs}
    timed = [r for r in recs.values() if r["sampled"]]
    assert len(timed) == 2 and {r["arm"]["name"] for r in timed} == {"control", "pab"}
    assert len({r["candidate"]["prompt_id"] for r in timed}) == 1  # both arms of one pair
    for r in timed:
        t = r["timing"]
        assert r["matches_bulk_frames"] is True and t["clock"] == "perf_counter" and t["rounds"] == [0, 1]
        assert t["latency_s"] == pytest.approx(sorted(t["seconds"])[0] / 2 + sorted(t["seconds"])[1] / 2)
        assert t["cv"] == pytest.approx(cv(t["seconds"])) and t["over_max_cv"] is True  # max_cv 1e-9
        ph = t["phases_s"]
        assert ph["denoise"] > 0 and ph["decode"] > 0 and ph["denoise"] + ph["decode"] <= ph["total"]
        assert t["cuda_settings"] is None and r["gpu"] is None
    skipped = [r for r in recs.values() if not r["sampled"]]
    assert len(skipped) == 2 and all(r["timing"]["latency_s"] is None for r in skipped)
    gen = [read_record(record_path(Layout(study.scratch), c)) for c in cs]
    control = {(g["candidate"]["prompt_id"], g["candidate"]["seed"]): g for g in gen if g["arm"]["name"] == "control"}
    scores = [score_record(g, control[g["candidate"]["prompt_id"], g["candidate"]["seed"]], {}) for g in gen]
    stats = analyse(gen, scores, list(recs.values()), ["pab"], StatsSpec(200, 0.95, 0))
    lat = stats["comparisons"][0]["latency"]
    assert lat["n_pairs"] == 1 and lat["sampled_pairs"] == 1 and lat["pairs_over_max_cv"] == 1
    assert lat["control_cv_median"] == pytest.approx(recs[("control", timed[0]["candidate"]["prompt_id"])]
                                                    ["timing"]["cv"])
    assert any("seeded sample of 1 of 2" in n for n in stats["comparisons"][0]["notes"])
    before = {k: r["record_digest"] for k, r in recs.items()}
    run_timed_pass(study, ["t"], out)  # nothing to time: every record kept
    assert {(c.arm.name, c.key.prompt_id): read_record(timing_path(Layout(study.scratch), c))["record_digest"] for c in cs} == before
    every = _study(tmp_path, tiny_model, pairs="all")  # only the two unsampled candidates run
    run_timed_pass(every, ["t"], out)
    after = {(c.arm.name, c.key.prompt_id): read_record(timing_path(Layout(every.scratch), c)) for c in cs}
    assert all(r["sampled"] for r in after.values())
    assert {k for k, r in after.items() if r["record_digest"] == before[k]} == {k for k, r in recs.items()
                                                                               if r["sampled"]}
    assert panel_dir(Layout(study.scratch), "t").is_dir()


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.skipif(not _cuda(), reason="needs a CUDA device: this machine has none (run benchmarks/gpu_check.sh "
                                        "where one is lent)")
def test_on_cuda_events_time_the_run_settings_are_pinned_and_the_device_is_read(tiny_model: Path,
                                                                                 tmp_path: Path) -> None:
    import torch

    from pairflow.generation.generate import CUDA_SETTINGS

    study = _study(tmp_path, tiny_model)
    _bulk(study)
    run_timed_pass(study, ["t"], study.scratch / "study" / "timing.json")
    for c in candidates(study, study.panels[0]):
        r = read_record(timing_path(Layout(study.scratch), c))
        t = r["timing"]
        assert t["clock"] == "cuda_events" and t["device"] == "cuda" and r["matches_bulk_frames"] is True
        assert {k: t["cuda_settings"][k] for k in CUDA_SETTINGS} == CUDA_SETTINGS
        assert torch.backends.cudnn.benchmark is False and torch.backends.cudnn.allow_tf32 is False
        assert t["peak_device_mb"] > 0 and t["phases_s"]["denoise"] > 0 and t["phases_s"]["decode"] > 0
        for run in r["gpu"]:
            for side in ("gpu_before", "gpu_after"):
                state = run[side]
                assert "unavailable" in state or ({"sm_clock_mhz", "throttle_reasons", "temperature_c", "power_w",
                                                   "other_processes"} <= set(state))


def test_latency_is_the_median_of_the_repeats_not_the_mean(tiny_model: Path, tmp_path: Path) -> None:
    """Regression (issue 23): the known-answer test used 2 repeats, where median and mean
    agree, so replacing the median by the mean left the suite green. Three repeats with
    an outlier (a background job stalls one run): the record's latency is the median."""
    from conftest import generation_record

    from pairflow.stages.timing import _write_timing

    study = _study(tmp_path, tiny_model, repeats=3)
    c = candidates(study, study.panels[0])[0]
    bulk = generation_record(c.key.panel, c.key.prompt_id, c.key.seed, c.arm.name, c.key.stream_seed, "v")
    bulk["record_digest"] = "xxh3_128:" + "0" * 32
    seconds = [1.0, 1.2, 9.0]  # median 1.2, mean 3.73
    runs = [{"round": r, "seconds": s, "phases": {"denoise": 0.8 * s, "decode": 0.1 * s, "other": 0.1 * s,
                                                  "total": s}} for r, s in enumerate(seconds)]
    _write_timing(study, c, bulk, runs, True, "cpu", 1, None, None)
    t = read_record(timing_path(Layout(study.scratch), c))["timing"]
    assert t["latency_s"] == 1.2 and t["seconds"] == seconds and t["rounds"] == [0, 1, 2]
    assert t["phases_s"]["total"] == 1.2 and t["phases_s"]["denoise"] == pytest.approx(0.96)
    assert t["cv"] == pytest.approx(cv(seconds)) and t["over_max_cv"] is True


def _six_prompts(tmp: Path, model: Path, **timing: object):  # type: ignore[no-untyped-def]
    sheet = tmp / "config" / "panels" / "six.tsv"
    sheet.parent.mkdir(parents=True, exist_ok=True)
    sheet.write_text("prompt_id\tprompt\n" + "".join(f"s{i}\tprompt number {i}\n" for i in range(6)))
    cfg = small_config(tmp, model, panels={"six": {"sheet": str(sheet), "seeds": [0]}},
                       timing={"warmup": 0, "repeats": 1, "pilot_prompts": 3, **timing})
    return study_from_raw(copy.deepcopy(cfg), tmp, source="test")


def test_sequential_timing_times_the_pilot_then_what_the_plan_asks_and_records_why_it_stopped(
        tiny_model: Path, tmp_path: Path) -> None:
    """timing.pairs: auto (the default): a 3-prompt pilot, then as many prompts as the
    pilot's spread asks for, here capped by timing.max_prompts (an impossible precision, so
    the outcome does not hang on this machine's noise; the precision branch is
    test_sequential's). Untimed candidates say why; the stats apply Stein's interval."""
    study = _six_prompts(tmp_path, tiny_model, precision=1e-6, max_prompts=4)
    _bulk(study)
    out = study.scratch / "study" / "timing.json"
    run_timed_pass(study, ["six"], out)
    cs = candidates(study, study.panels[0])
    recs = {c.key.candidate_id: read_record(timing_path(Layout(study.scratch), c)) for c in cs}
    timed = [r for r in recs.values() if r["sampled"]]
    order = [p for _panel, p in sequential.order([("six", f"s{i}") for i in range(6)], 0)]
    assert sorted(r["candidate"]["prompt_id"] for r in timed) == sorted(order[:4] * 2)  # 4 prompts x 2 arms
    design = {"design": "stein-two-stage", "pilot_prompts": 3, "precision": 1e-6, "max_prompts": 4, "level": 0.95}
    for r in timed:
        assert r["timing"]["sequential"] == {**design, "pilot": r["candidate"]["prompt_id"] in order[:3]}
        assert r["matches_bulk_frames"] is True  # the free repeatability check
    assert {r["timing"].get("stopped") for r in recs.values() if not r["sampled"]} == {"ceiling"}
    tele = json.loads(Layout(study.scratch).timed_pass_telemetry.read_text())
    assert tele["sequential"]["arms"]["pab"]["stopped"] == "ceiling" and tele["frames_match_bulk"] == {
        "compared": 8, "identical": 8}
    assert tele["not_sampled"] == sum(not r["sampled"] for r in recs.values()) == 4
    gen = [read_record(record_path(Layout(study.scratch), c)) for c in cs]
    control = {g["candidate"]["prompt_id"]: g for g in gen if g["arm"]["name"] == "control"}
    scores = [score_record(g, control[g["candidate"]["prompt_id"]], {}) for g in gen]
    comp = analyse(gen, scores, list(recs.values()), ["pab"], StatsSpec(200, 0.95, 0))["comparisons"][0]
    lat, sp = comp["latency"], comp["speedup"]
    assert lat["n_pairs"] == 4 and lat["timed_prompts"] == 4 and lat["repeats"] == [1]
    assert lat["design"]["design"] == "stein-two-stage" and lat["design"]["stopped"] == ["ceiling"]
    by = {(r["arm"]["name"], r["candidate"]["prompt_id"]): r["timing"]["latency_s"] for r in timed}
    logs = {p: math.log(by["control", p] / by["pab", p]) for p in order[:4]}
    pilot = np.array([logs[p] for p in order[:3]])
    stein = 4.302652729749464 * pilot.std(ddof=1) / math.sqrt(4)  # t(2) at 0.975, over N = 4
    t_half = 3.182446305284263 * np.array(list(logs.values())).std(ddof=1) / math.sqrt(4)  # t(3)
    assert lat["design"]["half_width"] == pytest.approx(stein)
    assert math.log(sp["ci"][1] / sp["geomean"]) == pytest.approx(max(stein, t_half))
    assert any("sequential timing" in n for n in comp["notes"])
    before = {k: r["record_digest"] for k, r in recs.items()}
    run_timed_pass(study, ["six"], out)  # nothing to time: every record kept
    assert {c.key.candidate_id: read_record(timing_path(Layout(study.scratch), c))["record_digest"]
            for c in cs} == before

    smaller = _six_prompts(tmp_path, tiny_model, precision=1e-6, max_prompts=3)
    run_timed_pass(smaller, ["six"], out)  # same bulk records, another design: the pilot re-timed
    recs = {c.key.candidate_id: read_record(timing_path(Layout(smaller.scratch), c)) for c in cs}
    assert sorted(r["candidate"]["prompt_id"] for r in recs.values() if r["sampled"]) == sorted(order[:3] * 2)
    assert all(r["record_digest"] != before[k] for k, r in recs.items() if r["sampled"])
    assert {r["timing"].get("stopped") for r in recs.values() if not r["sampled"]} == {"ceiling"}


def test_status_follows_the_pass_live_before_any_record_is_written(tiny_model: Path, tmp_path: Path) -> None:
    """Regression (issue 41): a block's records are written together once its last repeat
    round ends (here the whole pass is one block), so ``pairflow status`` read ``timing
    0/4``, rate ``-``, until the pass's last milliseconds. The pass's heartbeat now counts
    the timed runs: read at each of the pass's own progress lines (a log handler, in the
    pass's thread), status gives one more candidate each ``repeats`` runs, with a rate,
    the time left and the pass as an active slot, while no timing record exists yet."""
    from pairflow.report.status import study_status

    study = _study(tmp_path, tiny_model, warmup=0, repeats=2, pairs="all")
    _bulk(study)
    cs = candidates(study, study.panels[0])
    seen: list[tuple[int, int, float | None, float | None, int, int]] = []

    class Snapshot(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "done (" in record.getMessage():
                s = next(r for r in study_status(study) if r.stage == "timing")
                written = sum(timing_path(Layout(study.scratch), c).exists() for c in cs)
                seen.append((s.done, s.total, s.rate_per_s, s.left_s, s.active_slots, written))

    handler = Snapshot(level=logging.INFO)
    timing_log = logging.getLogger("pairflow.stages.timing")
    timing_log.addHandler(handler)
    level = timing_log.level
    timing_log.setLevel(logging.INFO)
    try:
        run_timed_pass(study, ["t"], study.scratch / "study" / "timing.json")
    finally:
        timing_log.removeHandler(handler)
        timing_log.setLevel(level)
    assert [(done, total, written) for done, total, *_, written in seen] == [(1, 4, 0), (2, 4, 0), (3, 4, 0),
                                                                          (4, 4, 0)]
    assert all(rate is not None and rate > 0 and slots == 1 for _d, _t, rate, _l, slots, _w in seen)
    assert seen[0][3] == pytest.approx(3 / seen[0][2])  # time left: 3 candidates at the pass's rate
    after = next(r for r in study_status(study) if r.stage == "timing")
    assert (after.done, after.total) == (4, 4)  # the records now; the heartbeat says nothing is in flight
    beat = json.loads(next((panel_dir(Layout(study.scratch), "t") / "run" / "timed-pass" / "heartbeats").glob(
        "*.json")).read_text())
    assert beat["phase"] == "idle" and beat["timing"]["in_flight"] == 0
