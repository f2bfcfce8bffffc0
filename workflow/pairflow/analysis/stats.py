"""Paired statistics: treatment against control, with intervals and honest refusals.

Estimand. The unit of analysis is the (prompt, seed) pair: both arms were generated
from the same random stream. Per prompt, the treatment-minus-control difference is
averaged over seeds; the estimand is the mean of those per-prompt differences over the
panel's prompts (prompts are the sampled population; seeds are repeated measures).

Interval and test (``inference.Cell``): the max-p union of Student's t, Hall's
skew-corrected t and the exact sign-flip permutation test, inverted into an interval
(coverage and false-positive rate measured at 3 to 30 prompts for normal, heavy-tailed,
skewed, 0/1, clustered and ratio data: BENCHMARKS.md; why in docs/metrics-and-verdicts.md). Zero spread
gives no interval, and a prompt count at which the sign-flip test cannot reach the level
gives an unbounded one; the table says which. Each cell answers one question (``Question``):
a metric with a margin (``stats.margins``) gets one of CONSORT's six verdicts
(``analysis.verdicts``: superior, non-inferior, equivalent, worse, non-inferiority not
shown, inferior, inconclusive); an FR metric with a floor (``stats.floors``) is read against
it as a loss edge, counted on pairs whose videos differ (bit-identical pairs are counted
apart); any other metric with margin 0, never reading as equivalence. A 0/1 metric is
tested exactly (``analysis.exact``). The study's cells form one
multiplicity family (Holm or Benjamini-Hochberg, ``stats.multiplicity``): each cell's
interval is at its adjusted level, and its verdict is read from that interval, so the word
and the adjusted p beside it agree. Speedup is the geometric mean over prompts of the
per-prompt geometric mean (over seeds) of control/treatment latency, with the t-interval
on the log scale (latencies are close to lognormal, so the log ratio is close to normal);
the latency columns are the geometric means over the same units, so they divide to it.
The compute ratio (treatment FLOPs / control FLOPs, counted exactly per video in the bulk
pass, ``compute.py``) is summarised the same way. An arm whose videos equal control's bit
for bit, or whose cache skipped no block, is flagged "this arm changed nothing".
Nothing depends on the number of workers, shards or the order records arrive in: inputs
are sorted by pair key first.

Direction. Differences are always treatment - control in the metric's own units; for a
lower-is-better metric (``higher_is_better: false``, e.g. LPIPS) a negative difference is
an improvement: wins / ties / losses count prompts in the metric's direction, and margins
are losses in that direction.

Imports without torch.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

import numpy as np

from ..errors import IntegrityError, PairingError, StatsError
from ..generation.compute import MIG_SLICE, bf16_peak, estimated_mfu
from ..plan.config import StatsSpec
from ..records.store import check_streams, identical_to_control, in_fidelity_mean, timing_frames_differ
from ..records.types import (
    ArmEfficiency,
    Comparison,
    ComputeFields,
    ComputeSummary,
    EfficiencySummary,
    GenerationRecord,
    LatencySummary,
    MetricResult,
    Planning,
    RatioSummary,
    ScoreRecord,
    ScoringSetup,
    StudyStats,
    TailPrompt,
    TailStatement,
    TimingRecord,
)
from . import exact, sequential, tail
from .inference import (
    MULTIPLICITY_NAMES,
    PROCEDURE,
    SD_UPPER_CONFIDENCE,
    SIGNFLIP_ALWAYS_UP_TO,
    SKEW_CHECKED,
    Cell,
    Question,
    detectable_effect,
    family_levels,
    min_prompts,
    plan_prompts,
    sd_upper,
    signflip_min_p,
    signflip_signs,
    variance_split,
    verdict,
)
from .verdicts import PHRASES, family_label

ESTIMAND = ("unit: (prompt, seed) pair; per prompt, mean over seeds of treatment - control (FR metrics: of the "
            "value against control, on pairs whose videos differ); summary: mean over prompts; test and interval: "
            "the union procedure over prompts, adjusted across every (arm, metric) test of the table")
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
    # lazy: scipy.stats is slow to import (seconds on a busy node); every rule script imports this via steps.
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


def _ratio_interval(log_ratio: np.ndarray, level: float, what: str) -> tuple[float | None, float | None, str | None]:
    """(low, high, why) of a ratio's t-interval on the log scale, with the scores' zero-spread
    rule: every prompt's ratio equal (a timer's tick, an exact FLOP count) gives no
    interval, never a zero-width one, and ``why`` says so; fewer than 2 prompts none either."""
    if len(log_ratio) < 2:
        return None, None, f"{what}: no interval: fewer than 2 prompts"
    if Cell(log_ratio, np.ones((1, len(log_ratio)))).flat:
        return None, None, (f"{what}: no interval: every prompt's ratio is {math.exp(float(log_ratio[0])):.6g} (zero "
                            "spread, e.g. latencies on a coarse timer's ticks or identical FLOP counts); an interval "
                            "needs spread")
    lo, hi, _p = _interval(log_ratio, level)
    return lo, hi, None


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (``inference.family_levels``)."""
    return family_levels(pvalues, 0.05, "holm")[0]


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
    """Compare one treatment against control; its metrics are their own multiplicity
    family (``analyse`` makes the whole study one family instead).

    ``gen[arm][(prompt_id, seed)]`` is a generation record, ``scores[arm][...]`` a score
    record, ``timings[arm][...]`` a timed-pass record (latency comes only from those).
    Raises PairingError for a missing partner (unless ``s.missing ==
    'drop-pair'``) or incomparable records.
    """
    comparison, cells = _compare(gen, scores, timings, treatment, s)
    decide(cells, s)
    return comparison


