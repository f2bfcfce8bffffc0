"""verdicts: the CONSORT six, read from where the interval lies against 0 and the margin,
for higher- and lower-is-better metrics, with and without a margin; the word and the p
beside it never disagree, and every report words a verdict the same way (issue 39)."""

from __future__ import annotations

import re

import pytest
from test_stats import DIFFS, with_metric

from pairflow.analysis.stats import analyse
from pairflow.analysis.verdicts import CLAIMS, COLOURS, PHRASES, colour_verdicts, verdict_colour, verdict_text
from pairflow.plan.config import StatsSpec

SHIFTS = [round(-1.6 + 0.1 * i, 2) for i in range(26)]
"""Moves DIFFS' interval (half-width about 0.2-0.3 at the Holm level of 26 arms) from wholly
beyond every margin below to wholly above 0 and the largest margin."""


def expected(lo: float, hi: float, margin: float | None) -> str:
    """The CONSORT reading of an interval [lo, hi] in the metric's better direction."""
    d = margin or 0.0
    if margin is not None and -d < lo and hi < d:
        return "equivalent"
    if lo > 0:
        return "superior"
    if lo > -d:
        return "non_inferior"
    if hi < -d:
        return "inferior"
    if hi < 0:
        return "worse_non_inferiority_not_shown"
    return "inconclusive"


