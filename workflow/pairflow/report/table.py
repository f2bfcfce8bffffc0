"""The Markdown study table: every cell a paired estimate with its interval.

Imports without torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from html import escape
from typing import Any

from ..analysis import looks, tail
from ..analysis.inference import MULTIPLICITY_NAMES
from ..analysis.stats import NO_EFFECT
from ..analysis.verdicts import PHRASES, colour_verdicts, verdict_text
from ..records.store import IDENTICAL
from ..records.types import Comparison, ComputeSummary, MetricResult, StudyStats


def _fmt(x: float | None, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}g}"


def direction(higher_is_better: bool) -> str:
    """How a metric's numbers read, for headers and plot titles."""
    return "higher is better" if higher_is_better else "lower is better"


UNITS = {"psnr": "dB"}
"""Metrics whose values carry a unit (pyiqa's metric table records direction and range,
not units); every other metric is a unitless score."""


def metric_header(name: str, kind: str, higher_is_better: bool) -> str:
    """A metric column's header: what the number is, its unit, its interval and which way
    is better, e.g. ``ssim vs control [CI], higher is better``."""
    unit = f" ({UNITS[name]})" if name in UNITS else ""
    what = f"{name} vs control{unit}" if kind == "FR" else f"{name}: treatment − control{unit}"
    return f"{what} [CI], {direction(higher_is_better)}"


def column_decimals(ms: list[MetricResult]) -> int:
    """One fixed number of decimals for a column: two significant digits of its narrowest
    interval's half-width (1 to 6), so every estimate in the column reads alike and no
    digit is shown that the interval does not support."""
    halves = [(hi - lo) / 2 for lo, hi in (m["ci"] for m in ms) if lo is not None and hi is not None and hi > lo]
    if not halves:
        return 4
    return max(1, min(6, 1 - math.floor(math.log10(min(halves)))))


def estimate(m: MetricResult, d: int) -> str:
    """A metric's point estimate (difference, or value for FR metrics) and its interval at
    ``d`` fixed decimals: ``0.0123 [0.0101, 0.0145]``."""
    point = m["diff"] if m["diff"] is not None else m["treatment_mean"]
    lo, hi = m["ci"][0], m["ci"][1]
    out = "n/a" if point is None else f"{point:.{d}f}"
    return out + (" [no interval]" if lo is None or hi is None else f" [{lo:.{d}f}, {hi:.{d}f}]")


def cell(m: MetricResult, level: float, decimals: int | None = None, method: str = "holm") -> str:
    """One metric's cell: the verdict with the p of the test that decided it and that
    test's family (``verdicts.verdict_text``), the paired difference (value, for FR
    metrics) with its interval at the family-adjusted level (``decimals`` fixed decimals;
    default: the cell's own), the wins / ties / losses over prompts, and a warning where
    the prompt count is too small for the sign-flip test to reach the level. ``method`` is
    kept for callers; the family is named in the verdict."""
    out = (f"{verdict_text(m)}: " if m.get("verdict_code") else "") + estimate(
        m, column_decimals([m]) if decimals is None else decimals)
    if m.get("wins") is not None:
        out += f", W/T/L {m['wins']}/{m['ties']}/{m['losses']}"
    if m.get("n_identical_pairs"):
        out += f", {identical_note(m)}"
    n, min_p = m.get("n_prompts"), m.get("signflip_min_p")
    if m.get("p_value") is not None and n is not None and min_p is not None and min_p >= 1 - level:
        out += f"; n={n}: smallest attainable sign-flip p = {min_p:.3g}"
    if m.get("diagnostics"):
        out += " ⚠"
    return out


def identical_note(m: Mapping[str, Any]) -> str:
    """How every view counts a fidelity cell's identical pairs (``records.identical_to_control``;
    only FR cells count them, ``records.in_fidelity_mean``), e.g. ``2 of 5 pairs
    identical to control, left out of the mean``; empty where none is."""
    k = m.get("n_identical_pairs") or 0
    return f"{k} of {m['n_pairs']} pairs {IDENTICAL}, left out of the mean" if k else ""


def table(stats: StudyStats) -> tuple[list[str], list[list[str]]]:
    """The paper-style table: a header and one row per treatment, every cell a paired
    estimate with its interval."""
    metric_names = sorted({m["metric"] for c in stats["comparisons"] for m in c["metrics"]})
    hib = {m["metric"]: m["higher_is_better"] for c in stats["comparisons"] for m in c["metrics"]}
    kinds = {m["metric"]: m["kind"] for c in stats["comparisons"] for m in c["metrics"]}
    head = ["arm", "pairs", "latency ctrl / treat (s, geometric mean)", "speedup [CI], higher is faster",
            "compute ratio [CI], lower is cheaper",
            "timed pairs × repeats (design); repeat CV ctrl / treat (median; pairs over max)"] + [
        metric_header(n, kinds[n], hib[n]) for n in metric_names]
    # Estimated MFU and peak memory only where some arm has them; otherwise a note says why.
    eff = any(_has_efficiency(c) for c in stats["comparisons"])
    if eff:
        head.insert(5, "est. MFU ctrl / treat; peak device memory ctrl / treat (GiB)")
    decimals = {n: column_decimals([m for c in stats["comparisons"] for m in c["metrics"] if m["metric"] == n])
                for n in metric_names}
    rows = []
    for c in stats["comparisons"]:
        by = {m["metric"]: m for m in c["metrics"]}
        lat = c["latency"]
        # An arm whose videos equal control's bit for bit, or whose cache never skipped,
        # changed nothing: say so in its row, not only in the notes.
        no_effect = any(f.startswith(NO_EFFECT) for f in c["flags"])
        cells = [c["treatment"] + (f" ({NO_EFFECT})" if no_effect else ""), str(c["n_pairs"]),
                 f"{_fmt(lat.get('control_geomean_s'), 3)} / {_fmt(lat.get('treatment_geomean_s'), 3)}",
                 ratio(c["speedup"]["geomean"], c["speedup"]["ci"], c["speedup"].get("ci_note")),
                 compute_cell(c.get("compute")),
                 (f"{timed_cell(lat)}; {_pct(lat.get('control_cv_median'))} / "
                  f"{_pct(lat.get('treatment_cv_median'))}; {lat.get('pairs_over_max_cv', 0)}")]
        if eff:
            e = c["efficiency"]
            cells.insert(5, f"{_mfu(e['control']['mfu_median'])} / {_mfu(e['treatment']['mfu_median'])}; "
                            f"{_gib(e['control']['peak_memory_gib'])} / {_gib(e['treatment']['peak_memory_gib'])}")
        for n in metric_names:
            m = by.get(n)
            cells.append("" if m is None else cell(m, stats["level"], decimals[n], stats["multiplicity"]))
        rows.append(cells)
    return head, rows