Pending = list[tuple[MetricResult, Cell, Question | None, dict[Key, float]]]
"""Cells awaiting the family's adjustment: result, test, question, per-pair values."""


def _compare(gen: Index[GenerationRecord], scores: Index[ScoreRecord], timings: Index[TimingRecord],
             treatment: str, s: StatsSpec) -> tuple[Comparison, Pending]:
    """``compare`` before the family's adjustment: the comparison and its pending cells.
    Notes are collected in the order the parts below run."""
    notes: list[str] = []
    keys = _complete_pairs(gen, treatment, s, notes)
    compute = _compute(gen, treatment, keys, s)
    flags = no_effect_flags(gen, treatment, keys, compute)
    scoring = _scoring_setup([scores[a][k] for a in ("control", treatment) for k in keys if k in scores.get(a, {})])
    pending = _metric_cells(gen, scores, treatment, keys, s, notes)
    notes += _small_n_notes([m for m, *_ in pending], s.level)
    timed, latency, speedup = _latency_summary(timings, treatment, keys, s, notes)
    return {
        "treatment": treatment, "n_prompts": len({k[0] for k in keys}), "n_pairs": len(keys),
        "flags": flags, "notes": notes, "metrics": [m for m, *_ in pending], "scoring": scoring,
        "latency": latency, "speedup": speedup, "compute": compute,
        "efficiency": _efficiency(gen, timings, treatment, timed),
        "kinds": sorted({k for r in gen[treatment].values() for k in r["arm"]["kinds"]}),
    }, pending


def question_values(gen: Index[GenerationRecord], scores: Index[ScoreRecord], treatment: str,
                    s: StatsSpec) -> dict[str, tuple[Question | None, dict[Key, float]]]:
    """Per metric the treatment was scored on: its question and per-pair values, exactly
    as the table's cells take them (pairs completed and checked, the static filter
    applied): what a group-sequential look tests (``analysis.looks``)."""
    pending = _metric_cells(gen, scores, treatment, _complete_pairs(gen, treatment, s, []), s, [])
    return {m["metric"]: (q, values) for m, _cell, q, values in pending}


def _complete_pairs(gen: Index[GenerationRecord], treatment: str, s: StatsSpec, notes: list[str]) -> list[Key]:
    """The (prompt, seed) keys both arms have, each pair checked comparable. A key only
    one arm has raises PairingError, unless ``stats/missing: drop-pair`` drops it (noted)."""
    ctrl_keys, treat_keys = set(gen["control"]), set(gen.get(treatment, {}))
    missing = sorted(ctrl_keys ^ treat_keys)
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
    return keys


def _metric_cells(gen: Index[GenerationRecord], scores: Index[ScoreRecord], treatment: str, keys: list[Key],
                  s: StatsSpec, notes: list[str]) -> Pending:
    """One pending cell per metric the treatment was scored on, over the pairs its
    static filter keeps (a metric that keeps none is noted and left out)."""
    pending: Pending = []
    names = sorted(set[str]().union(*(scores[treatment][k]["scores"] for k in keys)))
    for name in names:
        subset = _static_subset(scores, treatment, keys, name, notes)
        if subset:
            pending.append(_metric(gen, scores, treatment, name, subset, s))
    return pending


