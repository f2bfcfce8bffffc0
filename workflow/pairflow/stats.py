"""Paired statistics: treatment against control, with intervals and honest refusals.

Estimand. The unit of analysis is the (prompt, seed) pair: both arms were generated
from the same random stream. Per prompt, the treatment-minus-control difference is
averaged over seeds; the estimand is the mean of those per-prompt differences over the
panel's prompts (prompts are the sampled population; seeds are repeated measures).

Interval and test: a Student t-interval over the n per-prompt differences (df = n - 1)
and the two-sided one-sample t-test of "mean difference = 0", which is the same
procedure inverted: the interval excludes 0 exactly when p < 1 - level, so a cell never
shows an interval and a p-value that disagree. Why not the percentile bootstrap over
prompts used before: at the prompt counts people run it undercovers (on prompts x 2
seeds with noise sd 0.1 it covered the true effect 0.72 of the time at 3 prompts, 0.80 at
4, 0.87 at 7), while the t-interval holds 0.95 there (tests/test_stats.py, BENCHMARKS.md).
Why not an exact sign-flip permutation test as the test: with n prompts its smallest
attainable two-sided p is 2 / 2^n, so at n <= 5 it can never reject at 0.05. It is still
computed, as a distribution-free check (``p_signflip``), and a cell whose n cannot reach
the level that way says so. p-values are Holm-adjusted across a comparison's metrics
(``p_holm``). Speedup is the geometric mean over prompts of the per-prompt geometric
mean (over seeds) of control/treatment latency, with the t-interval on the log scale;
the latency columns are the geometric means over the same units, so they divide to it.
The compute ratio (treatment FLOPs / control FLOPs, counted exactly per video in the bulk
pass, ``compute.py``) is summarised the same way. An arm whose videos equal control's bit
for bit, or whose cache skipped no block, is flagged "this arm changed nothing".
Nothing depends on the number of workers, shards or the order records arrive in: inputs
are sorted by pair key first.

Direction. Differences are always treatment - control in the metric's own units; for a
lower-is-better metric (``higher_is_better: false``, e.g. LPIPS) a negative difference is
an improvement: the win rate counts pairs where the treatment is strictly better in the
metric's direction, and ``verdict`` says better/worse/no detectable difference.

Imports without torch.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

import numpy as np

from .config import StatsSpec
from .errors import IntegrityError, PairingError, StatsError
from .recordtypes import (
    Comparison,
    ComputeFields,
    ComputeSummary,
    GenerationRecord,
    MetricResult,
    Planning,
    ScoreRecord,
    ScoringSetup,
    StudyStats,
    TimingRecord,
)

ESTIMAND = ("unit: (prompt, seed) pair; per prompt, mean over seeds of treatment - control; "
            "summary: mean over prompts; CI: Student t-interval over prompts (df = prompts - 1); "
            "test: the same t procedure inverted (two-sided one-sample t-test of the per-prompt differences), "
            "Holm-adjusted across metrics; exact sign-flip p reported as a distribution-free check")
PROCEDURE = "t"
"""Interval/test procedure written into every statistics file."""
COMPARABLE: tuple[tuple[str, Callable[[GenerationRecord], object]], ...] = (
    ("model", lambda r: r["model"]["weights"]),
    ("encoder fingerprint", lambda r: r["encoder"]["fingerprint"]["digest"]),
    ("encoder recipe", lambda r: r["encoder"]["recipe_digest"]),
    ("frames", lambda r: r["generation"]["frames"]),
    ("height", lambda r: r["generation"]["height"]),
    ("width", lambda r: r["generation"]["width"]),
    ("steps", lambda r: r["generation"]["steps"]))
"""Fields on which a treatment's records must equal their control's to be compared."""

_R = TypeVar("_R", GenerationRecord, ScoreRecord, TimingRecord)
Key = tuple[str, int]
"""A pair's key in an index: ("<panel>/<prompt id>", seed)."""
Index = dict[str, dict[Key, _R]]
"""Records by arm name, then by pair key (``index``)."""


def _per_prompt(values: dict[tuple[str, int], float]) -> np.ndarray:
    by_prompt: dict[str, list[float]] = defaultdict(list)
    for (prompt, _seed), v in sorted(values.items()):
        by_prompt[prompt].append(v)
    return np.array([np.mean(v) for _p, v in sorted(by_prompt.items())], dtype=np.float64)


