"""Known-answer checks for the paired statistics, on synthetic records."""

from __future__ import annotations

import copy
import math
import random
import re
from collections.abc import Callable

import numpy as np
import pytest
from conftest import generation_record, metric_spec, score_record, timing_record

from pairflow.analysis.stats import analyse, holm
from pairflow.errors import PairingError, StatsError
from pairflow.plan.config import StatsSpec

S = StatsSpec(resamples=2000, level=0.95, seed=0)
NR = metric_spec("q")
FR = metric_spec("psnr", "FR")


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
            control: dict = {}
            for arm in ("control", "treat"):
                video = f"v{p}{s}" + ("" if arm == "control" or same_video else "t")
                g = generation_record("p", f"p{p:02d}", s, arm, 1000 * p + s, video)
                control = control or g
                gen.append(g)
                timings.append(timing_record(g, lat if arm == "control" else lat / ratio))
                q = base + (noise_c if arm == "control" else noise_t + effect)
                sc = {"q": (q, NR)}
                if arm == "treat":
                    sc["psnr"] = (30.0 + rng.gauss(0, 1), FR)
                scores.append(score_record(g, control, sc))
    return gen, scores, timings


def metric(result: dict, name: str) -> dict:
    return next(m for m in result["comparisons"][0]["metrics"] if m["metric"] == name)


def test_known_offset_is_recovered_with_sign_and_interval() -> None:
    gen, scores, timings = records(effect=0.1)
    m = metric(analyse(gen, scores, timings, ["treat"], S), "q")
    assert m["diff"] > 0
    assert m["ci"][0] <= 0.1 <= m["ci"][1]
    assert m["ci"][0] > 0  # the interval excludes zero
    assert m["p_adjusted"] < 0.01 and m["verdict"] == "superior"
    assert m["wins"] >= 11 and m["wins"] + m["ties"] + m["losses"] == 12  # counted over prompts


def test_negative_effect_has_negative_sign() -> None:
    gen, scores, timings = records(effect=-0.1)
    m = metric(analyse(gen, scores, timings, ["treat"], S), "q")
    assert m["ci"][1] < 0 and m["diff"] < 0


def test_no_effect_is_not_significant() -> None:
    gen, scores, timings = records(effect=0.0)
    m = metric(analyse(gen, scores, timings, ["treat"], S), "q")
    assert m["ci"][0] < 0 < m["ci"][1]
    assert m["p_adjusted"] > 0.05
    assert m["verdict"] == "inconclusive" and "this is not equivalence" in m["verdict_detail"]
    assert "smallest detectable difference is" in m["verdict_detail"]


def test_known_latency_ratio_is_recovered_as_speedup() -> None:
    gen, scores, timings = records(ratio=2.0)
    for i, t in enumerate(timings):  # a little noise on the treatment's latency, so the ratio has spread
        if t["arm"]["name"] == "treat":
            t["timing"]["latency_s"] *= 1 + 0.01 * ((i % 5) - 2)
    sp = analyse(gen, scores, timings, ["treat"], S)["comparisons"][0]["speedup"]
    assert math.isclose(sp["geomean"], 2.0, rel_tol=0.01)
    assert sp["ci"][0] <= 2.0 <= sp["ci"][1] and sp["ci_note"] is None


def test_a_ratio_with_zero_spread_gets_no_interval_and_says_why() -> None:
    """Regression (issue 39): the speedup and compute ratio took a zero-width interval when
    every prompt's ratio was equal (a timer ticking in 10 ms steps); the scores' zero-spread
    rule applies to them too: no interval, and the reason in the notes."""
    from pairflow.report.table import markdown, table

    gen, scores, timings = records(ratio=2.0, prompts=5)
    for t in timings:  # on 10 ms ticks: control 0.50 s, treatment 0.25 s on every prompt
        t["timing"]["latency_s"] = 0.5 if t["arm"]["name"] == "control" else 0.25
    res = analyse(with_compute(gen, 0.25, ["overrides"]), scores, timings, ["treat"], S)
    sp, cp = res["comparisons"][0]["speedup"], res["comparisons"][0]["compute"]
    assert sp["geomean"] == pytest.approx(2.0) and sp["ci"] == [None, None] and "zero spread" in sp["ci_note"]
    assert cp["ci"] == [None, None] and cp["ci_note"].startswith("compute ratio: no interval")
    head, rows = table(res)
    assert rows[0][3] == "2.000× [no CI: zero spread]" and rows[0][4].startswith("0.250× [no CI: zero spread]")
    assert "speedup: no interval: every prompt's ratio is 2" in markdown(res, "t", {})


def test_bitwise_identical_arm_is_flagged_no_effect() -> None:
    gen, scores, timings = records(same_video=True)
    from pairflow.report.table import table

    res = analyse(gen, scores, timings, ["treat"], S)
    assert "this arm changed nothing: every video is bit-identical to control's" in res["comparisons"][0]["flags"]
    psnr = metric(analyse(gen, scores, timings, ["treat"], StatsSpec(2000, 0.95, 0, floors={"psnr": 30.0})), "psnr")
    assert psnr["verdict"] is None and "bit-identical" in psnr["verdict_detail"] and psnr["n_identical_pairs"] == 24 and psnr["treatment_mean"] is None
    assert table(res)[1][0][0] == "treat (this arm changed nothing)"
    assert table(analyse(*records(effect=0.1), ["treat"], S))[1][0][0] == "treat"


def test_missing_partner_is_an_error_unless_policy_says_drop() -> None:
    gen, scores, timings = records(effect=0.1)
    gen = [g for g in gen if not (g["arm"]["name"] == "treat" and g["candidate"]["prompt_id"] == "p03"
                                  and g["candidate"]["seed"] == 1)]
    with pytest.raises(PairingError, match="1 pair.*lack a partner.*p/p03 seed 1.*drop-pair"):
        analyse(gen, scores, timings, ["treat"], S)
    r = analyse(gen, scores, timings, ["treat"], StatsSpec(2000, 0.95, 0, "drop-pair"))
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
    for r in scores:
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


# --- issue 15: intervals and tests that hold at the prompt counts people run ---------


def simulate(n_prompts: int, reps: int, effect: float, rng: np.random.Generator, seeds: int = 2,
             noise: float = 0.1, spread: float = 0.05) -> np.ndarray:
    """Per-prompt paired differences of ``reps`` synthetic studies (reps, n_prompts): each
    prompt's true effect is ``effect`` plus N(0, spread) (prompts are sampled), each arm
    of each (prompt, seed) pair has N(0, noise) measurement noise, and seeds are averaged."""
    prompt_effect = effect + rng.normal(0, spread, (reps, n_prompts))
    pair_noise = rng.normal(0, noise, (reps, n_prompts, seeds, 2))
    return prompt_effect + (pair_noise[..., 1] - pair_noise[..., 0]).mean(axis=-1)


def test_zero_spread_never_gives_p_zero_or_a_zero_width_interval() -> None:
    """Regression (issue 23): two prompts both +0.01 gave [0.01, 0.01], p = 0, "treatment
    better"; a 0/1 metric at 3 prompts all 0 -> 1 gave [1, 1], p = 0."""
    from pairflow.analysis.inference import Cell, signflip_signs

    two = Cell(np.array([0.01, 0.01]), signflip_signs(2, 2000, 0))
    assert two.p(0.0) is None and two.p_signflip(0.0) == 0.5 and two.interval(0.95)[:2] == (None, None)
    assert "zero spread" in str(two.interval(0.95)[2])
    flat7 = Cell(np.zeros(7), signflip_signs(7, 2000, 0))
    assert flat7.interval(0.95)[:2] == (None, None) and flat7.p(0.0) is None  # no test of the mean at zero spread
    gen, scores, timings = records(prompts=3, seeds=1, noise=0.0)
    for r in scores:  # a 0/1 metric (as VBench's dynamic_degree): control 0, treatment 1 on every prompt
        r["scores"]["dyn"] = {"value": float(r["arm"]["name"] == "treat"), "spec": NR, "decoded_with": "bt709"}
    m = metric(analyse(gen, scores, timings, ["treat"], S), "dyn")
    # the exact paired-proportions test decides a 0/1 metric: 3 of 3 gains, p = 2 / 2^3, as the sign-flip test
    assert m["p_value"] == pytest.approx(0.25) and m["p_signflip"] == 0.25 and "paired proportions" in m["test"]
    assert m["verdict"] == "inconclusive" and m["ci"][0] < 0 < m["ci"][1]
    assert (m["wins"], m["ties"], m["losses"]) == (3, 0, 0)
    s = StatsSpec(2000, 0.95, 0, margins={"q": 0.5, "dyn": 0.5})  # zero spread never proves equivalence
    flat = records(prompts=8, seeds=1, noise=0.0)
    for r in flat[1]:
        r["scores"]["q"]["value"] = 0.3
        r["scores"]["dyn"] = {"value": 1.0, "spec": NR, "decoded_with": "bt709"}
    res = analyse(*flat, ["treat"], s)
    m = metric(res, "q")
    assert m["verdict"] == "inconclusive" and "zero spread" in m["verdict_detail"] and m["ties"] == 8
    assert m["p_value"] is None and m["p_verdict"] is None and res["family_size"] == 1  # untested, not in the family
    # ... except for a 0/1 metric, whose exact test needs no spread: 8 ties of 8 exclude a loss of 0.5 (p <= 2 / 2^8)
    m = metric(res, "dyn")
    assert m["verdict"] == "equivalent" and m["p_verdict"] < 0.05 and -0.5 < m["ci"][0] < 0 < m["ci"][1] < 0.5