def _timed_pairs(timings: Index[TimingRecord], treatment: str, keys: list[Key],
                 notes: list[str]) -> tuple[list[Key], list[Key], list[Key]]:
    """(sampled, differ, timed): the pairs the timed pass sampled, those whose timed run
    computed other frames than the bulk run (dropped, noted), and the rest, whose latency
    counts. Raises PairingError when a pair has no timing record or none is timed."""
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
    differ = [k for k in sampled if any(timing_frames_differ(timings[a][k]) for a in ("control", treatment))]
    timed = [k for k in sampled if k not in differ]
    if differ:
        notes.append(f"latency: {len(differ)} of {len(keys)} pair(s) dropped because the timed run's frames differ "
                     f"from the bulk run's (e.g. {differ[0][0]} seed {differ[0][1]}); see pairflow verify")
    if not timed:
        raise PairingError(f"{treatment}: no pair has a timed run that computed the bulk run's frames; latency "
                           "cannot be reported. Rerun the timed pass on the same stack as the bulk run")
    return sampled, differ, timed


def _latency_summary(timings: Index[TimingRecord], treatment: str, keys: list[Key], s: StatsSpec,
                     notes: list[str]) -> tuple[list[Key], LatencySummary, RatioSummary]:
    """(timed pairs, latency, speedup): per arm the geometric mean and median latency over
    the timed pairs, and the speedup (control / treatment) with its interval."""
    sampled, differ, timed = _timed_pairs(timings, treatment, keys, notes)
    lat_c = {k: _latency(timings["control"][k]) for k in timed}
    lat_t = {k: _latency(timings[treatment][k]) for k in timed}
    cvs = {a: [timings[a][k]["timing"].get("cv") for k in timed] for a in ("control", treatment)}
    over_cv = sum(1 for k in timed if any(timings[a][k]["timing"].get("over_max_cv") for a in ("control", treatment)))
    if over_cv:
        notes.append(f"latency: {over_cv} of {len(timed)} timed pair(s) vary between repeats more than timing/max_cv "
                     f"({timings['control'][timed[0]]['timing'].get('max_cv')}); a noisy machine or too few repeats")
    log_ratio = _per_prompt({k: math.log(lat_c[k] / lat_t[k]) for k in timed})
    lo, hi, why = _ratio_interval(log_ratio, s.level, "speedup")
    design = _sequential_design(timings, treatment, keys, timed, lat_c, lat_t, log_ratio, s, notes)
    if design.get("half_width") is not None and lo is not None and hi is not None:
        # Stein's interval: valid whatever N the pilot chose; the wider of it and the t-interval.
        mid = float(log_ratio.mean())
        half = max(hi - mid, mid - lo, design["half_width"])
        lo, hi = mid - half, mid + half
    # Geometric means over the speedup's own units (per prompt, over seeds; then over
    # prompts): control / treatment equals the speedup exactly. Medians kept for reference.
    latency: LatencySummary = {
        "pass": sorted({timings[a][k]["timing"]["pass"] for a in ("control", treatment) for k in keys}),
        "control_geomean_s": float(math.exp(_per_prompt({k: math.log(v) for k, v in lat_c.items()}).mean())),
        "treatment_geomean_s": float(math.exp(_per_prompt({k: math.log(v) for k, v in lat_t.items()}).mean())),
        "n_pairs": len(timed), "dropped_frames_differ": len(differ),
        "sampled_pairs": len(sampled), "pairs_over_max_cv": over_cv,
        # median over candidates of each candidate's repeat CV (None with one repeat)
        "control_cv_median": _median_or_none(cvs["control"]),
        "treatment_cv_median": _median_or_none(cvs[treatment]),
        "control_median_s": float(np.median(list(lat_c.values()))),
        "treatment_median_s": float(np.median(list(lat_t.values()))),
        # what was timed: prompts, repeats per candidate, and the design that chose them
        "timed_prompts": len(log_ratio),
        "repeats": sorted({len(timings[a][k]["timing"].get("seconds") or [0]) for a in ("control", treatment)
                           for k in timed}),
        "design": design}
    speedup: RatioSummary = {"geomean": float(math.exp(log_ratio.mean())),
                             "ci": [None, None] if lo is None or hi is None else [math.exp(lo), math.exp(hi)],
                             "ci_note": why}
    return timed, latency, speedup


