"""Paired statistics: treatment against control, with intervals and honest refusals.

Estimand. The unit of analysis is the (prompt, seed) pair: both arms were generated
from the same random stream. Per prompt, the treatment-minus-control difference is
averaged over seeds; the estimand is the mean of those per-prompt differences over the
panel's prompts (prompts are the sampled population; seeds are repeated measures).
Intervals come from a bootstrap that resamples prompts; the test is a paired sign-flip
permutation test over prompts; p-values are Holm-adjusted across a comparison's
metrics. Speedup is the geometric mean over prompts of the per-prompt geometric mean
(over seeds) of control/treatment latency. Nothing depends on the number of workers,
shards or the order records arrive in: inputs are sorted by pair key first.

Imports without torch.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import IntegrityError, PairingError

ESTIMAND = ("unit: (prompt, seed) pair; per prompt, mean over seeds of treatment - control; "
            "summary: mean over prompts; CI: percentile bootstrap resampling prompts; "
            "test: paired sign-flip permutation over prompts, Holm-adjusted across metrics")
COMPARABLE = (("model", ("model", "weights")), ("encoder fingerprint", ("encoder", "fingerprint", "digest")),
              ("encoder recipe", ("encoder", "recipe_digest")), ("frames", ("generation", "frames")),
              ("height", ("generation", "height")), ("width", ("generation", "width")),
              ("steps", ("generation", "steps")))
"""Fields on which a treatment's records must equal their control's to be compared."""


@dataclass(frozen=True)
class StatsSettings:
    resamples: int
    level: float
    seed: int
    missing: str = "error"


def _get(record: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        record = record[key]
    return record


def _per_prompt(values: dict[tuple[str, int], float]) -> np.ndarray:
    by_prompt: dict[str, list[float]] = defaultdict(list)
    for (prompt, _seed), v in sorted(values.items()):
        by_prompt[prompt].append(v)
    return np.array([np.mean(v) for _p, v in sorted(by_prompt.items())], dtype=np.float64)


def _bootstrap_ci(x: np.ndarray, s: StatsSettings) -> tuple[float, float]:
    from scipy.stats import bootstrap

    if len(x) < 2 or np.all(x == x[0]):
        return (float(x.mean()), float(x.mean()))  # no spread: the interval is the point
    res = bootstrap((x,), np.mean, n_resamples=s.resamples, confidence_level=s.level,
                    method="percentile", rng=np.random.default_rng(s.seed))
    return (float(res.confidence_interval.low), float(res.confidence_interval.high))


def _signflip_p(x: np.ndarray, s: StatsSettings) -> float:
    from scipy.stats import permutation_test

    if len(x) < 2 or np.all(x == 0):
        return 1.0
    res = permutation_test((x,), np.mean, permutation_type="samples", n_resamples=s.resamples,
                           alternative="two-sided", rng=np.random.default_rng(s.seed))
    return float(res.pvalue)


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


def _check_comparable(ctrl: dict[str, Any], treat: dict[str, Any]) -> None:
    for label, path in COMPARABLE:
        a, b = _get(ctrl, path), _get(treat, path)
        if a != b:
            raise PairingError(
                f"arms {ctrl['arm']['name']!r} and {treat['arm']['name']!r} are not comparable: "
                f"{label} differs for prompt {ctrl['candidate']['prompt_id']} seed "
                f"{ctrl['candidate']['seed']}: {a!r} vs {b!r}; regenerate both arms with one setup")


Index = dict[str, dict[tuple[str, int], dict[str, Any]]]


def compare(gen: Index, scores: Index, timings: Index, treatment: str, s: StatsSettings) -> dict[str, Any]:
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
    flags = []
    if all(gen["control"][k]["video"]["digest"] == gen[treatment][k]["video"]["digest"] for k in keys):
        flags.append("no effect: the arm did not change the computation")
    scoring = _scoring_setup([scores[a][k] for a in ("control", treatment) for k in keys if k in scores.get(a, {})])
    metrics = []
    names = sorted(set().union(*(scores[treatment][k]["scores"] for k in keys)))
    for name in names:
        subset = _static_subset(scores, treatment, keys, name, notes)
        if not subset:
            continue
        spec = scores[treatment][subset[0]]["scores"][name]["spec"]
        t = {k: scores[treatment][k]["scores"][name]["value"] for k in subset}
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
        lo, hi = _bootstrap_ci(diff, s)
        metrics.append({"metric": name, "kind": spec["kind"], "higher_is_better": spec["higher_is_better"],
                        "n_pairs": len(subset),
                        "control_mean": c_mean, "treatment_mean": t_mean,
                        "diff": None if spec["kind"] == "FR" else float(diff.mean()),
                        "ci": [lo, hi], "p_value": None if spec["kind"] == "FR" else _signflip_p(diff, s),
                        "win_rate": wins})
    tested = [m for m in metrics if m["p_value"] is not None]
    for m, p in zip(tested, holm([m["p_value"] for m in tested]), strict=True):
        m["p_holm"] = p
    for arm in ("control", treatment):
        absent = [k for k in keys if k not in timings.get(arm, {})]
        if absent:
            raise PairingError(f"{arm}: no timed-pass latency for prompt {absent[0][0]} seed {absent[0][1]} "
                               "(and maybe others); latency is reported only from the timed pass, rerun it")
    # A timed run that computed other frames than the bulk run timed another computation:
    # that pair's latency is dropped (and said so), never reported.
    differ = [k for k in keys if any(timings[a][k].get("matches_bulk_frames") is not True
                                     for a in ("control", treatment))]
    timed = [k for k in keys if k not in differ]
    if differ:
        notes.append(f"latency: {len(differ)} of {len(keys)} pair(s) dropped because the timed run's frames differ "
                     f"from the bulk run's (e.g. {differ[0][0]} seed {differ[0][1]}); see pairflow verify")
    if not timed:
        raise PairingError(f"{treatment}: no pair has a timed run that computed the bulk run's frames; latency "
                           "cannot be reported. Rerun the timed pass on the same stack as the bulk run")
    lat_c = {k: timings["control"][k]["timing"]["latency_s"] for k in timed}
    lat_t = {k: timings[treatment][k]["timing"]["latency_s"] for k in timed}
    log_ratio = _per_prompt({k: math.log(lat_c[k] / lat_t[k]) for k in timed})
    lo, hi = _bootstrap_ci(log_ratio, s)
    return {
        "treatment": treatment, "n_prompts": len({k[0] for k in keys}), "n_pairs": len(keys),
        "flags": flags, "notes": notes, "metrics": metrics, "scoring": scoring,
        "latency": {"pass": sorted({timings[a][k]["timing"]["pass"] for a in ("control", treatment) for k in keys}),
                    "n_pairs": len(timed), "dropped_frames_differ": len(differ),
                    "control_median_s": float(np.median(list(lat_c.values()))),
                    "treatment_median_s": float(np.median(list(lat_t.values())))},
        "speedup": {"geomean": float(math.exp(log_ratio.mean())),
                    "ci": [float(math.exp(lo)), float(math.exp(hi))]},
    }


def _static_subset(scores: Index, treatment: str, keys: list[Any], name: str, notes: list[str]) -> list[Any]:
    """The pairs a metric is analysed on. For a score flagged with VBench's static filter
    (``static``, written under ``scoring/static_filter: intersection``), only pairs whose
    control and treatment videos are both static: the same subset for both arms."""
    flags = [(scores["control"][k]["scores"].get(name, {}).get("static"),
              scores[treatment][k]["scores"][name].get("static")) for k in keys]
    if all(c is None and t is None for c, t in flags):
        return keys
    if any(c is None or t is None for c, t in flags):
        raise PairingError(f"{treatment}: {name} carries the static flag for some videos only; rescore the panel")
    kept = [k for k, (c, t) in zip(keys, flags, strict=True) if c and t]
    notes.append(f"{name}: {len(kept)} of {len(keys)} pairs where both videos are static (VBench RAFT static "
                 "filter, intersection of the arms)" + ("; not analysed" if not kept else ""))
    return kept


def _scoring_setup(score_records: list[dict[str, Any]]) -> dict[str, Any]:
    """How both arms were scored. Raises PairingError when the arms' score records come
    from different scorer builds (code, weights, device, precision or process layout):
    a paired difference must not mix scorers."""
    builds = {r.get("scorer", {}).get("digest") for r in score_records}
    if len(builds) > 1:
        raise PairingError(f"score records of one comparison come from {len(builds)} different scorer builds "
                           f"({sorted(str(b) for b in builds)}); rescore the panel so both arms share one build "
                           "(snakemake --forcerun score_panel)")
    first = score_records[0] if score_records else {}
    return {"scorer_build": next(iter(builds), None),
            "weights_origin": first.get("scorer", {}).get("weights_origin"),
            "device": first.get("scorer", {}).get("device"), "precision": first.get("scorer", {}).get("precision"),
            "compared_frames": sorted({str(r.get("compared_frames")) for r in score_records}),
            "static_filter": sorted({str(r.get("static_filter", {}).get("temporal_flickering", "none"))
                                     for r in score_records})}


def index(records: list[dict[str, Any]]) -> Index:
    """Group records by arm and (prompt id, seed); a duplicate key is an error.

    Keys include the panel so a study-level index keeps panels apart.
    """
    out: Index = defaultdict(dict)
    for r in records:
        cand = r["candidate"]
        key = (f"{cand['panel']}/{cand['prompt_id']}", int(cand["seed"]))
        arm = r["arm"]["name"]
        if key in out[arm]:
            raise PairingError(f"two records for arm {arm} prompt {key[0]} seed {key[1]}; "
                               "a candidate must be counted once")
        out[arm][key] = r
    return dict(out)


def analyse(gen_records: list[dict[str, Any]], score_records: list[dict[str, Any]],
            timing_records: list[dict[str, Any]], treatments: list[str], s: StatsSettings) -> dict[str, Any]:
    """Every treatment against control. Result is independent of record order."""
    check_streams(gen_records)
    gen, scores, timings = index(gen_records), index(score_records), index(timing_records)
    if "control" not in gen:
        raise PairingError("no control records; the control arm must be generated")
    return {"estimand": ESTIMAND, "level": s.level, "resamples": s.resamples, "seed": s.seed,
            "missing_policy": s.missing,
            "comparisons": [compare(gen, scores, timings, t, s) for t in treatments]}


def noise_flags(stats: dict[str, Any], floors: dict[str, dict[str, Any]]) -> list[str]:
    """Say, per treatment and metric, whether a paired difference is within the noise
    floor measured by repeatability reruns (max range of a candidate's score across
    runs). A difference whose whole interval lies inside ±floor is indistinguishable
    from rerunning the control."""
    out = []
    for c in stats["comparisons"]:
        for m in c["metrics"]:
            floor = floors.get(m["metric"], {}).get("max_range")
            if floor is None or m["diff"] is None:
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


def check_streams(records: list[dict[str, Any]]) -> None:
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