def test_small_prompt_count_gives_an_unbounded_interval_and_says_why() -> None:
    from pairflow.report.table import table

    gen, scores, timings = records(effect=0.3, prompts=4, seeds=2, noise=0.02)
    res = analyse(gen, scores, timings, ["treat"], S)
    m = metric(res, "q")
    assert m["signflip_min_p"] == 0.125 and m["p_value"] >= 0.125  # exact: 2 / 2^4
    assert m["ci"] == [None, None] and "can reach p < 0.05" in m["ci_note"]
    assert m["verdict"] == "inconclusive"
    assert any("n=4 prompts" in n and "smallest attainable p = 0.125" in n for n in res["comparisons"][0]["notes"])
    head, rows = table(res)
    assert "n=4: smallest attainable sign-flip p = 0.125" in rows[0][head.index("q: treatment − control [CI], higher is better")]
    big = analyse(*records(effect=0.3, prompts=8), ["treat"], S)
    assert not any("smallest attainable" in n for n in big["comparisons"][0]["notes"])
    assert metric(big, "q")["verdict"] == "superior" and metric(big, "q")["ci"][0] > 0


def test_one_prompt_has_no_interval_and_says_so() -> None:
    from pairflow.report.table import markdown

    res = analyse(*records(effect=0.1, prompts=1), ["treat"], S)
    m = metric(res, "q")
    assert m["ci"] == [None, None] and m["p_value"] is None and m["verdict"] == "inconclusive" and "fewer than 2 prompts" in m["verdict_detail"]
    assert res["comparisons"][0]["speedup"]["ci"] == [None, None]
    assert "n=1 prompt (psnr, q): no interval and no test" in markdown(res, "t", {})
    # no SD from one prompt, so no planning from it (a mutant of "n > 1" survived: issue 39 item 5)
    assert m["sd_prompt"] is None and m["planning"]["sd_prompt"] is None and m["planning"]["sd_upper"] is None


def test_holm_is_applied_and_changes_the_answer() -> None:
    """Regression (issue 15): Holm computed but not applied. Four metrics whose raw
    p-values are all below 0.05 except one; after Holm one of them is not significant."""
    from scipy.stats import ttest_1samp

    from pairflow.report.table import table

    diffs = {"a": [0.30, 0.32, 0.29, 0.31, 0.30, 0.33], "b": [0.05, 0.11, -0.01, 0.09, 0.07, 0.02],
             "c": [0.02, 0.09, 0.01, 0.08, 0.06, 0.03], "d": [0.1, -0.1, 0.05, -0.02, 0.0, 0.01]}
    gen, scores, timings = records(prompts=6, seeds=1, noise=0.01)  # q with spread, so tested
    for r in scores:
        if r["arm"]["name"] == "treat":
            i = int(r["candidate"]["prompt_id"][1:])
            r["scores"].update({k: {"value": 1.0 + v[i], "spec": NR, "decoded_with": "bt709"} for k, v in diffs.items()})
        else:
            r["scores"].update({k: {"value": 1.0, "spec": NR, "decoded_with": "bt709"} for k in diffs})
    res = analyse(gen, scores, timings, ["treat"], S)
    ms = {m["metric"]: m for m in res["comparisons"][0]["metrics"] if m["metric"] in diffs}
    raw = {k: ttest_1samp(v, 0.0).pvalue for k, v in diffs.items()}
    tested = [m for m in res["comparisons"][0]["metrics"] if m["p_value"] is not None]  # q (no effect) too
    expected = dict(zip([m["metric"] for m in tested], holm([m["p_value"] for m in tested]), strict=True))
    for k in diffs:
        assert ms[k]["p_value"] >= raw[k] - 1e-12  # the union test is never bolder than its t test
        assert ms[k]["p_adjusted"] == pytest.approx(expected[k], rel=1e-12)
    assert ms["c"]["p_value"] < 0.05 <= ms["c"]["p_adjusted"]  # Holm changes the answer
    assert ms["c"]["verdict"] == "inconclusive"  # and the verdict with it
    assert ms["c"]["ci"][0] is None or ms["c"]["ci"][0] < 0  # unbounded: at 6 prompts and 0.05 / 5 no test can reject
    head, rows = table(res)
    assert f"p {ms['c']['p_adjusted']:.2g}: difference from 0, Holm over the table's 5 tests" in rows[0][head.index("c: treatment − control [CI], higher is better")]


def test_lower_is_better_metric_wins_when_the_treatment_lowers_it() -> None:
    """Regression (issue 15): win rate inverted for lower-is-better metrics."""
    from pairflow.report.plots import forest_title
    from pairflow.report.table import table

    gen, scores, timings = records(effect=-0.1)
    for r in scores:
        r["scores"]["q"]["spec"] = {"kind": "NR", "higher_is_better": False}
    res = analyse(gen, scores, timings, ["treat"], S)
    m = metric(res, "q")
    assert m["diff"] < 0 and m["ci"][1] < 0
    assert m["wins"] >= 11 and m["verdict"] == "superior"
    head, _rows = table(res)
    assert "q: treatment − control [CI], lower is better" in head
    assert "better to the left of 0" in forest_title(res, "q")
    worse = metric(analyse(*records(effect=0.1), ["treat"], S), "q")
    assert worse["verdict"] == "superior"  # higher is better there
    for r in scores:
        r["scores"]["q"]["value"] *= -1  # now the treatment raises a lower-is-better metric
    m = metric(analyse(gen, scores, timings, ["treat"], S), "q")
    assert m["losses"] >= 11 and m["verdict"] == "inferior"


def test_latency_columns_divide_to_the_speedup() -> None:
    """Regression (issue 15): medians beside a geometric-mean speedup did not divide to it."""
    gen, scores, timings = records(prompts=7)
    rng = random.Random(9)
    for r in timings:
        if r["arm"]["name"] == "treat":
            r["timing"]["latency_s"] *= rng.uniform(0.4, 1.1)
    c = analyse(gen, scores, timings, ["treat"], S)["comparisons"][0]
    lat = c["latency"]
    assert lat["control_geomean_s"] / lat["treatment_geomean_s"] == pytest.approx(c["speedup"]["geomean"], rel=1e-12)
    assert lat["control_median_s"] / lat["treatment_median_s"] != pytest.approx(c["speedup"]["geomean"], rel=1e-3)


def test_required_prompts_matches_the_textbook_value() -> None:
    """Paired t-test, two-sided alpha 0.05, power 0.8, effect 0.5 sd: 34 pairs (Cohen;
    G*Power gives 34). The detectable effect at n inverts it."""
    from pairflow.analysis.inference import detectable_effect, required_prompts

    assert required_prompts(1.0, 0.5, 0.95, 0.8) == 34
    assert required_prompts(0.2, -0.1, 0.95, 0.8) == 34  # sign does not matter; scale does not either
    d = detectable_effect(1.0, 34, 0.95, 0.8)
    assert d <= 0.5 < detectable_effect(1.0, 33, 0.95, 0.8)
    with pytest.raises(StatsError, match="effect of 0"):
        required_prompts(1.0, 0.0, 0.95, 0.8)