def _sequential_design(timings: Index[TimingRecord], treatment: str, keys: list[Key], timed: list[Key],
                       lat_c: dict[Key, float], lat_t: dict[Key, float], log_ratio: np.ndarray, s: StatsSpec,
                       notes: list[str]) -> dict[str, Any]:
    """How the timed pairs were chosen, and (``timing.pairs: auto``, with the whole pilot
    in view) Stein's half-width on the log scale (``analysis.sequential``). A panel's
    comparison sees only its part of the study's pilot: its interval is the t-interval
    over the prompts the study-level design timed there, said so in a note."""
    seq = [x for a in ("control", treatment) for k in timed
           if (x := timings[a][k]["timing"].get("sequential")) is not None]
    if not seq or len(seq) < 2 * len(timed):
        return {"design": "fixed", "pairs": sorted({str(timings["control"][k]["timing"]["pairs"]) for k in keys})}
    n0 = seq[0]["pilot_prompts"]
    pilot_keys = {k for k in keys if all((timings[a][k]["timing"].get("sequential") or {}).get("pilot")
                                        for a in ("control", treatment))}
    pilot = _per_prompt({k: math.log(lat_c[k] / lat_t[k]) for k in timed if k in pilot_keys})
    stopped = sorted({timings[treatment][k]["timing"]["stopped"] for k in keys
                      if not timings[treatment][k]["sampled"] and "stopped" in timings[treatment][k]["timing"]})
    out: dict[str, Any] = {"design": sequential.DESIGN, "pilot_prompts": n0, "precision": seq[0]["precision"],
                           "max_prompts": seq[0]["max_prompts"], "stopped": stopped or ["exhausted"],
                           "half_width": None}
    if len({p for p, _seed in pilot_keys}) < n0:
        notes.append(f"latency: timed by the study's sequential design (timing/pairs: auto); this view holds "
                     f"{len({p for p, _seed in pilot_keys})} of its {n0} pilot prompts, so its interval is the "
                     "t-interval over the prompts timed here")
        return out
    out["half_width"] = sequential.stein_half_width(pilot, len(log_ratio), s.level)
    notes.append(f"latency: sequential timing ({sequential.DESIGN}, timing/pairs: auto): a pilot of {n0} prompts, "
                 f"then {len(log_ratio)} prompts in all for {treatment} (stopped: {', '.join(out['stopped'])}; "
                 f"target ±{100 * seq[0]['precision']:g}%); the interval is the wider of Stein's and the t-interval")
    return out


MFU_CONVENTION = ("estimated MFU: the counted forward FLOPs of the candidate's bulk-pass call (everything the "
                  "counter saw, plus any search verifier's) / its timed median latency / the datasheet dense BF16 "
                  "peak of the GPU the timed pass ran on (PaLM convention, no backward); median over the arm's "
                  "timed candidates. Peak memory: max over them of torch.cuda.max_memory_allocated")


def _efficiency(gen: Index[GenerationRecord], timings: Index[TimingRecord], treatment: str,
                timed: list[Key]) -> EfficiencySummary:
    """Per arm, over the timed pairs: the median estimated MFU (``compute.estimated_mfu``)
    and the max peak device memory. Peak memory needs the timed pass on CUDA; the MFU also
    a GPU in ``compute.BF16_DENSE_PEAK_TFLOPS`` and counted FLOPs on every candidate."""
    return {"control": _arm_efficiency(gen["control"], timings["control"], timed),
            "treatment": _arm_efficiency(gen[treatment], timings[treatment], timed),
            "convention": MFU_CONVENTION}