def timed_cell(lat: dict[str, Any] | Any) -> str:
    """What the timed pass timed for a comparison: pairs × repeats per candidate, and the
    design (sequential: where it stopped; a sample; or every pair)."""
    reps = "/".join(str(r) for r in lat.get("repeats", [])) or "?"
    d = lat.get("design") or {}
    if d.get("design") == "stein-two-stage":
        how = f"sequential, {d.get('pilot_prompts')}-prompt pilot, stopped: {', '.join(d.get('stopped', []))}"
    elif lat.get("sampled_pairs", lat.get("n_pairs")) != lat.get("n_pairs") or d.get("pairs", ["all"]) != ["all"]:
        how = f"sample: timing/pairs {', '.join(d.get('pairs', []))}"
    else:
        how = "every pair"
    # each timed run repeats its bulk run (same seed, same arm): pairs whose frames matched both
    same = f"bulk frames reproduced {lat.get('n_pairs')}/{lat.get('sampled_pairs', lat.get('n_pairs'))}"
    return f"{lat.get('n_pairs')} × {reps} ({how}; {same})"


def _has_efficiency(c: Comparison) -> bool:
    e = c.get("efficiency")
    return bool(e) and any(e[a]["mfu_median"] is not None or e[a]["peak_memory_gib"] is not None
                           for a in ("control", "treatment"))