@pytest.mark.parametrize("higher_is_better", [True, False])
def test_every_interval_position_against_0_and_the_margin_reads_its_consort_word(higher_is_better: bool,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # The sample-size planning beside each cell (simulated studies: 80% of this walk's time) is not
    # what this walk reads; its answers are tested in test_planning and test_inference.
    from pairflow.analysis import inference, planning, stats

    def unplanned(*_a: object, **_k: object) -> planning.Plan:
        return planning.Plan(None, 0.0, planning.PLAN_CAP)

    monkeypatch.setattr(stats, "plan_prompts", unplanned)
    monkeypatch.setattr(inference, "plan_prompts", unplanned)
    sign = 1 if higher_is_better else -1
    seen: dict[float | None, set[str]] = {}
    for margin in (None, 0.15, 0.4, 1.0):
        arms = {f"s{i:02d}": [sign * (x - 0.216 + s) for x in DIFFS] for i, s in enumerate(SHIFTS)}
        spec = StatsSpec(2000, 0.95, 0, margins={} if margin is None else {"q": margin})
        res = analyse(*with_metric("q", arms, higher_is_better=higher_is_better), sorted(arms), spec)
        for c in res["comparisons"]:
            m = c["metrics"][0]
            lo, hi = sorted(sign * b for b in m["ci"])  # the interval in the metric's better direction
            want = expected(lo, hi, margin)
            assert m["verdict_code"] == want, (margin, higher_is_better, lo, hi, m["verdict_detail"])
            assert m["verdict"] == PHRASES[want]
            # the word and the p beside it agree: below alpha exactly when the word claims something
            assert (m["p_verdict"] < 0.05) == (want in CLAIMS), (want, m["p_verdict"])
            own = m["p_verdict_test"] in ("difference from 0", f"non-inferiority (loss = margin {margin or 0:g})")
            if margin is None or want in ("non_inferior", "inferior", "inconclusive"):
                assert m["p_verdict_family"] == "Holm over the table's 26 tests" and own
            if want == "worse_non_inferiority_not_shown":  # decided by the test of 0, outside the family
                assert m["p_verdict_test"] == "difference from 0"
                assert m["p_verdict_family"] == "outside the family, scaled to this cell's Holm level"
            text = verdict_text(m)
            assert text.startswith(m["verdict"] + " (p ") and m["p_verdict_family"] in text
            seen.setdefault(margin, set()).add(want)
    assert seen[None] == {"superior", "inferior", "inconclusive"}  # margin 0: no NI, equivalence or "worse"
    assert seen[0.15] >= {"superior", "non_inferior", "worse_non_inferiority_not_shown", "inferior", "inconclusive"}
    assert "equivalent" in seen[0.4] | seen[1.0]
    assert set().union(*seen.values()) == set(PHRASES)


def test_the_issue_example_is_worse_non_inferiority_not_shown_with_the_p_of_its_own_test() -> None:
    """Regression (issue 39): temporal_flickering -0.0036 [-0.0064, -0.0027] against a margin
    of 0.005 read "inferior" beside a p labelled (Holm) that belonged to the test of 0."""
    d = [-0.0036 + 0.0018 * x for x in (-2.1, 0.4, 1.3, -0.8, 0.2, 1.9, -1.2, 0.6, -0.3, 0.0)]
    res = analyse(*with_metric("q", {"treat": d}), ["treat"], StatsSpec(2000, 0.95, 0, margins={"q": 0.005}))
    m = res["comparisons"][0]["metrics"][0]
    assert m["ci"][1] < 0 and m["ci"][0] < -0.005  # wholly below 0, but holding the loss edge
    assert m["verdict"] == "worse, non-inferiority not shown"
    assert m["p_verdict_test"] == "difference from 0" and "outside the family" in verdict_text(m)
    assert m["p_adjusted"] >= 0.05  # the family's own test (non-inferiority) is not rejected


def test_no_question_is_value_only_and_every_code_has_one_phrase() -> None:
    assert verdict_text({"verdict_code": None, "verdict": None}) == "value only"
    assert len(set(PHRASES.values())) == 6 and PHRASES["worse_non_inferiority_not_shown"] == (
        "worse, non-inferiority not shown")
    m = {"verdict_code": "inconclusive", "verdict": "inconclusive", "p_verdict": None}
    assert verdict_text(m) == "inconclusive"  # no test ran (zero spread, one prompt): no p beside it


@pytest.mark.parametrize("shift, margin, word", [(0.1, 0.25, "non_inferior"), (0.3, 0.2, "superior"),
                                                 (-1.5, 0.3, "inferior")])
def test_a_lower_is_better_metric_is_the_mirror_image_of_a_higher_is_better_one(shift: float, margin: float,
                                                                                 word: str) -> None:
    """Issue 39 item 5: mutants of the margin's direction survived (one gave a wrong
    "non-inferior"). A lower-is-better metric whose treatment moves it by -d reads exactly as
    a higher-is-better one moved by +d: the same word, the same p (the null is +margin for
    one, -margin for the other), the interval mirrored, wins for losses, the same tail."""
    from test_stats import DIFFS

    d = [x - 0.216 + shift for x in DIFFS]
    spec = StatsSpec(2000, 0.95, 0, margins={"q": margin})
    up = analyse(*with_metric("q", {"treat": d}), ["treat"], spec)["comparisons"][0]["metrics"][0]
    down = analyse(*with_metric("q", {"treat": [-v for v in d]}, higher_is_better=False), ["treat"],
                   spec)["comparisons"][0]["metrics"][0]
    assert up["verdict_code"] == down["verdict_code"] == word
    for key in ("p_value", "p_adjusted", "p_verdict", "p_signflip", "standardised_effect"):
        assert down[key] == pytest.approx(up[key] if key != "standardised_effect" else -up[key], abs=1e-12), key
    assert down["ci"] == pytest.approx([-up["ci"][1], -up["ci"][0]], abs=1e-12)
    assert (down["wins"], down["ties"], down["losses"]) == (up["wins"], up["ties"], up["losses"])
    assert down["tail"]["exceed"] == up["tail"]["exceed"] and down["tail"]["worst"] and [
        w["loss"] for w in down["tail"]["worst"]] == pytest.approx([w["loss"] for w in up["tail"]["worst"]])
    assert down["p_verdict_test"] == up["p_verdict_test"] and down["verdict_rests_on"] == up["verdict_rests_on"]
    # wins counted by hand: prompts where the higher-is-better metric rose
    assert up["wins"] == sum(v > 0 for v in d) and up["losses"] == sum(v < 0 for v in d)
    # the tail's losses are the drops of the higher-is-better metric, counted by hand against the margin
    assert up["tail"]["exceed"] == sum(-v > margin for v in d)
    assert up["tail"]["worst"][0]["loss"] == pytest.approx(-min(d))


def test_a_p_is_shown_to_two_digits_and_never_as_zero() -> None:
    def shown(p: float) -> str:
        return verdict_text({"verdict_code": "superior", "verdict": "superior", "p_verdict": p,
                             "p_verdict_test": "difference from 0", "p_verdict_family": "Holm"})

    assert shown(0.0123) == "superior (p 0.012: difference from 0, Holm)"
    assert shown(1e-4) == "superior (p 0.0001: difference from 0, Holm)"  # the smallest shown as a number
    assert shown(9.9e-5) == shown(1e-12) == "superior (p < 0.0001: difference from 0, Holm)"


def _luminance(colour: str) -> float:
    """WCAG relative luminance of ``#rrggbb``."""
    c = [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    lin = [x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in c]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def test_every_verdict_has_one_colour_legible_on_white() -> None:
    """Issue 41: one colour per verdict code for every HTML report, each at least WCAG AA's
    4.5:1 against white, so the word (which carries the meaning) stays readable."""
    assert set(COLOURS) == set(PHRASES)
    for code in PHRASES:
        assert verdict_colour(code) == COLOURS[code]
        assert 1.05 / (_luminance(COLOURS[code]) + 0.05) >= 4.5, code
    assert COLOURS["inferior"] != COLOURS["superior"] != COLOURS["inconclusive"] != COLOURS["inferior"]


def test_colour_verdicts_wraps_each_phrase_whole_and_nothing_else() -> None:
    """Longest phrase first (``worse, non-inferiority not shown`` is one verdict, not an
    ``inferior`` inside it); a test's name (``non-inferiority``) or ``equivalence`` is no verdict."""
    text = ("q: worse, non-inferiority not shown (p 0.01: non-inferiority (loss = margin 0.1), Holm); "
            "r: non-inferior; s: inferior; t: equivalent, not equivalence; u: superior; v: inconclusive")
    out = colour_verdicts(text)
    found = re.findall(r"<span class='verdict' data-verdict='(\w+)' style='color:(#\w+);font-weight:bold'>([^<]+)</span>",
                       out)
    assert found == [(c, COLOURS[c], PHRASES[c]) for c in ("worse_non_inferiority_not_shown", "non_inferior",
                                                            "inferior", "equivalent", "superior", "inconclusive")]
    assert re.sub(r"<[^>]+>", "", out) == text  # only wrapped: the words are unchanged
    assert colour_verdicts("non-inferiority, equivalence, value only") == "non-inferiority, equivalence, value only"