def test_sample_size_section_from_a_pilot() -> None:
    """Issue 39: prompts needed come from simulating the union test on this pilot's values
    (with its SD's uncertainty), so not fewer than the t-test's N (the union rejects only
    when its t test does; Monte Carlo error aside), and the same answer every time."""
    from pairflow.analysis.inference import required_prompts
    from pairflow.report.table import markdown

    gen, scores, timings = records(effect=0.02, prompts=4)
    s = StatsSpec(2000, 0.95, 0, margins={"q": 0.01})
    res = analyse(gen, scores, timings, ["treat"], s)
    pl = metric(res, "q")["planning"]
    assert pl["sd_prompt"] == pytest.approx(metric(res, "q")["sd_prompt"])
    assert pl["prompts_needed"] >= required_prompts(pl["sd_prompt"], 0.01, 0.95, 0.8) > 4  # a family of one
    # at its upper bound the SD is fixed; the simulation's Monte Carlo error (0.009 at power 0.8) allows a few %
    assert pl["prompts_needed_upper"] >= 0.95 * required_prompts(pl["sd_upper"], 0.01, 0.95, 0.8)
    assert metric(analyse(gen, scores, timings, ["treat"], s), "q")["planning"] == pl  # seeded: deterministic
    assert pl["detectable_effect"] > 0
    md = markdown(res, "t", {})
    assert "## Sample size from this study as a pilot" in md
    assert f"| {pl['prompts_needed']} / {pl['prompts_needed_upper']} |" in md
    assert metric(res, "psnr")["planning"] is None  # FR values are not differences from control


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


def with_compute(gen: list[dict], ratio: float, kinds: list[str], skipped: int = 0,
                 shape: list[int] | None = None) -> list[dict]:
    """Give synthetic generation records compute counts: control 1e9 FLOPs and 8 computed
    blocks per video; the treatment ``ratio`` of that, ``skipped`` blocks skipped."""
    out = copy.deepcopy(gen)
    for r in out:
        treat = r["arm"]["name"] != "control"
        r["arm"]["kinds"] = kinds if treat else []
        r["video"]["raw_digest"] = r["video"]["digest"]
        r["compute"] = {"work_flops": int(1e9 * (ratio if treat else 1.0)), "blocks_computed": 8 - (skipped if treat else 0),
                        "blocks_skipped": skipped if treat else 0, "attention_computed": 8, "attention_skipped": 0,
                        "generations": 1, "latent_shape": (shape if treat and shape else [16, 3, 8, 8]),
                        "counter": "torch.utils.flop_counter.FlopCounterMode"}
    return out