def _mfu(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _gib(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _efficiency_notes(stats: StudyStats) -> list[str]:
    """The estimated MFU's convention where the table shows it, and each distinct reason an
    arm has none (one line naming the arms, not a column of dashes)."""
    out = []
    if any(_has_efficiency(c) for c in stats["comparisons"]):
        gpus = sorted({f"{e['gpu']} ({e['peak_tflops']:g} TFLOP/s)" for c in stats["comparisons"]
                       for e in (c["efficiency"]["control"], c["efficiency"]["treatment"]) if e["gpu"]})
        out.append(f"'est. MFU' is {_convention(stats)}; peak: {', '.join(gpus) or 'n/a'}.")
    why: dict[str, list[str]] = {}
    for c in stats["comparisons"]:
        e = c.get("efficiency")
        for a, label in ((e["control"], "control"), (e["treatment"], c["treatment"])) if e else ():
            if a["absent"] and label not in why.setdefault(a["absent"], []):
                why[a["absent"]].append(label)
    out += [f"{', '.join(arms)}: {text}" for text, arms in why.items()]
    return out


def _convention(stats: StudyStats) -> str:
    return next(c["efficiency"]["convention"] for c in stats["comparisons"] if c.get("efficiency"))


def ratio(point: float, ci: list[float | None], note: str | None = None) -> str:
    """A ratio with its interval: ``1.234× [1.1, 1.4]``; ``[no CI: zero spread]`` where the
    statistics' reason (``note``) is zero spread, ``[no CI]`` otherwise (the notes say why)."""
    if ci[0] is None or ci[1] is None:
        return f"{point:.3f}× [no CI{': zero spread' if note and 'zero spread' in note else ''}]"
    return f"{point:.3f}× [{ci[0]:.3f}, {ci[1]:.3f}]"


def compute_cell(compute: ComputeSummary | None) -> str:
    """The compute ratio cell: treatment / control FLOPs with its interval and the block
    forwards the arm skipped; ``n/a`` for records without compute counts."""
    if not compute:
        return "n/a"
    skipped = compute["blocks_skipped"]
    total = skipped + compute["blocks_computed"]
    return ratio(compute["ratio"], compute["ci"], compute.get("ci_note")) + f"; skipped {skipped}/{total} blocks"


def pareto(stats: StudyStats) -> tuple[list[str], list[list[str]]]:
    """Quality against cost, one row per arm: its kinds of change, compute ratio [CI],
    measured speedup [CI], and each NR metric's paired difference [CI] (FR metrics: the
    value against control). ``front`` names the metrics on which no other arm (control
    included, at ratio 1 and Δ 0) is at least as cheap and strictly better."""
    metric_names = sorted({m["metric"] for c in stats["comparisons"] for m in c["metrics"]})
    ms = {n: [m for c in stats["comparisons"] for m in c["metrics"] if m["metric"] == n] for n in metric_names}
    decimals = {n: column_decimals(ms[n]) for n in metric_names}  # one format per column, as in the table
    head = (["arm", "kinds", "compute ratio [CI], lower is cheaper", "speedup [CI], higher is faster"]
            + [metric_header(n, ms[n][0]["kind"], ms[n][0]["higher_is_better"]) for n in metric_names]
            + ["Pareto front (compute ratio vs metric)"])
    rows = []
    for c in stats["comparisons"]:
        by = {m["metric"]: m for m in c["metrics"]}
        front = [n for n in metric_names if n in by and on_front(stats, c["treatment"], n)]
        rows.append([c["treatment"] + (f" ({NO_EFFECT})" if any(f.startswith(NO_EFFECT) for f in c["flags"]) else ""),
                     ", ".join(c.get("kinds", [])) or "n/a", compute_cell(c.get("compute")),
                     ratio(c["speedup"]["geomean"], c["speedup"]["ci"], c["speedup"].get("ci_note"))]
                    + [("" if n not in by else estimate(by[n], decimals[n])) for n in metric_names]
                    + [", ".join(front) or "none"])
    return head, rows


def _point(m: MetricResult) -> float:
    point = m["diff"] if m["diff"] is not None else m["treatment_mean"]
    return float("nan") if point is None else point


def on_front(stats: StudyStats, arm: str, metric: str) -> bool:
    """Whether ``arm`` is Pareto-optimal for ``metric`` against compute ratio: no other
    arm (control: ratio 1, Δ 0; NR metrics only for control) is at least as cheap and at
    least as good with one of the two strictly. Point estimates; read with the intervals."""
    points = {}
    for c in stats["comparisons"]:
        m = next((m for m in c["metrics"] if m["metric"] == metric), None)
        compute = c["compute"]
        if m is None or not compute:
            continue
        sign = 1 if m["higher_is_better"] else -1
        points[c["treatment"]] = (compute["ratio"], sign * _point(m))
        if m["kind"] == "NR":
            points["control"] = (1.0, 0.0)
    if arm not in points:
        return False
    cost, good = points[arm]
    return not any(o != arm and oc <= cost and og >= good and (oc < cost or og > good)
                   for o, (oc, og) in points.items())


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def planning(stats: StudyStats) -> tuple[list[str], list[list[str]]]:
    """Sample size from this study as a pilot, per arm and tested metric: per-prompt SD and
    its upper confidence bound, the effect detectable at this prompt count, the prompts
    needed to show non-inferiority at the margin (at the SD and at its bound), and the
    prompt vs seed share of the variance with the answer "add prompts" or "add seeds"."""
    power = stats.get("power", 0.8)
    head = ["arm", "metric", "prompts", "sd per prompt (80% upper bound)", f"detectable Δ ({power:.0%} power)",
            "margin", "prompts needed (at sd / at upper bound)", "variance: prompts / seeds", "next study"]
    rows = []
    for c in stats["comparisons"]:
        for m in c["metrics"]:
            pl = m.get("planning")
            if not pl:
                continue

            def need(x: int | None, pl: Any = pl) -> str:
                return "n/a" if pl["target_effect"] is None else "over 100000" if x is None else str(x)

            vp, vs = pl["var_prompt"], pl["var_seed"]
            total = (vp or 0.0) + (vs or 0.0)
            split = "n/a" if vp is None or vs is None or total == 0 else f"{vp / total:.0%} / {vs / total:.0%}"
            rows.append([c["treatment"], m["metric"], str(m["n_prompts"]),
                         f"{_fmt(pl['sd_prompt'])} ({_fmt(pl['sd_upper'])})", _fmt(pl["detectable_effect"]),
                         _fmt(pl["target_effect"]),
                         f"{need(pl['prompts_needed'])} / {need(pl['prompts_needed_upper'])}",
                         split, pl["advice"]])
    return head, rows


def verdicts(stats: StudyStats) -> tuple[list[str], list[list[str]]]:
    """One row per (arm, metric): the question, the estimate with its interval at the
    family-adjusted level, relative (% of control) and standardised effect, wins / ties /
    losses over prompts, raw and adjusted p, the sign-flip p and skewness beside them, the
    verdict and why, and where the data lie outside what the procedure was checked for."""
    method = MULTIPLICITY_NAMES.get(stats.get("multiplicity", "holm"), "Holm")
    head = ["arm", "metric", "question", "estimate [CI] (level)", "% of control", "standardised",
            "wins / ties / losses (prompts)", "verdict (p of the deciding test: test, family)",
            f"the question's test: p raw → {method}", "sign-flip p", "skewness", "verdict rests on", "why",
            "diagnostics"]
    rows = []
    for c in stats["comparisons"]:
        for m in c["metrics"]:
            d = column_decimals([m])
            question = m["hypothesis"] or "value only"
            if m["kind"] == "FR" and m["n_identical_pairs"]:
                question += f" ({identical_note(m)})"
            level = f" ({m['ci_level']:.3g})" + (f"; {m['ci_note']}" if m.get("ci_note") else "")
            wtl = "n/a" if m["wins"] is None else f"{m['wins']} / {m['ties']} / {m['losses']}"
            rows.append([c["treatment"], m["metric"], question, estimate(m, d) + level,
                         "n/a" if m["relative_effect"] is None else f"{m['relative_effect']:+.1%}",
                         _fmt(m["standardised_effect"], 2), wtl, verdict_text(m),
                         f"{_fmt(m['p_value'], 2)} → {_fmt(m['p_adjusted'], 2)}", _fmt(m["p_signflip"], 2),
                         _fmt(m["skewness"], 2),
                         "; ".join(m.get("verdict_rests_on") or []) or "n/a",
                         m["verdict_detail"] or "",
                         "; ".join(m["diagnostics"]) or "none"])
    return head, rows


def tails(stats: StudyStats, link: Any = None) -> tuple[list[str], list[list[str]]]:
    """One row per (arm, metric) with a margin: how many prompts lost more than the margin
    with the exact upper bound of the share that could, the worst prompts (loss, and
    ``link(label, anchor)`` to their pair in the gallery; Markdown links by default),
    whether the cell is flagged (an outlying prompt), and the prompts that would bound the
    breaking share."""
    def md(label: str, anchor: str) -> str:
        return f"[{label}]({GALLERY_LINK}#{anchor})"

    link = link or md
    head = ["arm", "metric", "prompts losing more than the margin (exact upper bound)",
            "worst prompts (loss; pair in the gallery)", "outlying prompt (robust z)", "prompts to bound the share"]
    rows = []
    for c in stats["comparisons"]:
        for m in c["metrics"]:
            t = m.get("tail")
            if not t:
                continue
            worst = ", ".join(f"{link(w['prompt'] + ' s' + str(w['seed']), w['anchor'])} {w['loss']:+.4g}"
                              for w in t["worst"])
            z = "n/a" if t["outlier_z"] is None else f"{t['outlier_z']:.1f}"
            rows.append([c["treatment"], m["metric"], tail.sentence(t), worst,
                         ("yes ⚠ " if t["flag"] else "no ") + f"({z})", tail.to_bound(t)])
    return head, rows


_TAILS_TEXT = ("A test of the mean cannot see a failure the sample did not draw. Per metric with a margin: the prompts "
               "whose loss (mean over seeds, in the metric's bad direction) exceeds the margin, and the exact "
               "Clopper-Pearson upper bound of the share of prompts that could (the upper end of the two-sided "
               "interval at the study's level, not adjusted across cells); the worst prompts, linked to their worst "
               "pair in the gallery; a flag where the worst loss lies more than "
               f"{tail.OUTLIER_Z:g} robust SDs (1.4826 MAD) beyond the median (the mean's interval was checked for "
               "normal, t3 and |skewness| <= 2 values, not this); and how many prompts, none of the added ones "
               f"breaking, would bound the breaking share below {tail.TAIL_SHARE:.0%}.")


def _html_tails(stats: StudyStats, esc: Any) -> list[str]:
    head, rows = tails(stats, lambda label, anchor: f"<a href='{esc(GALLERY_LINK)}#{esc(anchor)}'>{esc(label)}</a>")
    if not rows:
        return []
    # cells are escaped here, except the worst-prompts column, whose links were escaped as built
    return [f"<h2>Tails: what the prompts rule out</h2><p>{esc(_TAILS_TEXT)}</p><table><tr>",
            "".join(f"<th>{esc(h)}</th>" for h in head), "</tr>",
            *("<tr>" + "".join(f"<td>{c if i == 3 else esc(c)}</td>" for i, c in enumerate(r)) + "</tr>"
              for r in rows), "</table>"]


def _arm_notes(stats: StudyStats) -> list[str]:
    """Each arm's flags and notes, one line per distinct text naming every arm it holds
    for (three arms with the same timing-noise warning make one line, not three)."""
    arms: dict[str, list[str]] = {}
    for c in stats["comparisons"]:
        cp = c.get("compute")
        ratios = [c["speedup"].get("ci_note"), cp.get("ci_note") if cp else None]
        for f in c["flags"] + c["notes"] + [r for r in ratios if r]:
            arms.setdefault(f, [])
            if c["treatment"] not in arms[f]:
                arms[f].append(c["treatment"])
    return [f"{', '.join(names)}: {text}" for text, names in arms.items()]


def answer(stats: StudyStats) -> list[str]:
    """The answer first, one line per treatment arm: the speedup with its interval, the
    compute ratio, then each metric's verdict with the p of the test that decided it
    (``verdicts.verdict_text``; ``value only`` where a metric has no question, e.g. an FR
    metric without a floor) and the estimate and interval it rests on, e.g. ``fbcache:
    1.38× faster [1.24, 1.54], compute 0.58× control; temporal_flickering worse,
    non-inferiority not shown (p 0.003: difference from 0, outside the family, scaled to
    this cell's Holm level), Δ -0.0036 [-0.0046, -0.0027]; psnr value only, 12.8 dB [12.7,
    12.9]``."""
    out = []
    for c in stats["comparisons"]:
        sp = c["speedup"]
        lo, hi = sp["ci"]
        faster = "faster" if sp["geomean"] >= 1 else "slower"
        ci = "" if lo is None or hi is None else f" [{lo:.2f}, {hi:.2f}]"
        speed = (f"{sp['geomean']:.2f}× {faster}{ci}" if sp["geomean"] >= 1
                 else f"{1 / sp['geomean']:.2f}× slower (speedup {sp['geomean']:.2f}×{ci})")
        cp = c.get("compute")
        parts = [speed, "compute n/a" if not cp else f"compute {cp['ratio']:.2f}× control"]
        e = c["efficiency"]["treatment"] if c.get("efficiency") else None
        if e and e["mfu_median"] is not None:
            parts.append(f"est. MFU {100 * e['mfu_median']:.1f}%")
        if e and e["peak_memory_gib"] is not None:
            parts.append(f"peak {e['peak_memory_gib']:.1f} GiB")
        no_effect = next((f for f in c["flags"] if f.startswith(NO_EFFECT)), None)
        if no_effect:
            parts.append(no_effect)
        metrics = []
        for m in sorted(c["metrics"], key=lambda m: m["metric"]):
            d = column_decimals([m])
            unit = f" {UNITS[m['metric']]}" if m["metric"] in UNITS else ""
            point = m["diff"] if m["diff"] is not None else m["treatment_mean"]
            what = "Δ " if m["diff"] is not None else ""
            lo_m, hi_m = m["ci"]
            value = "n/a" if point is None else f"{what}{point:.{d}f}{unit}" + (
                "" if lo_m is None or hi_m is None else f" [{lo_m:.{d}f}, {hi_m:.{d}f}]")
            same = identical_note(m)
            metrics.append(f"{m['metric']} {verdict_text(m)}, {value}" + (f" ({same})" if same else ""))
        out.append(f"{c['treatment']}: " + ", ".join(parts) + ("; " + "; ".join(metrics) if metrics else ""))
    seq = stats.get("sequential")
    return [*iso_sentences(stats), *([looks.sentence(seq)] if seq else []), *out]


# --- group-sequential looks (analysis.looks; stats.json's sequential) --------------------------------

LOOKS_TEXT = ("Prompts were released in looks (each panel's sheet in its own order). After each look every "
              "pre-registered question (the table's family) was tested with the verdicts' own test at the nominal "
              "level of its alpha-spending boundary, and the study stopped generating once every question was "
              "decided, or at the last look. A question's interval is the repeated confidence interval at the "
              "look it stopped at (Jennison & Turnbull 1989): valid however the stop came about, and wider than "
              "a fixed-sample interval; the table above reads the released prompts as a fixed sample, so its "
              "intervals are narrower than the design allows. What was not released was never generated.")


def looks_lines(stats: Mapping[str, Any]) -> list[str]:
    """The section's bullets: the design, where it stopped, what it saved."""
    seq = stats["sequential"]
    c = seq["candidates"]
    saved = ("not estimated (no calibration)" if seq.get("saved_slot_s") is None else
             f"about {looks.hours(seq['saved_slot_s'])} of {looks.hours(seq['fixed_slot_s'])} "
             f"{(seq.get('unit') or '').replace('-hours', '')} time estimated for the fixed design")
    return [f"Design: {seq['looks']} looks at {', '.join(map(str, seq['prompts_at_looks']))} of {seq['max_prompts']} "
            f"prompts; {seq['spending_name']} spending, alpha {seq['alpha']:g} shared by {len(seq['questions'])} "
            f"question(s) ({seq['multiplicity']})",
            f"Stopped at look {seq['look']} ({seq['prompts']} prompts; "
            + ", ".join(f"{p} {n}" for p, n in sorted(seq["released"].items())) + f"): {seq['why']}",
            f"Saved against the fixed design: {c['saved']} of {c['planned']} candidates "
            f"({100 * seq['saved_share']:.0f}%), {saved} ({seq['saved_from']})"
            + ("" if not seq.get("measured") or not c["saved"] else
               f"; at the look jobs' measured work per candidate ({seq['measured']['work_s_per_candidate']:.3g} s: "
               f"{seq['measured']['work_s']:.3g} s of work in {seq['measured']['slot_s']:.3g} slot-s held by "
               f"{int(seq['measured']['jobs'])} job(s)), about {looks.hours(seq['measured']['saved_work_s'])} of work, "
               "start-up and idle not counted")]


# --- iso-compute controls (analysis.isocompute; stats.json's iso_compute) ---------------------------

ISO_TEXT = ("Does each acceleration arm beat simply taking fewer steps at the same cost? Rule calibrate counted "
            "each arm's FLOPs on one representative candidate and derived the plain step count of the control's "
            "pipeline whose FLOPs match (F(k) = rest + k x one step's transformer FLOPs, both from the control's "
            "count); where no count matches exactly, both neighbours are generated, scored and timed from the same "
            "seeds, and the arm is read against each, pair by pair: Δ = arm − plain arm (fidelity metrics: the "
            "difference of the two arms' fidelity to control), with the metric's margin where the study gives one, "
            "one Holm family per (arm, plain arm). The compute ratio is the arm's counted FLOPs over the plain "
            "arm's on the same pairs; the speedup is from the timed pass.")


def _verdict_word(m: Mapping[str, Any]) -> str:
    code = m.get("verdict_code")
    return PHRASES[code] if code else "value only"


def iso_sentences(stats: Mapping[str, Any]) -> list[str]:
    """One sentence per (arm, plain arm), in the derivation's order: what the answer line
    opens with."""
    iso = stats.get("iso_compute")
    if not iso:
        return []
    out = []
    for row in iso["comparisons"]:
        ms = sorted(row["comparison"]["metrics"], key=lambda m: m["metric"])
        beats = [f"{m['metric']} ({_verdict_word(m)})" for m in ms if m.get("verdict_code") == "superior"]
        rest = [f"{m['metric']} ({_verdict_word(m)})" for m in ms if m.get("verdict_code") != "superior"]
        plain = f"{row['steps']} plain steps ({row['side']})"
        if beats:
            text = f"{row['arm']} beats {plain} on {', '.join(beats)}" + (f", not on {', '.join(rest)}" if rest else "")
        else:
            text = f"{row['arm']} does not beat {plain} on any metric: " + ", ".join(rest)
        out.append(text)
    return out


def iso_derivation_lines(stats: Mapping[str, Any]) -> list[str]:
    """How each arm's plain step counts were derived, and why an arm has none."""
    iso = stats.get("iso_compute")
    if not iso:
        return []
    out = []
    for d in iso["derivations"]:
        steps = " and ".join(str(k) for k in d["steps"]) or "none"
        out.append(f"{d['arm']}: {d['arm_flops']:.4g} FLOPs per video = {d['matched_steps']:.3f} of the control's "
                   f"{d['control_steps']} steps (one step {d['step_flops']:.4g}, the rest {d['rest_flops']:.4g}); "
                   f"plain arms: {steps}" + (f" ({d['why_none']})" if d.get("why_none") else ""))
    out += [f"{arm}: no iso-compute control ({why})" for arm, why in sorted(iso.get("skipped", {}).items())]
    return out


def iso_rows(stats: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """One row per (arm, plain arm, metric)."""
    head = ["arm", "against", "compute ratio (× plain arm)", "speedup (× plain arm)", "metric",
            "Δ arm − plain arm [CI]", "verdict (p of the deciding test: test, family)"]
    out = []
    iso = stats.get("iso_compute") or {}
    for row in iso.get("comparisons", []):
        c = row["comparison"]
        cp = c.get("compute")
        sp = c["speedup"]
        for m in sorted(c["metrics"], key=lambda m: m["metric"]):
            out.append([row["arm"], f"{row['reference']} ({row['side']})",
                        "n/a" if not cp else f"{cp['ratio']:.3f}", f"{sp['geomean']:.2f}",
                        m["metric"], estimate(m, column_decimals([m])), verdict_text(m)])
    return head, out


def _front_lines(stats: StudyStats) -> list[str]:
    """Per arm, its kinds of change and the metrics on which it is on the Pareto front
    (compute ratio against metric); the numbers are the study table's and the plot's."""
    names = sorted({m["metric"] for c in stats["comparisons"] for m in c["metrics"]})
    out = []
    for c in stats["comparisons"]:
        front = [n for n in names if any(m["metric"] == n for m in c["metrics"]) and on_front(stats, c["treatment"], n)]
        out.append(f"{c['treatment']} ({', '.join(c.get('kinds', [])) or 'n/a'}): on the front for "
                   f"{', '.join(front) or 'no metric'}")
    return out


GALLERY_LINK = "gallery.html"
"""The video gallery, beside the study table (``layout.gallery``)."""


def _notes(stats: StudyStats) -> list[str]:
    notes = _arm_notes(stats)
    passes = ", ".join(sorted({p for c in stats["comparisons"] for p in c["latency"]["pass"]}))
    setups = [c.get("scoring", {}) for c in stats["comparisons"]]
    frames = sorted({f for sc in setups for f in sc.get("compared_frames", [])})
    filters = sorted({f for sc in setups for f in sc.get("static_filter", [])}) or ["none"]
    builds = sorted({str(sc.get("scorer_build")) for sc in setups})
    origins = sorted({str(sc.get("weights_origin")) for sc in setups if sc.get("weights_origin")})
    metrics = {m["metric"] for c in stats["comparisons"] for m in c["metrics"]}
    latency = (f"Latency pass: {passes} (each video's latency is the median of its repeated batch-one runs in the "
               "exclusive timed pass, after warm-up, arms in a seeded random order within each repeat round; bulk "
               "generation times are never reported). 'timed pairs × repeats' says what was timed: under "
               "timing/pairs: auto a pilot of prompts, then as many as each arm's speedup interval needs to reach "
               "timing/precision (Stein's two-stage design; the interval is the wider of Stein's and the "
               "t-interval, valid whatever the pilot chose). 'repeat CV' (blank with one repeat) is the median over "
               "videos of each video's "
               "coefficient of variation across its repeats, then the count of pairs above timing/max_cv. The "
               "latency columns are geometric means over prompts of the per-prompt geometric mean over seeds, "
               "the units of the speedup, so control / treatment equals the speedup.")
    method_name = MULTIPLICITY_NAMES.get(stats.get("multiplicity", "holm"), "Holm")
    method = (f"Each cell: the verdict, then treatment − control (FR metrics: the treatment's value against its "
              "control, on pairs whose videos differ) with its interval over prompts at the family-adjusted level, "
              f"beside the verdict the p of the test that decided it, named with its family: the cell's own "
              f"question is one of the table's {stats.get('family_size', 0)} tests ({method_name}-adjusted); a "
              "second value read from the same interval (0 for superior or worse, +margin for equivalent) is "
              "tested outside the family at the cell's level, its p scaled to that level. The verdict is read "
              "from the adjusted interval, so verdict and p agree (p < "
              f"{1 - stats['level']:.2g} exactly when the word claims something). "
              "Verdicts (CONSORT, Piaggio et al. 2012), against a margin (stats/margins): superior (the whole "
              "interval better than 0), non-inferior (the whole interval better than the loss edge -margin), "
              "equivalent (the whole interval inside ±margin), worse, non-inferiority not shown (the whole "
              "interval worse than 0 but holding -margin), inferior (the whole interval beyond -margin), "
              "inconclusive; a metric without a margin is read with margin 0 (its 'inconclusive' is not "
              "equivalence), an FR metric's floor (stats/floors) as its loss edge. 0/1 metrics are tested "
              "exactly (paired proportions). W/T/L: prompts where the "
              "treatment is better / tied / worse in the metric's direction. ⚠: see the diagnostics in Verdicts. "
              "Lower-is-better metrics improve when Δ < 0.")
    fidelity = ("Fidelity metrics (FR) compare each treatment video with its control, frame by frame, on: "
                + ("; ".join(frames) or "decoded encoded videos") + ".")
    flicker = (f"temporal_flickering static filter: {', '.join(filters)} (VBench scores only videos its RAFT "
               "filter calls static; 'none': every video of both arms; 'intersection': only pairs whose two videos "
               "are both static; either way both arms use the same subset).")
    build = (f"Both arms of every pair were scored by one scorer build ({', '.join(builds)}; same code, weights, "
             "device, precision and process layout).")
    decoding: dict[str, set[str]] = {}
    for sc in setups:
        for name, how in sc.get("decoding", {}).items():
            decoding.setdefault(name, set()).update(how)
    by_how: dict[str, list[str]] = {}
    for name, hows in sorted(decoding.items()):
        by_how.setdefault(" and ".join(sorted(hows)), []).append(name)
    decoded = ("Decoding (YUV to RGB) per metric: " + "; ".join(f"{how}: {', '.join(names)}"
                                                                for how, names in sorted(by_how.items()))
               + ". bt709 is the matrix the videos declare (and how decord, VBench's reader for subject and "
               "background consistency, aesthetic and imaging quality, decodes them); bt601 is how OpenCV 4.x, "
               "VBench's reader for dynamic_degree, motion_smoothness and temporal_flickering, decodes them. "
               "The two differ: on the default study's 42 videos temporal_flickering from bt709 frames reads "
               "0.0025 to 0.0032 higher than VBench's (OpenCV 4.10), about as large as typical cache effects, "
               "and equals it exactly under scoring/decode: vbench; compare with published VBench numbers only "
               "in that mode.") if by_how else None
    out = [*notes, *_efficiency_notes(stats), method, latency, fidelity, flicker, *([decoded] if decoded else []),
           build]
    if "motion_smoothness_proxy" in metrics:
        out.append("motion_smoothness_proxy is a PROXY of VBench motion_smoothness: linear frame interpolation "
                   "replaces AMT, so values compare arms but not published VBench numbers.")
    if "random-init" in origins:
        out.append("WARNING: scorer weights come from a random-initialised test mirror; weight-based scores "
                   "mean nothing about quality.")
    return out


_PLANNING_TEXT = ("Per-prompt standard deviation of each tested cell and its one-sided 80% upper confidence bound "
                  "(chi-square: the pilot's SD is itself uncertain), the smallest true difference a two-sided paired "
                  "t-test detects at this prompt count and the cell's adjusted level, and the prompts needed to show "
                  "non-inferiority at the margin (stats/margins) with the planned power if the true difference is "
                  "0, at the SD and at its upper bound (simulated with the union test, on this cell's values and on a "
                  "loss tail of skewness 2 at their SD, the larger; docs/metrics-and-verdicts.md, 'How N is planned'). "
                  "'variance' splits "
                  "the per-prompt mean's variance into prompts and seeds (one-way random effects): where prompts "
                  "dominate, more seeds cannot help.")

_VERDICTS_TEXT = ("One row per (arm, metric), all in one multiplicity family. The interval is at the cell's adjusted "
                  "level (in brackets). The verdict carries the p of the test that decided it, named with its family: "
                  "the same p as the study table, the answer line, the gallery and the export's p_verdict. 'the "
                  "question's test' is the test of the cell's own question, raw and adjusted (the export's "
                  "question_p_raw and question_p_adjusted): it decides the verdict only where the verdict names it, "
                  "so it may differ from the verdict's p; the sign-flip p and the skewness stand beside it; "
                  "diagnostics say where the data lie outside what the procedure was checked for (|skewness| > 2, "
                  "quantised values). Fidelity (FR) cells leave out pairs identical to control (their PSNR is the "
                  "metric's cap, not a measurement) and say how many.")


_FRONT_TEXT = ("Compute ratio = treatment / control FLOPs per video (transformer work counted with torch's "
               "FlopCounterMode in the bulk pass, plus a search arm's verifier scorings; hardware-independent; the "
               "study table's column). An arm is on the front for a metric when no other arm (control included, at "
               "ratio 1 and Δ 0) is both at most as costly and at least as good (point estimates; read them with "
               "the intervals above). Plot: plots/pareto.png.")

def _html_table(title: str, text: str, table_: tuple[list[str], list[list[str]]], escape: Any) -> list[str]:
    head, rows = table_
    return [f"<h2>{escape(title)}</h2><p>{escape(text)}</p><table><tr>",
            "".join(f"<th>{escape(h)}</th>" for h in head), "</tr>",
            *("<tr>" + "".join(f"<td>{colour_verdicts(escape(c))}</td>" for c in r) + "</tr>" for r in rows),
            "</table>"]


def _intervals(stats: StudyStats) -> str:
    method = MULTIPLICITY_NAMES.get(stats.get("multiplicity", "holm"), "Holm")
    return (f"{stats['procedure']}, over prompts; {method} across the table's {stats.get('family_size', 0)} tests "
            f"at {1 - stats['level']:.2g}; sign-flip with up to {stats['resamples']} resamples (exact while 2^n is "
            f"fewer), seed {stats['seed']}")


def _html_planning(stats: StudyStats, escape: Any) -> list[str]:
    head, rows = planning(stats)
    if not rows:
        return []
    return ["<h2>Sample size from this study as a pilot</h2>", f"<p>{escape(_PLANNING_TEXT)}</p><table><tr>",
            "".join(f"<th>{escape(h)}</th>" for h in head), "</tr>",
            *("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows), "</table>"]


def markdown(stats: StudyStats, title: str, provenance: dict[str, str]) -> str:
    """Render ``stats`` (from ``stats.analyse``) as Markdown, with the manifest roots
    every number came from."""
    head, rows = table(stats)
    lines = [f"# {title}", "", *(f"**{line}**  " for line in answer(stats)), "",
             f"Videos: [{GALLERY_LINK}]({GALLERY_LINK}) (control beside each treatment, worst pairs first).", "",
             f"Estimand: {stats['estimand']}.",
             f"Intervals: {_intervals(stats)}. Missing pairs: {stats['missing_policy']}.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += [""] + [f"- {n}" for n in _notes(stats)]
    v_head, v_rows = verdicts(stats)
    lines += ["", "## Verdicts", "", _VERDICTS_TEXT, "", "| " + " | ".join(v_head) + " |", "|" + "---|" * len(v_head)]
    lines += ["| " + " | ".join(r) + " |" for r in v_rows]
    t_head, t_rows = tails(stats)
    if t_rows:
        lines += ["", "## Tails: what the prompts rule out", "", _TAILS_TEXT, "",
                  "| " + " | ".join(t_head) + " |", "|" + "---|" * len(t_head)]
        lines += ["| " + " | ".join(r) + " |" for r in t_rows]
    i_head, i_rows = iso_rows(stats)
    if stats.get("iso_compute"):
        lines += ["", "## Against equal-compute steps", "", ISO_TEXT, "",
                  *(f"- {line}" for line in iso_derivation_lines(stats)), "",
                  "| " + " | ".join(i_head) + " |", "|" + "---|" * len(i_head)]
        lines += ["| " + " | ".join(r) + " |" for r in i_rows]
    if stats.get("sequential"):
        l_head, l_rows = looks.rows(stats["sequential"])
        lines += ["", "## Group-sequential looks", "", LOOKS_TEXT, "",
                  *(f"- {line}" for line in looks_lines(stats)), "",
                  "| " + " | ".join(l_head) + " |", "|" + "---|" * len(l_head)]
        lines += ["| " + " | ".join(r) + " |" for r in l_rows]
    lines += ["", "## Quality against cost", "", _FRONT_TEXT, "", *(f"- {line}" for line in _front_lines(stats))]
    p_head, p_rows = planning(stats)
    if p_rows:
        lines += ["", "## Sample size from this study as a pilot", "", _PLANNING_TEXT, "",
                  "| " + " | ".join(p_head) + " |", "|" + "---|" * len(p_head)]
        lines += ["| " + " | ".join(r) + " |" for r in p_rows]
    lines += ["", "## Provenance", ""]
    lines += [f"- `{name}`: `{root}`" for name, root in sorted(provenance.items())]
    return "\n".join(lines) + "\n"


def html(stats: StudyStats, title: str, provenance: dict[str, str]) -> str:
    """The same content as ``markdown`` as a standalone HTML page (for Snakemake's report)."""
    head, rows = table(stats)
    parts = [f"<html><head><meta charset='utf-8'><title>{escape(title)}</title><style>"
             "body{font-family:sans-serif;margin:1em} td,th{border:1px solid #ccc;padding:4px 8px}"
             "table{border-collapse:collapse} code{font-size:90%}</style></head><body>",
             f"<h1>{escape(title)}</h1>", "<ul class='answer'>",
             *(f"<li><b>{colour_verdicts(escape(line))}</b></li>" for line in answer(stats)), "</ul>",
             f"<p>Videos: <a href='{GALLERY_LINK}'>{GALLERY_LINK}</a> (control beside each treatment, worst pairs "
             "first; in the report: category Gallery).</p>",
             f"<p>Estimand: {escape(stats['estimand'])}.</p>",
             f"<p>Intervals: {escape(_intervals(stats))}. "
             f"Missing pairs: {escape(stats['missing_policy'])}.</p><table><tr>",
             "".join(f"<th>{escape(h)}</th>" for h in head), "</tr>",
             *("<tr>" + "".join(f"<td>{colour_verdicts(escape(c))}</td>" for c in r) + "</tr>" for r in rows),
             "</table><ul>", *(f"<li>{escape(n)}</li>" for n in _notes(stats)), "</ul>",
             *_html_table("Verdicts", _VERDICTS_TEXT, verdicts(stats), escape),
             *_html_tails(stats, escape),
             *([*_html_table("Against equal-compute steps", ISO_TEXT, iso_rows(stats), escape), "<ul>",
                *(f"<li>{escape(line)}</li>" for line in iso_derivation_lines(stats)), "</ul>"]
               if stats.get("iso_compute") else []),
             *([*_html_table("Group-sequential looks", LOOKS_TEXT, looks.rows(stats["sequential"]), escape), "<ul>",
                *(f"<li>{escape(line)}</li>" for line in looks_lines(stats)), "</ul>"]
               if stats.get("sequential") else []),
             f"<h2>Quality against cost</h2><p>{escape(_FRONT_TEXT)}</p><ul>",
             *(f"<li>{escape(line)}</li>" for line in _front_lines(stats)), "</ul>",
             *_html_planning(stats, escape), "<h2>Provenance</h2><ul>",
             *(f"<li><code>{escape(k)}</code>: <code>{escape(v)}</code></li>" for k, v in sorted(provenance.items())),
             "</ul></body></html>"]
    return "".join(parts) + "\n"