def t_procedure(x: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Student t-interval of the mean of ``x`` along its last axis (n >= 2 values) and the
    two-sided p-value of the one-sample t-test of mean 0 (scipy's ``ttest_1samp`` and its
    ``confidence_interval``: the interval is the test inverted). Vectorised over leading
    axes. Zero spread: the interval is the point and p is 1 if the point is 0, else 0.
    Returns (low, high, p), each of ``x``'s shape without its last axis."""
    import warnings

    from scipy.stats import ttest_1samp

    x = np.asarray(x, dtype=np.float64)
    if x.shape[-1] < 2:
        raise StatsError(f"a t-interval needs at least 2 paired values, got {x.shape[-1]}; add prompts or "
                         "seeds to the panel")
    mean, sd = x.mean(axis=-1), x.std(axis=-1, ddof=1)
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # zero spread: handled below
        res = ttest_1samp(x, 0.0, axis=-1)
        ci = res.confidence_interval(confidence_level=level)
    flat = sd <= 1e-12 * np.maximum(1.0, np.abs(mean))
    lo = np.where(flat, mean, ci.low)
    hi = np.where(flat, mean, ci.high)
    p = np.where(flat, np.where(mean == 0, 1.0, 0.0), res.pvalue)
    return lo, hi, p


def _interval(x: np.ndarray, level: float) -> tuple[float | None, float | None, float | None]:
    """(low, high, p) for one 1-D sample; all None for fewer than 2 prompts."""
    if len(x) < 2:
        return None, None, None
    lo, hi, p = t_procedure(x, level)
    return float(lo), float(hi), float(p)


def signflip_min_p(n: int) -> float:
    """Smallest two-sided p an exact sign-flip test can reach with ``n`` prompts: 2 / 2^n."""
    return min(1.0, math.ldexp(1.0, 1 - n))  # 2 * 2^-n, exact


def _signflip_p(x: np.ndarray, s: StatsSpec) -> float | None:
    """Exact (2^n <= resamples) or Monte Carlo sign-flip permutation p of mean 0."""
    from scipy.stats import permutation_test

    if len(x) < 2:
        return None
    if np.all(x == 0):
        return 1.0
    res = permutation_test((x,), np.mean, permutation_type="samples", n_resamples=s.resamples,
                           alternative="two-sided", rng=np.random.default_rng(s.seed))
    return float(res.pvalue)


def _power(crit: Any, df: Any, nc: Any) -> Any:
    """Two-sided t-test power, P(|T| > crit) for T noncentral t(df, nc >= 0). The lower
    tail is below 1e-9 wherever scipy's nct.cdf returns NaN (far into it), so NaN reads 0."""
    from scipy.stats import nct

    return nct.sf(crit, df, nc) + np.nan_to_num(nct.cdf(-crit, df, nc), nan=0.0)


def required_prompts(sd: float, effect: float, level: float, power: float, limit: int = 100_000) -> int | None:
    """Prompts a two-sided paired t-test at ``1 - level`` needs to detect a true mean
    difference ``effect`` with probability ``power``, given a per-prompt standard
    deviation ``sd`` (exact, from the noncentral t distribution). None beyond ``limit``."""
    from scipy.stats import t as student

    if effect == 0:
        raise StatsError("a target effect of 0 cannot be detected; give the smallest difference that matters "
                         "(stats/targets in the config)")
    if sd == 0:
        return 2
    start = 2
    while start <= limit:  # power rises with n: search in growing blocks, not all of 2..limit at once
        n = np.arange(start, min(limit, 4 * start + 256) + 1)
        crit = student.ppf(1 - (1 - level) / 2, n - 1)
        hit = np.nonzero(_power(crit, n - 1, abs(effect) / sd * np.sqrt(n)) >= power)[0]
        if hit.size:
            return int(n[hit[0]])
        start = int(n[-1]) + 1
    return None


def detectable_effect(sd: float, n: int, level: float, power: float) -> float | None:
    """Smallest true |mean difference| the paired t-test detects with probability
    ``power`` at ``n`` prompts and per-prompt standard deviation ``sd``."""
    from scipy.optimize import brentq
    from scipy.stats import t as student

    if n < 2:
        return None
    if sd == 0:
        return 0.0
    crit = student.ppf(1 - (1 - level) / 2, n - 1)

    def gap(d: float) -> float:
        nc = d / sd * math.sqrt(n)
        return float(_power(crit, n - 1, nc)) - power

    hi = sd * (crit + 1.0) / math.sqrt(n)
    while gap(hi) < 0:  # power rises with the effect; widen until the bracket holds it
        hi *= 2
    return float(brentq(gap, 0.0, hi))


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjustment (scipy ships only Benjamini-Hochberg as
    ``false_discovery_control``, so this 8-line version is ours)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def _check_comparable(ctrl: GenerationRecord, treat: GenerationRecord) -> None:
    for label, field in COMPARABLE:
        a, b = field(ctrl), field(treat)
        if a != b:
            raise PairingError(
                f"arms {ctrl['arm']['name']!r} and {treat['arm']['name']!r} are not comparable: "
                f"{label} differs for prompt {ctrl['candidate']['prompt_id']} seed "
                f"{ctrl['candidate']['seed']}: {a!r} vs {b!r}; regenerate both arms with one setup")


def compare(gen: Index[GenerationRecord], scores: Index[ScoreRecord], timings: Index[TimingRecord], treatment: str,
            s: StatsSpec) -> Comparison:
    """Compare one treatment against control.

    ``gen[arm][(prompt_id, seed)]`` is a generation record, ``scores[arm][...]`` a score
    record, ``timings[arm][...]`` a timed-pass record (latency comes only from those).
    Raises PairingError for a missing partner (unless ``s.missing ==
    'drop-pair'``) or incomparable records.
    """
    ctrl_keys, treat_keys = set(gen["control"]), set(gen.get(treatment, {}))
    missing = sorted(ctrl_keys ^ treat_keys)
    notes = []
    if missing:
        if s.missing != "drop-pair":
            raise PairingError(f"{treatment}: {len(missing)} pair(s) lack a partner, e.g. prompt "
                               f"{missing[0][0]} seed {missing[0][1]}; regenerate them, or set "
                               "stats/missing: drop-pair to analyse complete pairs only")
        notes.append(f"{len(missing)} incomplete pair(s) dropped (stats/missing: drop-pair)")
    keys = sorted(ctrl_keys & treat_keys)
    if not keys:
        raise PairingError(f"{treatment}: no complete pairs with control")
    for k in keys:
        _check_comparable(gen["control"][k], gen[treatment][k])
    compute = _compute(gen, treatment, keys, s)
    flags = no_effect_flags(gen, treatment, keys, compute)
    scoring = _scoring_setup([scores[a][k] for a in ("control", treatment) for k in keys if k in scores.get(a, {})])
    metrics: list[MetricResult] = []
    names = sorted(set[str]().union(*(scores[treatment][k]["scores"] for k in keys)))
    targets = dict(s.target_effects)
    for name in names:
        subset = _static_subset(scores, treatment, keys, name, notes)
        if not subset:
            continue
        spec = scores[treatment][subset[0]]["scores"][name]["spec"]
        t = {k: scores[treatment][k]["scores"][name]["value"] for k in subset}
        c_mean: float | None
        wins: float | None
        if spec["kind"] == "FR":  # fidelity: the control's own value is the identity, not a score
            diff = _per_prompt(t)
            c_mean, t_mean = None, float(diff.mean())
            wins = None
        else:
            c = {k: scores["control"][k]["scores"][name]["value"] for k in subset}
            diff = _per_prompt({k: t[k] - c[k] for k in subset})
            c_mean, t_mean = float(_per_prompt(c).mean()), float(_per_prompt(t).mean())
            better = [(t[k] > c[k]) if spec["higher_is_better"] else (t[k] < c[k]) for k in subset]
            wins = float(np.mean(better))
        lo, hi, p = _interval(diff, s.level)
        tested = spec["kind"] != "FR"
        metrics.append({"metric": name, "kind": spec["kind"], "higher_is_better": spec["higher_is_better"],
                        "n_pairs": len(subset), "n_prompts": len(diff),
                        "control_mean": c_mean, "treatment_mean": t_mean,
                        "diff": float(diff.mean()) if tested else None,
                        "sd_prompt": float(diff.std(ddof=1)) if len(diff) > 1 else None,
                        "ci": [lo, hi], "p_value": p if tested else None,
                        "p_signflip": _signflip_p(diff, s) if tested else None,
                        "signflip_min_p": signflip_min_p(len(diff)),
                        "win_rate": wins,
                        "verdict": _verdict(lo, hi, spec["higher_is_better"]) if tested else None,
                        "planning": _planning(diff, targets.get(name), s) if tested else None})
    with_p = [(m, m["p_value"]) for m in metrics if m["p_value"] is not None]
    for (m, _), p in zip(with_p, holm([p for _, p in with_p]), strict=True):
        m["p_holm"] = p
    notes += _small_n_notes(metrics, s.level)
    for arm in ("control", treatment):
        absent = [k for k in keys if k not in timings.get(arm, {})]
        if absent:
            raise PairingError(f"{arm}: no timed-pass latency for prompt {absent[0][0]} seed {absent[0][1]} "
                               "(and maybe others); latency is reported only from the timed pass, rerun it")
    # timing/pairs: N times a seeded sample of pairs; the others carry no latency.
    sampled = [k for k in keys if all(timings[a][k]["sampled"] for a in ("control", treatment))]
    if len(sampled) < len(keys):
        notes.append(f"latency: from a seeded sample of {len(sampled)} of {len(keys)} pair(s) (timing/pairs); the "
                     "speedup's interval rests on the sampled prompts only")
    # A timed run that computed other frames than the bulk run timed another computation:
    # that pair's latency is dropped (and said so), never reported.
    differ = [k for k in sampled if any(timings[a][k]["matches_bulk_frames"] is not True
                                        for a in ("control", treatment))]
    timed = [k for k in sampled if k not in differ]
    if differ:
        notes.append(f"latency: {len(differ)} of {len(keys)} pair(s) dropped because the timed run's frames differ "
                     f"from the bulk run's (e.g. {differ[0][0]} seed {differ[0][1]}); see pairflow verify")
    if not timed:
        raise PairingError(f"{treatment}: no pair has a timed run that computed the bulk run's frames; latency "
                           "cannot be reported. Rerun the timed pass on the same stack as the bulk run")
    lat_c = {k: _latency(timings["control"][k]) for k in timed}
    lat_t = {k: _latency(timings[treatment][k]) for k in timed}
    cvs = {a: [timings[a][k]["timing"].get("cv") for k in timed] for a in ("control", treatment)}
    over_cv = sum(1 for k in timed if any(timings[a][k]["timing"].get("over_max_cv") for a in ("control", treatment)))
    if over_cv:
        notes.append(f"latency: {over_cv} of {len(timed)} timed pair(s) vary between repeats more than timing/max_cv "
                     f"({timings['control'][timed[0]]['timing'].get('max_cv')}); a noisy machine or too few repeats")
    log_ratio = _per_prompt({k: math.log(lat_c[k] / lat_t[k]) for k in timed})
    lo, hi, _p = _interval(log_ratio, s.level)
    return {
        "treatment": treatment, "n_prompts": len({k[0] for k in keys}), "n_pairs": len(keys),
        "flags": flags, "notes": notes, "metrics": metrics, "scoring": scoring,
        # Geometric means over the speedup's own units (per prompt, over seeds; then over
        # prompts): control / treatment equals the speedup exactly. Medians kept for reference.
        "latency": {"pass": sorted({timings[a][k]["timing"]["pass"] for a in ("control", treatment) for k in keys}),
                    "control_geomean_s": float(math.exp(_per_prompt({k: math.log(v) for k, v in lat_c.items()})
                                                        .mean())),
                    "treatment_geomean_s": float(math.exp(_per_prompt({k: math.log(v) for k, v in lat_t.items()})
                                                          .mean())),
                    "n_pairs": len(timed), "dropped_frames_differ": len(differ),
                    "sampled_pairs": len(sampled), "pairs_over_max_cv": over_cv,
                    # median over candidates of each candidate's repeat CV (None with one repeat)
                    "control_cv_median": _median_or_none(cvs["control"]),
                    "treatment_cv_median": _median_or_none(cvs[treatment]),
                    "control_median_s": float(np.median(list(lat_c.values()))),
                    "treatment_median_s": float(np.median(list(lat_t.values())))},
        "speedup": {"geomean": float(math.exp(log_ratio.mean())),
                    "ci": [None, None] if lo is None or hi is None else [math.exp(lo), math.exp(hi)]},
        "compute": compute,
        "kinds": sorted({k for r in gen[treatment].values() for k in r["arm"]["kinds"]}),
    }


def _latency(r: TimingRecord) -> float:
    """A sampled timing's latency (the schema makes it a number when ``sampled`` is true)."""
    latency = r["timing"]["latency_s"]
    if latency is None:
        raise IntegrityError(f"timing record of {r['candidate']['candidate_id']} is sampled but has no latency; "
                             "rerun the timed pass")
    return latency


NO_EFFECT = "this arm changed nothing"
"""How every no-effect flag begins (the table marks the arm's row with it)."""


def no_effect_flags(gen: Index[GenerationRecord], treatment: str, keys: list[Key],
                    compute: ComputeSummary | None) -> list[str]:
    """Flags for an arm that changed nothing: every video bit-identical to control's
    (raw frames where recorded, else the encoded file), or a cache arm whose counted
    block and attention skips are zero on every video (a cache that never engaged)."""
    def same(k: Key) -> bool:
        a, b = gen["control"][k]["video"], gen[treatment][k]["video"]
        return a["raw_digest"] == b["raw_digest"]  # the uncompressed frames, bit for bit

    flags = []
    if all(same(k) for k in keys):
        flags.append(f"{NO_EFFECT}: every video is bit-identical to control's")
    cached = all("cache" in gen[treatment][k]["arm"]["kinds"] for k in keys)
    if cached and compute is not None and compute["blocks_skipped"] == 0 and compute["attention_skipped"] == 0:
        flags.append(f"{NO_EFFECT}: its cache skipped no transformer block and no attention call on any of "
                     f"{len(keys)} videos (counted by hooks on the blocks); it cannot be faster or differ")
    return flags


def _compute(gen: Index[GenerationRecord], treatment: str, keys: list[Key], s: StatsSpec) -> ComputeSummary | None:
    """Compute ratio (treatment FLOPs / control FLOPs; FLOPs = transformer work plus any
    search verifier's) as a geometric mean over prompts of the per-prompt geometric mean
    over seeds, with the t-interval on the log scale (as the speedup), and the counted
    block and attention forwards. None when the records carry no compute counts. Raises
    PairingError when a pair's arms started from latents of different shapes (their noise
    was not shared)."""
    counted = {a: {k: gen[a][k]["compute"] for k in keys} for a in ("control", treatment)}
    ctrl, treat = counted["control"], counted[treatment]
    c0 = ctrl[keys[0]] if keys else None
    if c0 is None or not all(ctrl.values()) or not all(treat.values()):
        return None
    for k in keys:
        a, b = _counts(ctrl[k]).get("latent_shape"), _counts(treat[k]).get("latent_shape")
        if a != b:
            raise PairingError(f"{treatment}: prompt {k[0]} seed {k[1]} started from latents of shape {b}, control "
                               f"from {a}; the pair did not share its initial noise. Use a model with the same "
                               "latent layout")
    work = {a: {k: float(_counts(v).get("work_flops", 0.0)) for k, v in counted[a].items()}
            for a in ("control", treatment)}
    if any(v <= 0 for v in work["control"].values()):
        return None
    log_ratio = _per_prompt({k: math.log(work[treatment][k] / work["control"][k]) for k in keys})
    lo, hi, _p = _interval(log_ratio, s.level)

    def total(a: str, f: Literal["blocks_computed", "blocks_skipped", "attention_computed", "attention_skipped",
                                 "generations"]) -> int:
        return sum(int(_counts(v).get(f, 0)) for v in counted[a].values())

    return {"ratio": float(math.exp(log_ratio.mean())),
            "ci": [None, None] if lo is None or hi is None else [math.exp(lo), math.exp(hi)],
            "control_flops_mean": float(np.mean(list(work["control"].values()))),
            "treatment_flops_mean": float(np.mean(list(work[treatment].values()))),
            "control_blocks_computed": total("control", "blocks_computed"),
            "blocks_computed": total(treatment, "blocks_computed"),
            "blocks_skipped": total(treatment, "blocks_skipped"),
            "attention_computed": total(treatment, "attention_computed"),
            "attention_skipped": total(treatment, "attention_skipped"),
            "generations": total(treatment, "generations"),
            "counter": c0.get("counter")}


def _counts(c: ComputeFields | None) -> ComputeFields:
    """A record's compute counts, known present (``_compute`` returns early otherwise)."""
    if c is None:
        raise PairingError("a generation record without compute counts reached the compute ratio")
    return c


def _median_or_none(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return float(np.median(vals)) if vals else None


def _verdict(lo: float | None, hi: float | None, higher_is_better: bool) -> str:
    """Better, worse or undetected, in the metric's direction, from the interval."""
    if lo is None or hi is None:
        return "no interval (fewer than 2 prompts)"
    if lo > 0 or hi < 0:
        return "treatment better" if (lo > 0) == higher_is_better else "treatment worse"
    return "no detectable difference"


def _planning(diff: np.ndarray, target: float | None, s: StatsSpec) -> Planning:
    """Sample size from this study as a pilot: the per-prompt standard deviation of the
    difference, the smallest effect detectable with ``s.power`` at this prompt count,
    and, for a metric with a target effect, the prompts needed to detect it."""
    n = len(diff)
    sd = float(diff.std(ddof=1)) if n > 1 else None
    return {"sd_prompt": sd, "power": s.power, "target_effect": target,
            "detectable_effect": None if sd is None else detectable_effect(sd, n, s.level, s.power),
            "prompts_needed": None if sd is None or target is None else required_prompts(sd, target, s.level,
                                                                                          s.power)}


def _small_n_notes(metrics: list[MetricResult], level: float) -> list[str]:
    """Say where a prompt count is too small for a distribution-free test to reach the
    level, or for any interval at all."""
    out = []
    by_n: dict[int, list[str]] = defaultdict(list)
    for m in metrics:
        if m["p_value"] is not None or m["n_prompts"] < 2:
            by_n[m["n_prompts"]].append(m["metric"])
    for n, names in sorted(by_n.items()):
        if n < 2:
            out.append(f"n={n} prompt ({', '.join(names)}): no interval and no test; add prompts")
        elif signflip_min_p(n) > 1 - level:
            out.append(f"n={n} prompts ({', '.join(names)}): smallest attainable p = {signflip_min_p(n):.3g} for "
                       f"an exact sign-flip test, so no distribution-free test can reach p < {1 - level:.2g}; the "
                       "t-interval and t-test assume roughly normal per-prompt differences")
    return out


def _static_subset(scores: Index[ScoreRecord], treatment: str, keys: list[Key], name: str,
                   notes: list[str]) -> list[Key]:
    """The pairs a metric is analysed on. For a score flagged with VBench's static filter
    (``static``, written under ``scoring/static_filter: intersection``), only pairs whose
    control and treatment videos are both static: the same subset for both arms."""
    def static(arm: str, k: Key) -> bool | None:
        entry = scores[arm][k]["scores"].get(name)
        return None if entry is None else entry.get("static")

    flags = [(static("control", k), static(treatment, k)) for k in keys]
    if all(c is None and t is None for c, t in flags):
        return keys
    if any(c is None or t is None for c, t in flags):
        raise PairingError(f"{treatment}: {name} carries the static flag for some videos only; rescore the panel")
    kept = [k for k, (c, t) in zip(keys, flags, strict=True) if c and t]
    notes.append(f"{name}: {len(kept)} of {len(keys)} pairs where both videos are static (VBench RAFT static "
                 "filter, intersection of the arms)" + ("; not analysed" if not kept else ""))
    return kept


def _scoring_setup(score_records: list[ScoreRecord]) -> ScoringSetup:
    """How both arms were scored. Raises PairingError when the arms' score records come
    from different scorer builds (code, weights, device, precision or process layout):
    a paired difference must not mix scorers."""
    builds = {r["scorer"]["digest"] for r in score_records}
    if len(builds) > 1:
        raise PairingError(f"score records of one comparison come from {len(builds)} different scorer builds "
                           f"({sorted(builds)}); rescore the panel so both arms share one build "
                           "(snakemake --forcerun generate_score_panel; score_panel under fleet.panel_jobs: per-stage)")
    first = score_records[0]["scorer"] if score_records else None
    names = sorted({n for r in score_records for n in r["scores"]})
    return {"scorer_build": next(iter(builds), None),
            "weights_origin": first["weights_origin"] if first else None,
            "device": first["device"] if first else None, "precision": first["precision"] if first else None,
            "compared_frames": sorted({r["compared_frames"] for r in score_records}),
            "static_filter": sorted({r["static_filter"]["temporal_flickering"] for r in score_records}),
            "decoding": {name: sorted({r["scores"][name]["decoded_with"] for r in score_records
                                       if name in r["scores"]}) for name in names}}


def index(records: Sequence[_R]) -> Index[_R]:
    """Group records by arm and (prompt id, seed); a duplicate key is an error.

    Keys include the panel so a study-level index keeps panels apart.
    """
    out: Index[_R] = defaultdict(dict)
    for r in records:
        cand = r["candidate"]
        key = (f"{cand['panel']}/{cand['prompt_id']}", int(cand["seed"]))
        arm = r["arm"]["name"]
        if key in out[arm]:
            raise PairingError(f"two records for arm {arm} prompt {key[0]} seed {key[1]}; "
                               "a candidate must be counted once")
        out[arm][key] = r
    return dict(out)


def analyse(gen_records: Sequence[GenerationRecord], score_records: Sequence[ScoreRecord],
            timing_records: Sequence[TimingRecord], treatments: list[str], s: StatsSpec) -> StudyStats:
    """Every treatment against control. Result is independent of record order."""
    check_streams(gen_records)
    gen, scores, timings = index(gen_records), index(score_records), index(timing_records)
    if "control" not in gen:
        raise PairingError("no control records; the control arm must be generated")
    return {"estimand": ESTIMAND, "procedure": PROCEDURE, "level": s.level, "resamples": s.resamples,
            "seed": s.seed, "missing_policy": s.missing, "power": s.power,
            "comparisons": [compare(gen, scores, timings, t, s) for t in treatments]}


def noise_flags(stats: StudyStats, floors: dict[str, dict[str, Any]]) -> list[str]:
    """Say, per treatment and metric, whether a paired difference is within the noise
    floor measured by repeatability reruns (max range of a candidate's score across
    runs). A difference whose whole interval lies inside ±floor is indistinguishable
    from rerunning the control."""
    out = []
    for c in stats["comparisons"]:
        for m in c["metrics"]:
            floor = floors.get(m["metric"], {}).get("max_range")
            if floor is None or m["diff"] is None or m["ci"][0] is None:
                continue
            lo, hi = m["ci"]
            if -floor <= lo and hi <= floor:
                verdict = "within the noise floor (indistinguishable from a rerun)"
            elif lo > floor or hi < -floor:
                verdict = "beyond the noise floor"
            else:
                verdict = "interval overlaps the noise floor"
            out.append(f"{c['treatment']} / {m['metric']}: diff {m['diff']:.4g} [{lo:.4g}, {hi:.4g}] vs floor "
                       f"±{floor:.4g}: {verdict}")
    return out


def check_streams(records: Sequence[GenerationRecord]) -> None:
    """Refuse records of different pairs that replayed one random stream (a seeding bug or
    two workers handed the same stream): the arms of one pair share a stream, nothing else.
    """
    seen: dict[int, tuple[str, str, int]] = {}
    for r in sorted(records, key=lambda r: (r["candidate"]["panel"], r["candidate"]["prompt_id"],
                                            int(r["candidate"]["seed"]), r["arm"]["name"])):
        c = r["candidate"]
        pair = (c["panel"], c["prompt_id"], int(c["seed"]))
        other = seen.setdefault(int(c["stream_seed"]), pair)
        if other != pair:
            raise IntegrityError(f"two candidates replay the same random stream {c['stream_seed']}: "
                                 f"{other[0]}/{other[1]} seed {other[2]} and {pair[0]}/{pair[1]} seed {pair[2]}; "
                                 "their records must not count; regenerate them")