def test_compute_ratio_is_paired_over_prompts_and_shown_beside_the_speedup(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pairflow.report.plots import pareto as pareto_plot
    from pairflow.report.table import markdown, pareto, table

    gen, scores, timings = records(effect=0.1, ratio=1.5)
    res = analyse(with_compute(gen, 0.25, ["overrides"]), scores, timings, ["treat"], S)
    c = res["comparisons"][0]["compute"]
    assert c["ratio"] == pytest.approx(0.25) and c["ci"] == [None, None] and "zero spread" in c["ci_note"]
    head, rows = table(res)
    assert head[3:5] == ["speedup [CI], higher is faster", "compute ratio [CI], lower is cheaper"]
    assert rows[0][4] == "0.250× [no CI: zero spread]; skipped 0/192 blocks"
    q_head, q_rows = pareto(res)
    # cheaper and better than control on q; psnr (FR) has no control point and no other arm
    assert q_rows[0][1] == "overrides" and q_rows[0][-1] == "psnr, q"
    import re

    for h, v in zip(q_head[4:-1], q_rows[0][4:-1], strict=True):  # metric columns: header says which way is better
        assert h.endswith(("higher is better", "lower is better")), h
        decimals = {len(x.split(".")[1]) for x in re.findall(r"-?\d+\.\d+", v)}
        assert len(decimals) == 1 and re.fullmatch(r"-?\d+\.\d+ \[-?\d+\.\d+, -?\d+\.\d+\]", v), v
    assert "## Quality against cost" in markdown(res, "t", {})
    pareto_plot(res, tmp_path / "pareto.png")
    assert (tmp_path / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # records without compute counts (older evidence) give n/a, not an error
    assert table(analyse(gen, scores, timings, ["treat"], S))[1][0][4] == "n/a"


def test_a_cache_arm_that_skipped_nothing_is_flagged_even_when_its_pixels_differ() -> None:
    from pairflow.report.table import table

    gen, scores, timings = records(effect=0.1)
    res = analyse(with_compute(gen, 1.0, ["cache"]), scores, timings, ["treat"], S)
    flags = res["comparisons"][0]["flags"]
    assert len(flags) == 1 and flags[0].startswith("this arm changed nothing: its cache skipped no transformer block")
    assert table(res)[1][0][0] == "treat (this arm changed nothing)"
    skipping = analyse(with_compute(gen, 0.6, ["cache"], skipped=3), scores, timings, ["treat"], S)
    assert skipping["comparisons"][0]["flags"] == []
    # a few-step arm skips no block by design: not flagged
    assert analyse(with_compute(gen, 0.5, ["overrides"]), scores, timings, ["treat"], S)["comparisons"][0]["flags"] == []


def test_a_pair_whose_arms_started_from_other_latents_is_refused() -> None:
    gen, scores, timings = records()
    with pytest.raises(PairingError, match="did not share its initial noise"):
        analyse(with_compute(gen, 1.0, ["model"], shape=[16, 3, 4, 4]), scores, timings, ["treat"], S)


# --- issue 23: verdicts against margins and floors, one family per study ---------------


def with_metric(name: str, diffs: dict[str, list[float]], higher_is_better: bool = True,
                base: float = 1.0) -> tuple[list[dict], list[dict], list[dict]]:
    """Records of arms named in ``diffs`` (one seed per prompt) whose metric ``name`` is
    control ``base`` and treatment ``base + diffs[arm][prompt]``."""
    spec = metric_spec(name, higher_is_better=higher_is_better)
    n = len(next(iter(diffs.values())))
    gen, scores, timings = [], [], []
    for p in range(n):
        control = generation_record("p", f"p{p:02d}", 0, "control", 1000 * p, f"v{p}")
        gen.append(control)
        timings.append(timing_record(control, 1.0))
        scores.append(score_record(control, control, {name: (base, spec)}))
        for i, (arm, d) in enumerate(sorted(diffs.items())):
            g = generation_record("p", f"p{p:02d}", 0, arm, 1000 * p, f"v{p}{arm}")
            gen.append(g)
            timings.append(timing_record(g, 0.5 + 0.01 * i))
            scores.append(score_record(g, control, {name: (base + d[p], spec)}))
    return gen, scores, timings


DIFFS = [0.265, 0.475, 0.075, 0.365, -0.125, 0.585, 0.175, 0.315, -0.195, 0.225]
"""A noisy improvement of 0.216 at 10 prompts: raw p 0.036 (between 0.025 and 0.05), interval
half-width about 0.19."""


@pytest.mark.parametrize("shift, margin, word", [
    (0.0, 1.0, "equivalent"),        # both bounds inside +-1
    (0.3, 0.2, "superior"),          # better, and the loss bound inside the margin
    (0.1, 0.25, "non-inferior"),     # any loss inside 0.25, but neither a gain nor a gain beyond it shown
    (-1.5, 0.3, "inferior"),         # the whole interval below -0.3
    (-0.3, 0.3, "worse, non-inferiority not shown"),  # worse than control, a loss beyond 0.3 not excluded
    (-0.1, 0.2, "inconclusive"),     # the interval straddles both -0.2 and 0
])
def test_margin_verdicts(shift: float, margin: float, word: str) -> None:
    d = [x - 0.216 + shift for x in DIFFS]
    res = analyse(*with_metric("q", {"treat": d}), ["treat"], StatsSpec(2000, 0.95, 0, margins={"q": margin}))
    m = metric(res, "q")
    assert m["verdict"] == word, (m["ci"], m["verdict_detail"])
    assert m["hypothesis"] == f"loss = margin {margin:g} (non-inferiority)"
    assert (m["p_adjusted"] < 0.05) == (m["ci"][0] > -margin or m["ci"][1] < -margin)  # interval and p agree
    assert (m["p_verdict"] < 0.05) == (word != "inconclusive")  # and the p printed beside the word
    if word == "inconclusive":
        assert re.search(r"about \d+ prompts would decide it", m["verdict_detail"])


def test_margin_is_a_loss_in_the_metrics_direction() -> None:
    """A lower-is-better metric that the treatment raises by about 0.4 is inferior at a
    margin of 0.05 and its wins are the prompts where it fell."""
    res = analyse(*with_metric("q", {"treat": [x + 0.2 for x in DIFFS]}, higher_is_better=False), ["treat"],
                  StatsSpec(2000, 0.95, 0, margins={"q": 0.05}))
    m = metric(res, "q")
    assert m["verdict"] == "inferior" and (m["wins"], m["losses"]) == (0, 10)
    assert m["relative_effect"] == pytest.approx(m["diff"] / 1.0) and m["standardised_effect"] == pytest.approx(
        m["diff"] / m["sd_prompt"])


def test_holm_across_arms_flips_a_verdict_and_bh_is_an_option() -> None:
    """Regression (issue 23): multiplicity was controlled only within one arm's metrics.
    Alone, arm a is better; beside a second arm with the same evidence, Holm across the
    study's family makes neither significant, and the verdict follows the adjusted p."""
    from pairflow.analysis.stats import compare, index
    from pairflow.report.table import markdown

    one = analyse(*with_metric("q", {"a": DIFFS}), ["a"], S)
    assert metric(one, "q")["verdict"] == "superior" and one["family_size"] == 1
    gen, scores, timings = with_metric("q", {"a": DIFFS, "b": DIFFS[::-1]})
    two = analyse(gen, scores, timings, ["a", "b"], S)
    assert two["family_size"] == 2 and two["multiplicity"] == "holm"
    for c in two["comparisons"]:
        m = c["metrics"][0]
        assert m["p_value"] < 0.05 <= m["p_adjusted"] and m["verdict"] == "inconclusive"
        assert m["ci"][0] < 0 < m["ci"][1] and m["ci_level"] > 0.95  # the interval at the adjusted level
    # compare() alone is a family of its arm only
    alone = compare(index(gen), index(scores), index(timings), "a", S)
    assert alone["metrics"][0]["verdict"] == "superior"
    bh = analyse(gen, scores, timings, ["a", "b"], StatsSpec(2000, 0.95, 0, multiplicity="bh"))
    m = bh["comparisons"][0]["metrics"][0]
    assert m["p_adjusted"] == pytest.approx(max(c["metrics"][0]["p_value"] for c in bh["comparisons"]))
    assert m["verdict"] == "superior"  # BH at equal p-values rejects both
    assert "Benjamini-Hochberg" in markdown(bh, "t", {})


def test_a_skewed_metric_is_flagged() -> None:
    from pairflow.report.table import markdown

    d = [0.01, 0.02, 0.0, 0.015, 0.005, 0.01, 0.025, -0.005, 0.012, 0.9]  # one prompt moves a lot
    res = analyse(*with_metric("q", {"treat": d}), ["treat"], S)
    m = metric(res, "q")
    assert m["skewness"] > 2 and any(f.startswith("skewness 3.") for f in m["diagnostics"])
    assert "beyond the +-2 the procedure was checked for" in markdown(res, "t", {})
    calm = metric(analyse(*with_metric("q", {"treat": DIFFS}), ["treat"], S), "q")
    assert calm["diagnostics"] == [] and abs(calm["skewness"]) < 1


def test_fidelity_floor_counts_identical_pairs_apart() -> None:
    """Regression (issue 23): PSNR means mixed 80 dB (identical) pairs with ~13 dB ones.
    Identical pairs are counted and left out; the floor verdict is on the others."""
    gen, scores, timings = records(prompts=8, seeds=2)
    psnr = {}
    for r in scores:
        c = r["candidate"]
        if r["arm"]["name"] == "treat":
            same = c["seed"] == 0 and int(c["prompt_id"][1:]) < 3  # 3 pairs bit-identical to control
            psnr[(c["prompt_id"], c["seed"])] = 80.0 if same else 14.0 + int(c["prompt_id"][1:]) % 3
            r["scores"]["psnr"]["value"] = psnr[(c["prompt_id"], c["seed"])]
    for g in gen:
        c = g["candidate"]
        if g["arm"]["name"] == "treat" and psnr[(c["prompt_id"], c["seed"])] == 80.0:
            g["video"]["raw_digest"] = next(x["video"]["raw_digest"] for x in gen if x["arm"]["name"] == "control"
                                            and x["candidate"]["prompt_id"] == c["prompt_id"]
                                            and x["candidate"]["seed"] == c["seed"])
    res = analyse(gen, scores, timings, ["treat"], StatsSpec(2000, 0.95, 0, floors={"psnr": 30.0}))
    m = metric(res, "psnr")
    assert m["n_identical_pairs"] == 3 and m["n_pairs"] == 16 and m["n_prompts"] == 8
    assert 14.0 <= m["treatment_mean"] <= 16.0  # no 80 dB pair averaged in
    assert m["verdict"] == "inferior" and m["hypothesis"] == "mean value = floor 30"
    free = metric(analyse(gen, scores, timings, ["treat"], S), "psnr")
    assert free["verdict"] is None and free["p_value"] is None
    with pytest.raises(StatsError, match="psnr, a fidelity metric.*stats/floors"):
        analyse(gen, scores, timings, ["treat"], StatsSpec(2000, 0.95, 0, margins={"psnr": 1.0}))


def test_variance_split_says_add_prompts_or_add_seeds() -> None:
    """Prompt-level spread dominates: more seeds cannot help. Seed noise dominates: more seeds do."""
    prompts = analyse(*records(effect=0.1, prompts=10, seeds=3, noise=0.001), ["treat"],
                      StatsSpec(2000, 0.95, 0, margins={"q": 0.05}))
    seeds = analyse(*records(effect=0.1, prompts=10, seeds=3, noise=0.3), ["treat"],
                    StatsSpec(2000, 0.95, 0, margins={"q": 0.05}))
    # records() gives every prompt the same true effect: the prompt share comes only from noise
    assert metric(seeds, "q")["planning"]["advice"].startswith("add seeds")
    gen, scores, timings = records(effect=0.1, prompts=10, seeds=3, noise=0.001)
    rng = random.Random(4)
    shift = {f"p{p:02d}": rng.gauss(0, 0.2) for p in range(10)}
    for r in scores:
        if r["arm"]["name"] == "treat":
            r["scores"]["q"]["value"] += shift[r["candidate"]["prompt_id"]]
    prompts = analyse(gen, scores, timings, ["treat"], StatsSpec(2000, 0.95, 0, margins={"q": 0.05}))
    pl = metric(prompts, "q")["planning"]
    assert pl["advice"].startswith("add prompts") and pl["var_prompt"] > 100 * pl["var_seed"]
    assert pl["seeds_per_prompt"] == 3


CLAIMS = {"superior", "non-inferior", "equivalent", "worse, non-inferiority not shown", "inferior"}


def test_the_p_beside_a_verdict_always_agrees_with_it() -> None:
    """Across random studies, arms and questions (margin, floor, none) in one Holm family:
    the printed p is below 0.05 exactly when the verdict claims something."""
    rng = np.random.default_rng(11)
    for trial in range(12):
        n = int(rng.integers(6, 14))
        diffs = {f"arm{i}": list(rng.normal(rng.normal(0, 0.2), rng.uniform(0.05, 0.4), n)) for i in range(3)}
        gen, scores, timings = with_metric("q", diffs)
        margins = {"q": float(rng.uniform(0.05, 0.4))} if trial % 2 else {}
        res = analyse(gen, scores, timings, sorted(diffs), StatsSpec(2000, 0.95, 0, margins=margins))
        for c in res["comparisons"]:
            m = c["metrics"][0]
            assert (m["p_verdict"] < 0.05) == (m["verdict"] in CLAIMS), (m["verdict"], m["p_verdict"], m["ci"])


def test_a_lower_is_better_fidelity_floor_is_a_ceiling() -> None:
    """LPIPS against control is lower-is-better: a floor of 0.3 is a maximum it must stay under."""
    gen, scores, timings = records(prompts=8, seeds=1)
    rng = random.Random(2)
    lpips = metric_spec("lpips", "FR", higher_is_better=False)
    for r in scores:
        if r["arm"]["name"] == "treat":
            r["scores"]["lpips"] = {"value": 0.1 + rng.uniform(0, 0.05), "spec": lpips, "decoded_with": "bt709"}
    m = metric(analyse(gen, scores, timings, ["treat"], StatsSpec(2000, 0.95, 0, floors={"lpips": 0.3})), "lpips")
    assert m["verdict"] == "non-inferior" and m["ci"][1] < 0.3
    m = metric(analyse(gen, scores, timings, ["treat"], StatsSpec(2000, 0.95, 0, floors={"lpips": 0.05})), "lpips")
    assert m["verdict"] == "inferior" and m["ci"][0] > 0.05


def test_statistics_fit_their_schema_and_their_types() -> None:
    """stats.json is validated on write against workflow/schemas/stats.schema.yaml; the
    TypedDicts mypy checks name the same fields, and every scenario above fits."""
    import typing

    from pairflow.records.store import check_schema, load_schema
    from pairflow.records.types import ArmEfficiency, Comparison, MetricResult, Planning, StudyStats

    schema = load_schema("stats")
    comparison = schema["properties"]["comparisons"]["items"]
    metric_s = comparison["properties"]["metrics"]["items"]
    planning_s = metric_s["properties"]["planning"]["oneOf"][1]
    arm_eff = comparison["properties"]["efficiency"]["properties"]["treatment"]
    for td, sch in ((StudyStats, schema), (Comparison, comparison), (MetricResult, metric_s), (Planning, planning_s),
                    (ArmEfficiency, arm_eff)):
        assert set(sch["properties"]) == set(typing.get_type_hints(td)), td.__name__
    spec = StatsSpec(2000, 0.95, 0, margins={"q": 0.05}, floors={"psnr": 30.0})
    for res in (analyse(*records(effect=0.1, prompts=7), ["treat"], spec),
                analyse(*records(effect=0.1, prompts=1), ["treat"], spec),
                analyse(*records(prompts=3, same_video=True), ["treat"], S),
                analyse(*with_metric("q", {"a": DIFFS, "b": DIFFS}), ["a", "b"], StatsSpec(2000, 0.95, 0,
                                                                                      multiplicity="bh"))):
        check_schema({**res, "provenance": {}}, "stats.json", "write", name="stats")
    bad = analyse(*records(prompts=7), ["treat"], S)
    bad["comparisons"][0]["metrics"][0]["verdict"] = "treatment better"  # the old wording
    from pairflow.errors import RecordSchemaError

    with pytest.raises(RecordSchemaError, match="verdict"):
        check_schema(bad, "stats.json", "write", name="stats")


def gpu_records(gpu: str | None) -> tuple[list[dict], list[dict], list[dict]]:
    """``records`` with counted FLOPs (control 4e12 per call, treatment 1e12 plus a 1e11
    verifier) timed on ``gpu`` (None: on the CPU), treatment peak 4096 MiB, control 2048."""
    gen, scores, timings = records(effect=0.1, ratio=2.0, prompts=5)
    for r in gen:
        treat = r["arm"]["name"] != "control"
        r["compute"] = {"work_flops": 1e12 if treat else 4e12, "total_flops": 1e12 if treat else 4e12,
                        "verifier_flops": 1e11 if treat else 0, "transformer_flops": 1e12,
                        "blocks_computed": 8, "blocks_skipped": 0, "attention_computed": 8, "attention_skipped": 0,
                        "generations": 1, "latent_shape": [16, 3, 8, 8], "counter": "FlopCounterMode"}
    by_id = {(r["candidate"]["candidate_id"], r["arm"]["name"]): r for r in gen}
    timings = [timing_record(by_id[(t["candidate"]["candidate_id"], t["arm"]["name"])], t["timing"]["latency_s"],
                             gpu=gpu, peak_mb=4096.0 if t["arm"]["name"] == "treat" else 2048.0)
               for t in timings]
    return gen, scores, timings


def test_estimated_mfu_and_peak_memory_per_arm_on_a_known_gpu() -> None:
    from pairflow.records.store import check_schema
    from pairflow.report.table import answer, markdown, table

    gen, scores, timings = gpu_records("NVIDIA H100 80GB HBM3")
    res = analyse(gen, scores, timings, ["treat"], S)
    e = res["comparisons"][0]["efficiency"]
    lat = {(t["candidate"]["candidate_id"], t["arm"]["name"]): t["timing"]["latency_s"] for t in timings}
    want = {a: float(np.median([f / s / 989e12 for (_c, arm), s in lat.items() if arm == a]))
            for a, f in (("control", 4e12), ("treat", 1.1e12))}
    assert e["control"]["mfu_median"] == pytest.approx(want["control"], rel=1e-12)
    assert e["treatment"]["mfu_median"] == pytest.approx(want["treat"], rel=1e-12)
    assert e["treatment"]["peak_memory_gib"] == 4.0 and e["control"]["peak_memory_gib"] == 2.0
    assert e["treatment"]["gpu"] == "H100 SXM" and e["treatment"]["peak_tflops"] == 989.0
    assert e["treatment"]["absent"] is None
    check_schema({**res, "provenance": {}}, "stats.json", "write", name="stats")
    head, rows = table(res)
    assert head[5] == "est. MFU ctrl / treat; peak device memory ctrl / treat (GiB)"
    assert rows[0][5] == f"{want['control']:.1%} / {want['treat']:.1%}; 2.00 / 4.00"
    assert f"est. MFU {100 * want['treat']:.1f}%, peak 4.0 GiB" in answer(res)[0]
    assert "H100 SXM (989 TFLOP/s)" in markdown(res, "t", {})


@pytest.mark.parametrize(("gpu", "why"), [(None, "ran on cpu, not CUDA"),
                                          ("NVIDIA GeForce GTX 1080", "is not in compute.BF16_DENSE_PEAK_TFLOPS"),
                                          ("NVIDIA H200 MIG 1g.18gb", "is a MIG slice")])
def test_no_mfu_on_cpu_or_an_unknown_gpu_and_one_note_says_why(gpu: str | None, why: str) -> None:
    from pairflow.report.table import answer, markdown, table

    res = analyse(*gpu_records(gpu), ["treat"], S)
    e = res["comparisons"][0]["efficiency"]
    assert e["control"]["mfu_median"] is None and e["treatment"]["mfu_median"] is None
    assert why in e["treatment"]["absent"] and why in e["control"]["absent"]
    md = markdown(res, "t", {})
    assert md.count(why) == 1 and f"control, treat: {e['treatment']['absent']}" in md
    assert "est. MFU" not in answer(res)[0]
    if gpu is None:  # nothing to show: no column at all
        assert not any("MFU" in h for h in table(res)[0])
        assert e["treatment"]["peak_memory_gib"] is None
    else:  # CUDA on a GPU the table does not know: peak memory is still measured
        assert table(res)[1][0][5] == "n/a / n/a; 2.00 / 4.00"


def test_seed_and_prompt_variance_tie_reads_add_prompts() -> None:
    """Issue 39 item 5 (the seed-variance split): three seeds per prompt at 0, 0, 3 and 2, 2, 5:
    within-prompt variance 3 each, so the seed part of a per-prompt mean is 3 / 3 = 1; prompt
    means 1 and 3 vary by 2, so the prompt part is 2 - 1 = 1. At the tie the advice is to add
    prompts (more seeds cannot shrink the prompt part); a little more seed noise tips it."""
    from pairflow.analysis.inference import Cell, Question, signflip_signs
    from pairflow.analysis.stats import _planning

    values = {("p0", 0): 0.0, ("p0", 1): 0.0, ("p0", 2): 3.0, ("p1", 0): 2.0, ("p1", 1): 2.0, ("p1", 2): 5.0}
    cell = Cell(np.array([1.0, 3.0]), signflip_signs(2, 2000, 0))
    pl = _planning(cell, Question("difference", 1), values, 0.05, S)
    assert (pl["var_prompt"], pl["var_seed"], pl["seeds_per_prompt"]) == (1.0, 1.0, 3.0)
    assert pl["advice"].startswith("add prompts (prompt-to-prompt")
    noisier = {**values, ("p0", 2): 3.3, ("p1", 2): 5.3}  # within 3.63, seed part 1.21; prompt part 2 - 1.21
    pl = _planning(Cell(np.array([1.1, 3.1]), signflip_signs(2, 2000, 0)), Question("difference", 1), noisier, 0.05, S)
    assert pl["var_seed"] == pytest.approx(1.21) and pl["var_prompt"] == pytest.approx(0.79)
    assert pl["advice"].startswith("add seeds")


def test_two_prompts_are_enough_for_the_plannings_sd_and_its_upper_bound() -> None:
    """Issue 39 item 5 (a survivor of "n > 1" -> "n > 2"): two prompts give an SD with 1 df,
    so planning reports it: values 1 and 3 have SD sqrt(2); its 80% upper bound is
    sqrt(2) sqrt(1 / chi2.ppf(0.2, 1)) (= 5.58), and a detectable effect follows from it."""
    from scipy.stats import chi2

    from pairflow.analysis.inference import Cell, Question, signflip_signs
    from pairflow.analysis.stats import _planning

    values = {("p0", 0): 1.0, ("p1", 0): 3.0}
    pl = _planning(Cell(np.array([1.0, 3.0]), signflip_signs(2, 2000, 0)), Question("difference", 1), values, 0.05, S)
    assert pl["sd_prompt"] == pytest.approx(math.sqrt(2), rel=1e-12)
    assert pl["sd_upper"] == pytest.approx(math.sqrt(2) * math.sqrt(1 / float(chi2.ppf(0.2, 1))), rel=1e-9)
    assert pl["sd_upper"] == pytest.approx(5.58, abs=0.01)
    assert pl["detectable_effect"] is not None and pl["detectable_effect"] > 0


def test_planning_asks_for_non_inferiority_at_the_loss_edge_of_the_metrics_direction(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Issue 39 item 5: "prompts needed" plans a study whose true difference is 0 to show the
    loss is inside the margin: for a higher-is-better metric the boundary is -margin, for a
    lower-is-better one +margin. Read from the boundary ``_planning`` hands the simulation
    (the stressed model can make both directions' counts equal, so the counts cannot tell)."""
    from pairflow.analysis import stats
    from pairflow.analysis.inference import Cell, Question, signflip_signs

    x = np.array([0.02, -0.11, 0.05, 0.31, -0.04, 0.09, 0.62, 0.0, -0.07, 0.16])
    cell = Cell(x, signflip_signs(10, 2000, 0))
    asked: list[tuple[float, float]] = []
    real = stats.plan_prompts

    def spy(c, truth, boundary, *args, **kw):  # type: ignore[no-untyped-def]
        asked.append((truth, boundary))
        return real(c, truth, boundary, *args, **kw)

    monkeypatch.setattr(stats, "plan_prompts", spy)
    values = {(f"p{i}", 0): v for i, v in enumerate(x)}
    stats._planning(cell, Question("margin", 1, margin=0.1), values, 0.05, S)
    assert asked and all(a == (0.0, -0.1) for a in asked), asked
    asked.clear()
    stats._planning(cell, Question("margin", -1, margin=0.1), values, 0.05, S)
    assert asked and all(a == (0.0, 0.1) for a in asked), asked


# --- issue 39 item 5: a test for each formula's direction, constant and switch ----------


def test_t_procedure_at_zero_spread_and_its_flat_rule_is_the_cells() -> None:
    """Zero spread: the interval is the point, and p is 1 where the point is 0, else 0.
    What counts as zero spread is ``Cell.flat``'s rule (SD at most 1e-12 of max(1, |mean|)),
    so the t-procedure and the cell never disagree on it, just above the threshold too."""
    from scipy.stats import ttest_1samp

    from pairflow.analysis.inference import Cell, signflip_signs
    from pairflow.analysis.stats import t_procedure

    lo, hi, p = t_procedure(np.array([[0.3, 0.3, 0.3], [0.0, 0.0, 0.0]]), 0.95)
    assert list(lo) == list(hi) == [0.3, 0.0] and list(p) == [0.0, 1.0]
    for x in ([0.0, 1e-12], [0.0, 1.5e-12], [5.0, 5.0 + 4e-12], [5.0, 5.0 + 1e-11], [0.1, 0.3, 0.2]):
        lo, hi, p = t_procedure(np.array(x), 0.95)
        flat = Cell(np.array(x), signflip_signs(len(x), 100, 0)).flat
        assert (float(lo) == float(hi)) == flat, x
        if not flat:
            assert float(p) == pytest.approx(ttest_1samp(x, 0.0).pvalue, rel=1e-12), x


def test_a_ratio_at_two_prompts_gets_the_t_interval_on_the_log_scale() -> None:
    """Two prompts are enough for a t-interval (1 degree of freedom): the speedup's and the
    compute ratio's interval at 2 prompts is scipy's, on the log scale."""
    from scipy.stats import t as student

    from pairflow.analysis.stats import _ratio_interval

    logr = np.array([0.1, 0.3])
    half = float(student.ppf(0.975, 1)) * float(logr.std(ddof=1)) / math.sqrt(2)
    lo, hi, why = _ratio_interval(logr, 0.95, "speedup")
    assert why is None and lo == pytest.approx(0.2 - half, rel=1e-12) and hi == pytest.approx(0.2 + half, rel=1e-12)
    assert _ratio_interval(logr[:1], 0.95, "speedup") == (None, None, "speedup: no interval: fewer than 2 prompts")


def test_wins_ties_and_losses_partition_the_prompts_at_the_tie_tolerance() -> None:
    """Every prompt is exactly one of a win, a tie or a loss. A tie is a difference within
    1e-12 of max(1, the largest |difference|) (inference.quantised's tolerance): at the
    tolerance itself (1e-12 here) a tie, just above it (1.5e-12) a win, and on a metric
    whose differences reach 1500, a difference of 1e-9 (below 1e-12 of 1500) a tie too."""
    for diffs, want in (([1e-12, 0.0, 0.0, 0.4, -0.4, 0.2], (2, 3, 1)),
                        ([1.5e-12, 0.0, 0.0, 0.4, -0.4, 0.2], (3, 2, 1)),
                        ([1500.0, 1e-9, 0.0, -700.0, 300.0], (2, 2, 1))):
        m = metric(analyse(*with_metric("q", {"treat": diffs}, base=0.0), ["treat"], S), "q")
        assert (m["wins"], m["ties"], m["losses"]) == want, diffs
        lower = metric(analyse(*with_metric("q", {"treat": diffs}, higher_is_better=False, base=0.0), ["treat"], S),
                       "q")
        assert (lower["wins"], lower["ties"], lower["losses"]) == want[::-1], diffs


def test_quantised_diagnostic_reads_half_the_prompts_on_one_value_from_3_prompts() -> None:
    """Half the prompts or more on one value is quantised: 3 of 6 are, 2 of 6 are not;
    at 3 prompts 2 on one value already are. At 2 prompts one value each is never said to
    be half (it would be true of every 2-prompt cell)."""
    from pairflow.analysis.inference import Cell, signflip_signs
    from pairflow.analysis.stats import diagnostics

    def said(x: list[float]) -> bool:
        return any(d.startswith("quantised") for d in diagnostics(Cell(np.array(x), signflip_signs(len(x), 100, 0))))

    assert said([0.1, 0.1, 0.1, 0.4, 0.5, 0.6]) and not said([0.1, 0.1, 0.3, 0.4, 0.5, 0.6])
    assert said([0.1, 0.1, 0.5]) and not said([0.1, 0.5])


def test_the_small_n_note_covers_every_prompt_count_where_the_sign_flip_decides() -> None:
    """Up to 5 prompts (``SIGNFLIP_ALWAYS_UP_TO``) the sign-flip test decides; at 5 its
    smallest p is 2 / 2^5 = 0.0625, above 0.05, so 5 prompts get the note; 6 (0.031) do not,
    and 5 do not at a 90% level (0.0625 < 0.1)."""
    from pairflow.analysis.stats import _small_n_notes

    def notes(n: int, level: float) -> list[str]:
        return _small_n_notes([{"metric": "q", "n_prompts": n}], level)  # type: ignore[list-item]

    assert len(notes(5, 0.95)) == 1 and "smallest attainable p = 0.0625" in notes(5, 0.95)[0]
    assert notes(6, 0.95) == [] and notes(5, 0.90) == []
    assert len(notes(5, 1 - 1 / 16)) == 1  # at alpha = 0.0625 exactly: p < alpha is still out of reach
    assert "n=2 prompts" in notes(2, 0.95)[0] and "smallest attainable p = 0.5" in notes(2, 0.95)[0]
    assert notes(1, 0.95) == ["n=1 prompt (q): no interval and no test; add prompts"]


def test_the_compute_ratio_interval_and_what_the_counts_lack() -> None:
    """With spread, the compute ratio's interval is exp of the t-interval of the per-prompt
    log ratios. Records that lack counts give no ratio (None), never an error: a control
    record without compute among counted ones, FLOPs not recorded (an older record), or a
    count of 0 FLOPs on either arm (nothing to divide). A block or attention count a record
    does not carry adds 0 to the totals."""
    from scipy.stats import t as student

    gen, scores, timings = records(prompts=4, seeds=1)
    ratios = {"p00": 0.5, "p01": 0.6, "p02": 0.4, "p03": 0.55}
    base = with_compute(gen, 1.0, ["overrides"])
    spread = copy.deepcopy(base)
    for r in spread:
        if r["arm"]["name"] == "treat":
            r["compute"]["work_flops"] = 1e9 * ratios[r["candidate"]["prompt_id"]]
    c = analyse(spread, scores, timings, ["treat"], S)["comparisons"][0]["compute"]
    logr = np.log(list(ratios.values()))
    half = float(student.ppf(0.975, 3)) * float(logr.std(ddof=1)) / 2
    assert c["ratio"] == pytest.approx(math.exp(logr.mean()), rel=1e-12) and c["ci_note"] is None
    assert c["ci"] == pytest.approx([math.exp(logr.mean() - half), math.exp(logr.mean() + half)], rel=1e-12)

    def compute_of(change: Callable[[dict], None]) -> dict | None:
        gen2 = copy.deepcopy(base)
        for r in gen2:
            change(r)
        return analyse(gen2, scores, timings, ["treat"], S)["comparisons"][0]["compute"]

    def one_control_uncounted(r: dict) -> None:
        if r["arm"]["name"] == "control" and r["candidate"]["prompt_id"] == "p02":
            r["compute"] = {}

    assert compute_of(one_control_uncounted) is None
    assert compute_of(lambda r: r["compute"].pop("work_flops")) is None
    assert compute_of(lambda r: r["compute"].update(work_flops=0) if r["arm"]["name"] == "treat" else None) is None
    partial = compute_of(lambda r: [r["compute"].pop(k) for k in ("attention_computed", "attention_skipped",
                                                                   "generations")])
    assert partial is not None and partial["blocks_computed"] == 4 * 8 and partial["control_blocks_computed"] == 4 * 8
    tiny = compute_of(lambda r: r["compute"].update(work_flops=1 if r["arm"]["name"] == "treat" else 2))
    assert tiny is not None and tiny["ratio"] == 0.5  # any positive count divides, however small
    assert (partial["attention_computed"], partial["attention_skipped"], partial["generations"]) == (0, 0, 0)


def test_a_sequential_designs_stopping_reason_comes_from_the_pairs_it_stopped_before() -> None:
    """``timing.pairs: auto``: the design's "stopped" lists the reasons its not-timed
    treatment records carry; a not-timed record without a reason (one a fixed ``pairs: N``
    sample wrote) adds none and is no error, and with no reason at all the design reads
    "exhausted" (every prompt timed)."""
    from pairflow.analysis import sequential

    gen, scores, timings = records(ratio=2.0, prompts=6, seeds=1)
    by_id = {(g["candidate"]["prompt_id"], g["arm"]["name"]): g for g in gen}
    timings = [t if t["candidate"]["prompt_id"] != "p05" else timing_record(by_id[("p05", t["arm"]["name"])], None)
               for t in timings]  # p05: not timed, and its records name no stopping reason
    for t in timings:
        if t["candidate"]["prompt_id"] != "p05":
            t["timing"]["sequential"] = {"design": sequential.DESIGN, "pilot": True, "pilot_prompts": 3,
                                         "precision": 0.05, "max_prompts": 6, "level": 0.95}
    design = analyse(gen, scores, timings, ["treat"], S)["comparisons"][0]["latency"]["design"]
    assert design["design"] == sequential.DESIGN and design["stopped"] == ["exhausted"]
    for t in timings:
        if t["candidate"]["prompt_id"] == "p05" and t["arm"]["name"] == "treat":
            t["timing"]["stopped"] = "ceiling"
    design = analyse(gen, scores, timings, ["treat"], S)["comparisons"][0]["latency"]["design"]
    assert design["stopped"] == ["ceiling"]


def test_sequential_timing_gives_steins_interval_when_the_whole_pilot_is_in_view() -> None:
    """``timing.pairs: auto``: every timed record carries the design; with all its pilot
    prompts here, the speedup's half-width on the log scale is the wider of Stein's (the
    pilot's SD, its degrees of freedom, over all timed prompts) and the t-interval's; a
    view holding only part of the pilot (a panel of a study-wide design) keeps the
    t-interval and says so. A record without the design makes it a fixed design."""
    from scipy.stats import t as student

    from pairflow.analysis import sequential

    gen, scores, timings = records(ratio=2.0, prompts=7, seeds=1)
    by_id = {(g["candidate"]["prompt_id"], g["arm"]["name"]): g for g in gen}
    timings = [t if t["candidate"]["prompt_id"] != "p06" else timing_record(by_id[("p06", t["arm"]["name"])], None)
               for t in timings]  # the design stopped before prompt p06: not timed
    for t in timings:
        if t["candidate"]["prompt_id"] == "p06" and t["arm"]["name"] == "treat":
            t["timing"]["stopped"] = "precision"
    for i, t in enumerate(timings):
        pid = t["candidate"]["prompt_id"]
        if pid == "p06":
            continue
        if t["arm"]["name"] == "treat":
            t["timing"]["latency_s"] *= 1 + 0.02 * ((i % 5) - 2)
        t["timing"]["sequential"] = {"design": sequential.DESIGN, "pilot": pid in ("p00", "p01", "p02"),
                                     "pilot_prompts": 3, "precision": 0.05, "max_prompts": 6, "level": 0.95}
    comp = analyse(gen, scores, timings, ["treat"], S)["comparisons"][0]
    design = comp["latency"]["design"]
    lat = {(t["candidate"]["prompt_id"], t["arm"]["name"]): t["timing"]["latency_s"] for t in timings}
    logr = np.array([math.log(lat[(f"p{p:02d}", "control")] / lat[(f"p{p:02d}", "treat")]) for p in range(6)])
    stein = float(student.ppf(0.975, 2)) * float(logr[:3].std(ddof=1)) / math.sqrt(6)
    t_half = float(student.ppf(0.975, 5)) * float(logr.std(ddof=1)) / math.sqrt(6)
    assert design["design"] == sequential.DESIGN and design["half_width"] == pytest.approx(stein, rel=1e-9)
    assert design["stopped"] == ["precision"] and comp["latency"]["timed_prompts"] == 6
    half = max(stein, t_half)
    assert comp["speedup"]["ci"] == pytest.approx([math.exp(logr.mean() - half), math.exp(logr.mean() + half)],
                                                  rel=1e-9)
    assert any("sequential timing" in n for n in comp["notes"])
    for t in timings:  # a panel's view of a study-wide design whose pilot had 4 prompts: 3 of them here
        if "sequential" in t["timing"]:
            t["timing"]["sequential"]["pilot_prompts"] = 4
    comp = analyse(gen, scores, timings, ["treat"], S)["comparisons"][0]
    assert comp["latency"]["design"]["half_width"] is None
    assert comp["speedup"]["ci"] == pytest.approx([math.exp(logr.mean() - t_half), math.exp(logr.mean() + t_half)],
                                                  rel=1e-9)
    assert any("this view holds 3 of its 4 pilot prompts" in n for n in comp["notes"])
    del timings[0]["timing"]["sequential"]
    assert analyse(gen, scores, timings, ["treat"], S)["comparisons"][0]["latency"]["design"]["design"] == "fixed"


def test_latency_reports_the_repeats_per_candidate() -> None:
    """Three timed repeats per candidate (``timing_record``) read as [3]; five on one arm as [3, 5]."""
    gen, scores, timings = records(prompts=3, seeds=1)
    assert analyse(gen, scores, timings, ["treat"], S)["comparisons"][0]["latency"]["repeats"] == [3]
    for t in timings:
        if t["arm"]["name"] == "treat":
            t["timing"]["seconds"] = [t["timing"]["latency_s"]] * 5
    assert analyse(gen, scores, timings, ["treat"], S)["comparisons"][0]["latency"]["repeats"] == [3, 5]


def test_noise_flags_read_the_interval_against_the_floor() -> None:
    """Inside +-floor on both ends: within the noise floor; wholly beyond it on either side:
    beyond; one end inside and one outside: it overlaps (the interval and the floor are
    closed: touching is inside). No floor or no interval: silent."""
    from pairflow.analysis.stats import noise_flags

    def flag(lo: float | None, hi: float | None, metric_name: str = "q") -> list[str]:
        stats = {"comparisons": [{"treatment": "t", "metrics": [{"metric": metric_name, "diff": 0.0,
                                                                  "ci": [lo, hi]}]}]}
        return noise_flags(stats, {"q": {"max_range": 1.0}})  # type: ignore[arg-type]

    assert flag(-0.5, 0.8)[0].endswith("within the noise floor (indistinguishable from a rerun)")
    assert flag(1.2, 3.0)[0].endswith(": beyond the noise floor") and flag(-3.0, -1.5)[0].endswith(
        ": beyond the noise floor")
    assert flag(-0.5, 2.0)[0].endswith("interval overlaps the noise floor")
    assert flag(-2.0, 0.5)[0].endswith("interval overlaps the noise floor")
    # the ends are closed: an interval reaching the floor exactly holds it
    assert flag(-1.0, 1.0)[0].endswith("within the noise floor (indistinguishable from a rerun)")
    assert flag(1.0, 3.0)[0].endswith("interval overlaps the noise floor")
    assert flag(-3.0, -1.0)[0].endswith("interval overlaps the noise floor")
    assert flag(None, None) == [] and flag(-0.5, 0.5, "other") == []


def test_two_prompts_state_their_hypothesis_and_one_does_not() -> None:
    """From 2 prompts a cell is tested, so it states what it tests, its SD and its sign-flip
    p (2 of the 4 sign vectors are as extreme as two gains); 1 prompt is not tested."""
    two = metric(analyse(*with_metric("q", {"treat": [0.1, 0.3]}, base=0.0), ["treat"], S), "q")
    assert two["hypothesis"] == "mean difference = 0" and two["p_signflip"] == 0.5
    assert two["sd_prompt"] == pytest.approx(float(np.std([0.1, 0.3], ddof=1)), rel=1e-12)
    one = metric(analyse(*with_metric("q", {"treat": [0.1]}), ["treat"], S), "q")
    assert one["hypothesis"] is None and one["p_signflip"] is None and one["sd_prompt"] is None


def test_effect_sizes_are_relative_to_the_control_and_standardised_from_the_question() -> None:
    """The relative effect is the difference over |control mean| (a negative control mean
    keeps the difference's sign); the standardised effect is (mean - reference) / SD, the
    reference 0 for a difference and the floor for a fidelity metric read against one."""
    m = metric(analyse(*with_metric("q", {"treat": DIFFS}, base=-2.0), ["treat"], S), "q")
    assert m["control_mean"] == -2.0 and m["relative_effect"] == pytest.approx(m["diff"] / 2.0, rel=1e-12)
    assert m["standardised_effect"] == pytest.approx(m["diff"] / float(np.std(DIFFS, ddof=1)), rel=1e-9)
    gen, scores, timings = records(prompts=8, seeds=1)
    fr = metric(analyse(gen, scores, timings, ["treat"], StatsSpec(2000, 0.95, 0, floors={"psnr": 29.0})), "psnr")
    assert fr["standardised_effect"] == pytest.approx((fr["treatment_mean"] - 29.0) / fr["sd_prompt"], rel=1e-12)
    assert fr["relative_effect"] is None and fr["diff"] is None


def test_the_p_beside_a_verdict_is_the_largest_of_the_tests_it_rests_on() -> None:
    """A claim needs every test it rests on: its printed p is their largest. The cell's own
    question keeps its family-adjusted p; a second value read from the same interval (0
    for "superior") is tested outside the family at the cell's level, its raw p scaled to
    it: min(1, p * alpha / alpha_cell), here x2 for a cell at 0.025 in a family at 0.05
    (capped at 1). Equal p name the cell's own question.
    An untested cell (zero spread) names no test at all."""
    from pairflow.analysis.inference import Cell, Question, signflip_signs
    from pairflow.analysis.stats import _p_verdict

    cell = Cell(np.array(DIFFS), signflip_signs(len(DIFFS), S.resamples, S.seed))
    q = Question("margin", 1, margin=0.2)
    raw0 = cell.p(0.0)
    assert raw0 is not None and 0.0005 < raw0 < 0.5
    assert _p_verdict(cell, q, [q.null, 0.0], 0.001, 0.025, 0.05) == (pytest.approx(2 * raw0, rel=1e-12),
                                                                        "difference from 0", False)
    assert _p_verdict(cell, q, [q.null, 0.0], 0.9, 0.025, 0.05) == (0.9, "non-inferiority (loss = margin 0.2)", True)
    raw_edge = cell.p(0.2)  # the equivalence edge +margin, beside the mean 0.216: p near 1, so scaled it is capped
    assert raw_edge is not None and raw_edge > 0.5
    assert _p_verdict(cell, q, [q.null, 0.2], 0.001, 0.025, 0.05) == (1.0, "equivalence's upper edge (gain = margin 0.2)",
                                                                        False)
    assert _p_verdict(cell, q, [q.null], 0.001, 0.025, 0.05) == (0.001, "non-inferiority (loss = margin 0.2)", True)
    flat = Cell(np.full(6, 0.3), signflip_signs(6, S.resamples, S.seed))
    assert _p_verdict(flat, q, [q.null], None, 0.05, 0.05) == (None, None, None)
    # quantised (3 of 6 on 0.5), all above 0 and -0.2: the sign-flip step 2 / 2^6 decides both tests; the tie
    # names the cell's own question, in the family
    steps = Cell(np.array([0.5, 0.5, 0.5, 0.6, 0.7, 0.8]), signflip_signs(6, S.resamples, S.seed))
    assert steps.p(q.null) == steps.p(0.0) == 2 / 2 ** 6
    assert _p_verdict(steps, q, [q.null, 0.0], 2 / 2 ** 6, 0.05, 0.05) == (
        2 / 2 ** 6, "non-inferiority (loss = margin 0.2)", True)


def test_each_test_a_verdict_rests_on_is_named_in_its_questions_words() -> None:
    from pairflow.analysis.inference import Question
    from pairflow.analysis.stats import _test_name

    margin = Question("margin", 1, margin=0.2)
    assert [_test_name(margin, mu) for mu in (margin.null, 0.0, 0.2)] == [
        "non-inferiority (loss = margin 0.2)", "difference from 0", "equivalence's upper edge (gain = margin 0.2)"]
    assert _test_name(Question("margin", -1, margin=0.2), 0.2) == "non-inferiority (loss = margin 0.2)"  # lower is better
    assert _test_name(Question("difference", 1), 0.0) == "difference from 0"
    floor = Question("floor", 1, floor=30.0)
    assert _test_name(floor, floor.null) == "floor (mean value = 30)"


def test_an_untested_cell_keeps_its_interval_at_the_studys_level() -> None:
    """A fidelity metric without a floor asks no question: it is not in the family, and
    its interval is at the study's level (95%), the cell's own; the word says how to get a
    verdict."""
    from pairflow.analysis.inference import Cell, signflip_signs

    gen, scores, timings = records(prompts=8, seeds=1)
    m = metric(analyse(gen, scores, timings, ["treat"], S), "psnr")
    x = np.array([r["scores"]["psnr"]["value"] for r in sorted(
        (r for r in scores if r["arm"]["name"] == "treat"), key=lambda r: r["candidate"]["prompt_id"])])
    lo, hi, _why = Cell(x, signflip_signs(8, S.resamples, S.seed)).interval(0.95)
    assert m["ci_level"] == 0.95 and m["ci"] == [pytest.approx(lo, rel=1e-12), pytest.approx(hi, rel=1e-12)]
    assert m["p_adjusted"] is None and m["verdict"] is None
    assert m["verdict_detail"] == "value only; declare a floor under stats/floors for a verdict"


def test_latency_counts_noisy_pairs_and_takes_medians_over_the_timed_pairs() -> None:
    """A pair counts as noisy when either arm's repeats vary more than timing/max_cv (said
    in a note); the CV and latency medians are over the timed pairs, per arm."""
    gen, scores, timings = records(prompts=5, seeds=1)
    for i, t in enumerate(timings):
        t["timing"]["cv"] = 0.01 * (i + 1)
        if i == 3:
            t["timing"]["over_max_cv"] = True
    comp = analyse(gen, scores, timings, ["treat"], S)["comparisons"][0]
    lat = comp["latency"]
    by_arm = {a: [t["timing"] for t in timings if t["arm"]["name"] == a] for a in ("control", "treat")}
    assert lat["pairs_over_max_cv"] == 1 and any("1 of 5 timed pair(s) vary between repeats" in n for n in comp["notes"])
    assert lat["control_cv_median"] == pytest.approx(float(np.median([t["cv"] for t in by_arm["control"]])))
    assert lat["treatment_cv_median"] == pytest.approx(float(np.median([t["cv"] for t in by_arm["treat"]])))
    assert lat["treatment_median_s"] == pytest.approx(float(np.median([t["latency_s"] for t in by_arm["treat"]])))
    assert lat["n_pairs"] == lat["sampled_pairs"] == lat["timed_prompts"] == 5 and lat["dropped_frames_differ"] == 0


def test_the_tail_names_the_worst_prompts_by_their_worst_pair() -> None:
    """Per-prompt loss is the mean over seeds of the difference in the metric's bad
    direction; the worst prompts come first (ties by name), each named by its worst seed
    (ties: the lowest seed), with the gallery anchor and both videos."""
    from pairflow.analysis.stats import _tail

    values = {("p/a", 0): -0.3, ("p/a", 1): -0.1, ("p/b", 0): -0.4, ("p/b", 1): -0.4, ("p/c", 0): 0.2,
              ("p/c", 1): 0.0, ("p/d", 0): -0.2, ("p/d", 1): -0.2}
    gen = {arm: {k: {"video": {"path": f"{arm}/{k[0]}/{k[1]}.mp4"}} for k in values} for arm in ("control", "t")}
    t = _tail(gen, "t", values, 1, 0.25, 0.95)  # type: ignore[arg-type]
    assert [(w["prompt"], w["loss"], w["seed"]) for w in t["worst"]] == [
        ("p/b", pytest.approx(0.4), 0), ("p/a", pytest.approx(0.2), 0), ("p/d", pytest.approx(0.2), 0)]
    assert t["worst"][0]["anchor"] == "p-t-b-s0" and t["worst"][0]["treatment_video"] == "t/p/b/0.mp4"
    assert t["exceed"] == 1 and t["n_prompts"] == 4  # only p/b's 0.4 exceeds the margin 0.25
    lower = _tail(gen, "t", {k: -v for k, v in values.items()}, -1, 0.25, 0.95)  # type: ignore[arg-type]
    assert [(w["prompt"], w["seed"]) for w in lower["worst"]] == [("p/b", 0), ("p/a", 0), ("p/d", 0)]