def _arm_efficiency(gen: dict[Key, GenerationRecord], timings: dict[Key, TimingRecord],
                    keys: list[Key]) -> ArmEfficiency:
    t = [timings[k]["timing"] for k in keys]
    out: ArmEfficiency = {"mfu_median": None, "peak_memory_gib": None, "gpu": None, "peak_tflops": None,
                          "absent": None}
    devices = sorted({str(x.get("device")) for x in t})
    if devices != ["cuda"]:
        out["absent"] = (f"the timed pass ran on {', '.join(devices)}, not CUDA: no estimated MFU or peak device "
                         "memory")
        return out
    peaks = [x.get("peak_device_mb") for x in t]
    out["peak_memory_gib"] = max(float(p) for p in peaks if p is not None) / 1024 if all(
        p is not None for p in peaks) else None
    names = sorted({str(x.get("gpu_name")) for x in t})
    if any(x.get("gpu_name") is None for x in t):
        out["absent"] = ("the timing records do not name their GPU (timed before gpu_name was recorded): no "
                         "estimated MFU; rerun the timed pass")
        return out
    known = {n: bf16_peak(n) for n in names}
    if any(v is None for v in known.values()):
        unknown = [n for n, v in known.items() if v is None]
        migs = [n for n in unknown if "MIG" in n.split()]
        out["absent"] = (f"GPU {', '.join(migs)} is {MIG_SLICE}" if migs else
                         f"GPU {', '.join(unknown)} is not in compute.BF16_DENSE_PEAK_TFLOPS: no estimated MFU; add "
                         "its datasheet dense BF16 peak there")
        return out
    flops = [_call_flops(gen[k]) for k in keys]
    if any(f is None for f in flops):
        out["absent"] = "the generation records carry no counted FLOPs: no estimated MFU"
        return out
    mfu = [estimated_mfu(float(f or 0.0), _latency(timings[k]), str(x["gpu_name"]))
           for k, f, x in zip(keys, flops, t, strict=True)]
    out["mfu_median"] = float(np.median([m["mfu"] for m in mfu if m is not None])) if all(mfu) else None
    models = {v[0]: v[1] for v in known.values() if v is not None}
    out["gpu"] = ", ".join(sorted(models))
    out["peak_tflops"] = max(models.values()) / 1e12
    return out


