"""Known-answer checks for the paired statistics, on synthetic records."""

from __future__ import annotations

import copy
import math
import random

import pytest

from pairflow.errors import PairingError
from pairflow.stats import StatsSettings, analyse, holm

S = StatsSettings(resamples=2000, level=0.95, seed=0)
NR = {"kind": "NR", "higher_is_better": True}
FR = {"kind": "FR", "higher_is_better": True}


def records(effect: float = 0.0, ratio: float = 1.0, prompts: int = 12, seeds: int = 2, same_video: bool = False,
            noise: float = 0.05, rng_seed: int = 1) -> tuple[list[dict], list[dict], list[dict]]:
    """Control and treatment records with a known additive effect on 'q' and a known
    latency ratio control/treatment."""
    rng = random.Random(rng_seed)
    gen, scores, timings = [], [], []
    for p in range(prompts):
        base = rng.gauss(0.5, 0.2)
        for s in range(seeds):
            noise_c, noise_t = rng.gauss(0, noise), rng.gauss(0, noise)
            lat = 1.0 + rng.random()
            for arm in ("control", "treat"):
                cand = {"panel": "p", "prompt_id": f"p{p:02d}", "seed": s, "stream_seed": 1000 * p + s}
                common = {"model": {"weights": {"w": "1"}}, "encoder": {"fingerprint": {"digest": "f"}, "recipe_digest": "r"},
                          "generation": {"frames": 9, "height": 64, "width": 64, "steps": 6}}
                digest = f"v{p}{s}" + ("" if arm == "control" or same_video else "t")
                gen.append({"candidate": cand, "arm": {"name": arm}, "video": {"digest": digest}, **common})
                timings.append({"candidate": cand, "arm": {"name": arm}, "matches_bulk_frames": True,
                                "timing": {"pass": "timed", "latency_s": lat if arm == "control" else lat / ratio}})
                q = base + (noise_c if arm == "control" else noise_t + effect)
                sc = {"q": {"value": q, "spec": NR}}
                if arm == "treat":
                    sc["psnr"] = {"value": 30.0 + rng.gauss(0, 1), "spec": FR}
                scores.append({"candidate": cand, "arm": {"name": arm}, "scores": sc})
    return gen, scores, timings


def metric(result: dict, name: str) -> dict:
    return next(m for m in result["comparisons"][0]["metrics"] if m["metric"] == name)


def test_known_offset_is_recovered_with_sign_and_interval() -> None:
    gen, scores, timings = records(effect=0.1)
    m = metric(analyse(gen, scores, timings, ["treat"], S), "q")
    assert m["diff"] > 0
    assert m["ci"][0] <= 0.1 <= m["ci"][1]
    assert m["ci"][0] > 0  # the interval excludes zero
    assert m["p_holm"] < 0.01
    assert m["win_rate"] > 0.8


def test_negative_effect_has_negative_sign() -> None:
    gen, scores, timings = records(effect=-0.1)
    m = metric(analyse(gen, scores, timings, ["treat"], S), "q")
    assert m["ci"][1] < 0 and m["diff"] < 0


def test_no_effect_is_not_significant() -> None:
    gen, scores, timings = records(effect=0.0)
    m = metric(analyse(gen, scores, timings, ["treat"], S), "q")
    assert m["ci"][0] < 0 < m["ci"][1]
    assert m["p_holm"] > 0.05


def test_known_latency_ratio_is_recovered_as_speedup() -> None:
    gen, scores, timings = records(ratio=2.0)
    sp = analyse(gen, scores, timings, ["treat"], S)["comparisons"][0]["speedup"]
    assert math.isclose(sp["geomean"], 2.0, rel_tol=1e-9)
    assert sp["ci"][0] <= 2.0 <= sp["ci"][1]


def test_bitwise_identical_arm_is_flagged_no_effect() -> None:
    gen, scores, timings = records(same_video=True)
    flags = analyse(gen, scores, timings, ["treat"], S)["comparisons"][0]["flags"]
    assert "no effect: the arm did not change the computation" in flags


def test_missing_partner_is_an_error_unless_policy_says_drop() -> None:
    gen, scores, timings = records(effect=0.1)
    gen = [g for g in gen if not (g["arm"]["name"] == "treat" and g["candidate"]["prompt_id"] == "p03"
                                  and g["candidate"]["seed"] == 1)]
    with pytest.raises(PairingError, match="1 pair.*lack a partner.*p/p03 seed 1.*drop-pair"):
        analyse(gen, scores, timings, ["treat"], S)
    r = analyse(gen, scores, timings, ["treat"], StatsSettings(2000, 0.95, 0, "drop-pair"))
    assert r["comparisons"][0]["n_pairs"] == 23
    assert "dropped" in r["comparisons"][0]["notes"][0]


@pytest.mark.parametrize("path, label", [
    (("model", "weights"), "model"), (("encoder", "fingerprint", "digest"), "encoder fingerprint"),
    (("encoder", "recipe_digest"), "encoder recipe"), (("generation", "steps"), "steps"),
    (("generation", "height"), "height"),
])
def test_incomparable_arms_are_refused_naming_field_and_values(path, label) -> None:  # type: ignore[no-untyped-def]
    gen, scores, timings = records()
    g = next(r for r in gen if r["arm"]["name"] == "treat")
    target = g
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = "OTHER"
    with pytest.raises(PairingError, match=f"{label} differs.*OTHER"):
        analyse(gen, scores, timings, ["treat"], S)


def test_result_does_not_depend_on_record_order() -> None:
    gen, scores, timings = records(effect=0.05)
    a = analyse(gen, scores, timings, ["treat"], S)
    g2, s2 = copy.deepcopy(gen), copy.deepcopy(scores)
    random.Random(5).shuffle(g2)
    random.Random(6).shuffle(s2)
    assert analyse(g2, s2, timings, ["treat"], S) == a


def test_latency_comes_only_from_the_timed_pass() -> None:
    gen, scores, timings = records()
    with pytest.raises(PairingError, match="no timed-pass latency"):
        analyse(gen, scores, timings[2:], ["treat"], S)


def test_duplicate_record_is_refused() -> None:
    gen, scores, timings = records()
    with pytest.raises(PairingError, match="two records for arm control"):
        analyse(gen + gen[:1], scores, timings, ["treat"], S)


def test_holm_matches_reference_values() -> None:
    # Worked example: p = (0.01, 0.04, 0.03) -> (0.03, 0.06, 0.06)
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_static_filter_intersection_uses_the_same_pairs_for_both_arms() -> None:
    """Under scoring/static_filter: intersection, a flagged metric is analysed only on
    pairs whose control and treatment videos are both static; other metrics on all."""
    gen, scores, timings = records(effect=0.1, prompts=6, seeds=1)
    for i, r in enumerate(scores):
        prompt = int(r["candidate"]["prompt_id"][1:])
        # prompts 0-2 static in both arms; prompt 3 static only in control; 4-5 moving
        static = prompt < 3 or (prompt == 3 and r["arm"]["name"] == "control")
        r["scores"]["q"]["static"] = static
    res = analyse(gen, scores, timings, ["treat"], S)
    assert metric(res, "q")["n_pairs"] == 3 and metric(res, "psnr")["n_pairs"] == 6
    assert any("3 of 6 pairs where both videos are static" in n for n in res["comparisons"][0]["notes"])
    scores[0]["scores"]["q"].pop("static")
    with pytest.raises(PairingError, match="static flag for some videos only"):
        analyse(gen, scores, timings, ["treat"], S)


def test_timed_run_with_other_frames_drops_that_pairs_latency() -> None:
    """A timing record whose run computed other frames than the bulk run (matches_bulk_frames
    false) is an error for that pair: its latency is dropped and the note says how many."""
    gen, scores, timings = records(ratio=2.0)
    slow = next(t for t in timings if t["arm"]["name"] == "treat")
    slow["matches_bulk_frames"] = False
    slow["timing"]["latency_s"] = 1000.0  # would wreck the speedup if it were used
    comp = analyse(gen, scores, timings, ["treat"], S)["comparisons"][0]
    assert comp["latency"]["dropped_frames_differ"] == 1 and comp["latency"]["n_pairs"] == 23
    assert math.isclose(comp["speedup"]["geomean"], 2.0, rel_tol=1e-9)
    assert "latency: 1 of 24 pair(s) dropped because the timed run's frames differ from the bulk run's" in " ".join(
        comp["notes"])
    for t in timings:
        t["matches_bulk_frames"] = False
    with pytest.raises(PairingError, match="no pair has a timed run that computed the bulk run's frames"):
        analyse(gen, scores, timings, ["treat"], S)