def _call_flops(r: GenerationRecord) -> float | None:
    """The counted forward FLOPs of a bulk-pass call: all the counter saw (``total_flops``)
    plus any verifier's; ``work_flops`` where the total was not counted; None without counts."""
    c = r["compute"]
    if not c:
        return None
    total = c.get("total_flops")
    flops = float(total) + float(c.get("verifier_flops", 0)) if total is not None and total > 0 else (
        float(c["work_flops"]) if c.get("work_flops") else None)
    return flops if flops is not None and flops > 0 else None


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
        return identical_to_control(gen["control"][k], gen[treatment][k])  # the uncompressed frames, bit for bit

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
    block and attention forwards (a count a record lacks adds 0). None when a record of
    either arm carries no compute counts, or no FLOPs (absent or 0: nothing to divide). Raises
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
    if any(v <= 0 for arm in work.values() for v in arm.values()):  # uncounted (or absent) on a pair: no ratio
        return None
    log_ratio = _per_prompt({k: math.log(work[treatment][k] / work["control"][k]) for k in keys})
    lo, hi, why = _ratio_interval(log_ratio, s.level, "compute ratio")

    def total(a: str, f: Literal["blocks_computed", "blocks_skipped", "attention_computed", "attention_skipped",
                                 "generations"]) -> int:
        return sum(int(_counts(v).get(f, 0)) for v in counted[a].values())

    return {"ratio": float(math.exp(log_ratio.mean())),
            "ci": [None, None] if lo is None or hi is None else [math.exp(lo), math.exp(hi)], "ci_note": why,
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


def _metric(gen: Index[GenerationRecord], scores: Index[ScoreRecord], treatment: str, name: str, subset: list[Key],
            s: StatsSpec) -> tuple[MetricResult, Cell, Question | None, dict[Key, float]]:
    """One metric's estimate and its cell, before the family's adjustment. NR metrics:
    treatment - control per pair. FR metrics (fidelity to control): the value, on pairs
    whose videos differ; bit-identical pairs (PSNR would read its cap) are counted apart."""
    spec = scores[treatment][subset[0]]["scores"][name]["spec"]
    sign = 1 if spec["higher_is_better"] else -1
    t = {k: float(scores[treatment][k]["scores"][name]["value"]) for k in subset}
    c: dict[Key, float] = {}
    c_mean: float | None = None
    question: Question | None
    if spec["kind"] == "FR":
        if name in s.margins:
            raise StatsError(f"stats/margins names {name}, a fidelity metric (measured against control, so it "
                             f"has no treatment - control difference); give it a floor under stats/floors instead")
        identical = [k for k in subset if identical_to_control(gen["control"][k], gen[treatment][k])]
        values = {k: v for k, v in t.items() if in_fidelity_mean(spec["kind"], k in identical)}
        question = Question("floor", sign, floor=s.floors[name]) if name in s.floors else None
    else:
        if name in s.floors:
            raise StatsError(f"stats/floors names {name}, a per-video metric; floors are for fidelity metrics "
                             "against control. Give it a margin under stats/margins instead")
        identical = []
        c = {k: float(scores["control"][k]["scores"][name]["value"]) for k in subset}
        values = {k: t[k] - c[k] for k in subset}
        c_mean = float(_per_prompt(c).mean())
        question = (Question("margin", sign, margin=s.margins[name]) if name in s.margins
                    else Question("difference", sign))
    x = _per_prompt(values) if values else np.zeros(0)
    # A 0/1 metric's differences follow a trinomial law: the exact paired-proportions test decides there.
    binary = spec["kind"] == "NR" and exact.is_binary(list(c.values()), list(t.values()), x)
    cell = (exact.BinaryCell if binary else Cell)(x, signflip_signs(len(x), s.resamples, s.seed))
    nr = spec["kind"] == "NR"
    sd = cell.sd if cell.n > 1 else None
    tie = 1e-12 * float(np.max(np.abs(x), initial=1.0))  # of max(1, the largest |difference|); no prompts: 1e-12
    ref = 0.0 if question is None or question.kind != "floor" else question.floor
    m: MetricResult = {
        "metric": name, "kind": spec["kind"], "higher_is_better": spec["higher_is_better"],
        "n_pairs": len(subset), "n_prompts": cell.n, "n_identical_pairs": len(identical),
        "control_mean": c_mean, "treatment_mean": float(_per_prompt(t).mean()) if nr else
        (cell.mean if cell.n else None),
        "diff": cell.mean if nr else None, "sd_prompt": sd,
        "relative_effect": cell.mean / abs(c_mean) if nr and c_mean else None,
        "standardised_effect": (cell.mean - ref) / sd if sd and question is not None else None,
        "wins": int(np.sum(sign * x > tie)) if nr else None, "ties": int(np.sum(np.abs(x) <= tie)) if nr else None,
        "losses": int(np.sum(sign * x < -tie)) if nr else None,
        "margin": s.margins.get(name), "floor": s.floors.get(name),
        "hypothesis": question.hypothesis if question is not None and cell.n > 1 else None,
        "ci": [None, None], "ci_level": s.level, "ci_note": None,
        "p_value": cell.p(question.null) if question is not None else None, "p_adjusted": None,
        "p_signflip": cell.p_signflip(question.null) if question is not None and cell.n > 1 else None,
        "signflip_min_p": signflip_min_p(cell.n), "skewness": cell.skew, "diagnostics": diagnostics(cell),
        "test": exact.PROCEDURE if binary else PROCEDURE,
        "verdict": None, "verdict_code": None, "verdict_detail": None, "p_verdict": None, "p_verdict_test": None,
        "p_verdict_family": None, "verdict_rests_on": [], "planning": None,
        "tail": _tail(gen, treatment, values, sign, question.margin, s.level)
        if question is not None and question.kind == "margin" and values else None}
    if m["tail"] is not None and m["tail"]["flag"]:
        m["diagnostics"].append(tail.flag_text(m["tail"]))
    return m, cell, question, values


def _tail(gen: Index[GenerationRecord], treatment: str, values: dict[Key, float], sign: int, margin: float,
          level: float) -> TailStatement:
    """The cell's tail statement (``tail.statement``): per-prompt losses (the mean over
    seeds, in the metric's bad direction) and its ``tail.WORST`` worst prompts, each named
    by its worst pair: the gallery anchor and both videos."""
    loss = {k: -sign * v for k, v in values.items()}
    by_prompt: dict[str, list[Key]] = defaultdict(list)
    for k in sorted(loss):
        by_prompt[k[0]].append(k)
    per_prompt = {p: float(np.mean([loss[k] for k in ks])) for p, ks in by_prompt.items()}
    worst: list[TailPrompt] = []
    for p in sorted(per_prompt, key=lambda p: (-per_prompt[p], p))[:tail.WORST]:
        k = max(by_prompt[p], key=lambda k: (loss[k], -k[1]))
        panel, prompt_id = p.split("/", 1)
        worst.append({"prompt": p, "loss": per_prompt[p], "seed": k[1],
                      "anchor": f"{panel}-{treatment}-{prompt_id}-s{k[1]}",
                      "control_video": gen["control"][k]["video"]["path"],
                      "treatment_video": gen[treatment][k]["video"]["path"]})
    return tail.statement(per_prompt, worst, margin, level)


def diagnostics(cell: Cell) -> list[str]:
    """Where a cell's data lie outside what the procedure was checked for: skewness beyond
    ``SKEW_CHECKED``, or quantised values (half or more of the prompts on one value)."""
    out = []
    if cell.skew is not None and abs(cell.skew) > SKEW_CHECKED:
        out.append(f"skewness {cell.skew:.2f} is beyond the +-{SKEW_CHECKED:g} the procedure was checked for; "
                   "read the interval with care")
    if cell.n >= 3 and not cell.flat:
        values, counts = np.unique(cell.x, return_counts=True)
        if counts.max() * 2 >= cell.n:
            out.append(f"quantised: {counts.max()} of {cell.n} prompts share the value {values[counts.argmax()]:.4g}; "
                       "the exact sign-flip test joins the union, and the interval rests on the few that differ")
    return out


def decide(cells: Pending, s: StatsSpec) -> int:
    """Adjust every tested cell as one family (``s.multiplicity``), then give each its
    interval at its adjusted level, its verdict read from that interval and its planning.
    Returns the family's size."""
    tested = [(m, p) for m, _cell, q, _v in cells if q is not None and (p := m["p_value"]) is not None]
    adjusted, levels = family_levels([p for _m, p in tested], 1 - s.level, s.multiplicity)
    alpha = {id(m): (p, a) for (m, _p), p, a in zip(tested, adjusted, levels, strict=True)}
    for m, cell, q, values in cells:
        p_adj, level_alpha = alpha.get(id(m), (None, 1 - s.level))
        lo, hi, why = cell.interval(1 - level_alpha)
        m["ci"], m["ci_level"], m["ci_note"], m["p_adjusted"] = [lo, hi], 1 - level_alpha, why, p_adj
        if m["kind"] == "FR" and cell.n == 0:
            m["verdict_detail"] = "value only: every pair is bit-identical to control"
            continue
        if q is None:
            m["verdict_detail"] = ("value only; declare a floor under stats/floors for a verdict"
                                   if m["kind"] == "FR" else None)
            continue
        code, m["verdict_detail"], rests_on = verdict(cell, q, level_alpha, s.power)
        m["verdict_code"], m["verdict"] = code, PHRASES[code]
        m["p_verdict"], m["p_verdict_test"], in_family = _p_verdict(cell, q, rests_on, p_adj, level_alpha,
                                                                    1 - s.level)
        m["p_verdict_family"] = None if in_family is None else family_label(
            in_family, MULTIPLICITY_NAMES.get(s.multiplicity, s.multiplicity), len(tested))
        m["verdict_rests_on"] = [_test_name(q, mu) for mu in rests_on]
        m["planning"] = _planning(cell, q, values, level_alpha, s)
    return len(tested)


def _test_name(q: Question, mu: float) -> str:
    """What the test of "mean = mu" asks, in the words of the cell's question."""
    if mu == q.null:
        return {"difference": "difference from 0", "margin": f"non-inferiority (loss = margin {q.margin:g})",
                "floor": f"floor (mean value = {q.floor:g})"}[q.kind]
    if mu == 0:
        return "difference from 0"
    return f"equivalence's upper edge (gain = margin {q.margin:g})"


def _p_verdict(cell: Cell, q: Question, rests_on: list[float], p_adj: float | None, alpha_cell: float,
               alpha: float) -> tuple[float | None, str | None, bool | None]:
    """(p, test, in the family) of the test that decided a verdict word: of the tests it
    rests on, the one with the largest p (every one of them must reject for a claim). The
    cell's own question is in the family and has its adjusted p; a second value read from
    the same interval (0 for superior or worse, +margin for equivalent) is tested outside
    the family at the cell's level, its raw p scaled to it, min(1, p * alpha / alpha_cell),
    so that it too is below alpha exactly when the interval excludes that value. Equal p
    (the sign-flip test's steps decide both on quantised data) name the cell's own question,
    the one the family's adjustment covers. (None, None, None) where no test was run (fewer
    than 2 prompts, zero spread)."""
    tests: list[tuple[float, bool, str]] = []
    for mu in rests_on:
        if mu == q.null:
            p = p_adj
        else:
            raw = cell.p(mu)
            p = None if raw is None else min(1.0, raw * alpha / alpha_cell)
        if p is not None:
            tests.append((p, mu == q.null, _test_name(q, mu)))
    if not tests:
        return None, None, None
    p_max, in_family, name = max(tests)  # the largest p; at a tie, the test in the family
    return p_max, name, in_family


def _planning(cell: Cell, q: Question, values: dict[Key, float], alpha: float, s: StatsSpec) -> Planning:
    """Sample size from this study as a pilot, carrying the pilot's uncertainty: the
    per-prompt SD and its one-sided upper bound (``SD_UPPER_CONFIDENCE``), the effect
    detectable at this n (t-test), the prompts needed to show non-inferiority at the margin
    if the true difference is 0, and the seed vs prompt split of the per-prompt mean's
    variance with the answer to "more prompts or more seeds?". Prompts needed: simulated
    studies analysed by the union test itself, drawn as a smoothed bootstrap of this cell's
    values (``planning``), their SD drawn around this one (its uncertainty), and, the larger
    N, on a loss tail of skewness 2 at that SD (``planning``'s stressed model); again with
    the SD fixed at its upper bound."""
    sd = cell.sd if cell.n > 1 else None
    up = sd_upper(sd, cell.n) if sd is not None else None
    target = q.margin if q.kind == "margin" else None
    var_prompt, var_seed, k = variance_split(values)
    if var_prompt is None or var_seed is None:
        advice = "add prompts (one seed per prompt: a second seed would split seed from prompt variance)"
    elif var_prompt >= var_seed:
        advice = "add prompts (prompt-to-prompt variation dominates; more seeds cannot shrink it)"
    else:
        advice = "add seeds (seed noise dominates; more seeds per prompt shrink it on the same panel)"

    def need(sd_: float | None) -> int | None:
        if sd_ is None or target is None:
            return None
        # A new study whose true difference is 0, shaped as this one: the smallest N at which the union
        # test shows non-inferiority at the margin with probability s.power (simulated, inference.plan_prompts).
        return plan_prompts(cell, 0.0, -q.sign * target, alpha, s.power, start=min_prompts(alpha, cell.quantised),
                            scale=None if sd_ == sd else sd_ / sd if sd else None, seed=s.seed).prompts

    return {"sd_prompt": sd, "sd_upper": up, "sd_upper_confidence": SD_UPPER_CONFIDENCE, "power": s.power,
            "target_effect": target,
            "detectable_effect": None if sd is None else detectable_effect(sd, cell.n, 1 - alpha, s.power),
            "prompts_needed": need(sd), "prompts_needed_upper": need(up),
            "var_prompt": var_prompt, "var_seed": var_seed, "seeds_per_prompt": k, "advice": advice}


def _small_n_notes(metrics: list[MetricResult], level: float) -> list[str]:
    """Say where a prompt count is too small for any interval, or for the sign-flip test
    (and so the union test) to reach the level."""
    out = []
    by_n: dict[int, list[str]] = defaultdict(list)
    for m in metrics:
        by_n[m["n_prompts"]].append(m["metric"])
    for n, names in sorted(by_n.items()):
        if n < 2:
            out.append(f"n={n} prompt ({', '.join(names)}): no interval and no test; add prompts")
        elif n <= SIGNFLIP_ALWAYS_UP_TO and signflip_min_p(n) >= 1 - level:
            out.append(f"n={n} prompts ({', '.join(names)}): at {SIGNFLIP_ALWAYS_UP_TO} prompts or fewer no shape can "
                       f"be checked, so the exact sign-flip test decides; its smallest attainable p = "
                       f"{signflip_min_p(n):.3g}, so no test here can reach p < {1 - level:.2g} and intervals are "
                       "unbounded; add prompts")
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
    """Every treatment against control, every (arm, metric) test one multiplicity family.
    Result is independent of record order."""
    check_streams(gen_records)
    gen, scores, timings = index(gen_records), index(score_records), index(timing_records)
    if "control" not in gen:
        raise PairingError("no control records; the control arm must be generated")
    comparisons, cells = [], []
    for t in treatments:
        comparison, pending = _compare(gen, scores, timings, t, s)
        comparisons.append(comparison)
        cells += pending
    family = decide(cells, s)
    return {"estimand": ESTIMAND, "procedure": PROCEDURE, "level": s.level, "resamples": s.resamples,
            "seed": s.seed, "missing_policy": s.missing, "power": s.power, "multiplicity": s.multiplicity,
            "family_size": family, "comparisons": comparisons}


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
