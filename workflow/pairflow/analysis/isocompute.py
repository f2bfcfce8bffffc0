"""Iso-compute controls (issue 43 item 1): the plain step count whose compute matches an
acceleration arm's, derived from counted FLOPs, and the arm's quality read against the
plain arm at that count ("does it beat simply taking fewer steps at the same cost?").

**Which arms.** An arm that declares a cache, an attention backend (sparse attention) or
a generation override (steps, guidance, scheduler), and nothing that is not an
acceleration (a search spends more; another checkpoint or precision is another model).
An arm whose only change is its step count is itself a point of the steps curve: it has
no iso-compute control of its own (``eligible`` says why not, per arm).

**Derivation** (``derive``). A plain arm of the control's pipeline at k steps costs
``F(k) = R + k P`` FLOPs per video: ``P``, one denoising step's transformer FLOPs (every
transformer call of the step: two under classifier-free guidance), and ``R``, the rest of
the pipeline (text encoder, VAE decode), which the step count does not change. Both come
from the control's counted FLOPs at its ``S`` steps: ``P = T / S`` (``T``: its transformer
FLOPs) and ``R = F - T``. An arm whose counted FLOPs are ``F_a`` matches ``k* = (F_a - R)
/ P`` steps. Where ``k*`` is a whole number (to 1e-9 of it), that count; else both
neighbours, ``floor(k*)`` (cheaper than the arm) and ``ceil(k*)`` (dearer), each read
against the arm, so a reader sees whether the arm beats the plain steps on either side of
its cost. No control where ``k* >= S`` (the arm is not cheaper than control: control is
its equal-compute comparator) and no lower neighbour below 1 step.

FLOPs are counted, never timed: the latency ratio is reported beside the verdicts
(``against``: the comparison's speedup), not used to choose the step count, since
latency depends on the machine and FLOPs do not.

**The comparison** (``against``). The arm against one plain arm, pair by pair (same
prompt, same seed), by the study's own paired procedure (``stats.analyse`` with the plain
arm in the reference's place): each quality metric's difference arm - plain arm, a
CONSORT verdict with the metric's margin where the study gives one (else the difference
from 0: superior, inferior or inconclusive), one Holm family per (arm, plain arm). A
fidelity metric (PSNR, SSIM, LPIPS: each arm's fidelity to control) is compared as a
difference of fidelities, higher-is-better as the metric says, without the study's floor
(a floor is a bar for one arm, not a question between two).

Imports without torch.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..arms.registry import declared_kinds
from ..errors import StatsError
from ..plan.config import ISO_PREFIX, StatsSpec
from ..records.types import Comparison, GenerationRecord, ScoreRecord, TimingRecord
from ..specs import ArmSpec
from .stats import analyse

ACCELERATION_KINDS = frozenset({"cache", "attention_backend", "overrides"})
"""Kinds of change that make an arm an acceleration arm (``arms.registry``'s kind names)."""
WHOLE = 1e-9
"""A matched step count within this share of a whole number is that number."""
FORMAT = "pairflow-iso-compute/1"
REFERENCE = "control"
"""The name ``stats.analyse`` reads as the reference arm; the plain arm takes its place."""


def eligible(arm: ArmSpec) -> str | None:
    """None where ``arm`` gets an iso-compute control, else why not (one phrase)."""
    kinds = set(declared_kinds(arm))
    if arm.is_control:
        return "the control arm"
    if not kinds & ACCELERATION_KINDS:
        return "no acceleration declared (a cache, an attention backend or a generation override)"
    if kinds - ACCELERATION_KINDS:
        return f"declares {', '.join(sorted(kinds - ACCELERATION_KINDS))}, not an acceleration of the same model"
    if kinds == {"overrides"} and arm.steps is not None and arm.guidance is None and arm.scheduler_class is None:
        return "a plain step count: a point of the steps curve itself"
    return None


@dataclass(frozen=True)
class Derivation:
    """How one arm's equal-compute step count was derived (see the module)."""

    arm: str
    control_steps: int
    step_flops: float
    rest_flops: float
    arm_flops: float
    matched_steps: float
    steps: tuple[int, ...]
    """The plain step counts the arm is read against: one (exact), two neighbours, one
    (the upper, below 1 step), or none (``why_none``)."""
    why_none: str | None = None

    def asdict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "steps": list(self.steps)}


def derive(arm: str, control_steps: int, control_flops: float, control_transformer_flops: float,
           arm_flops: float) -> Derivation:
    """The plain step counts matching ``arm_flops`` (see the module), from the control's
    counted FLOPs per video at ``control_steps`` steps. Raises StatsError for figures no
    counted run gives (no steps, no transformer FLOPs, a part larger than the whole)."""
    if control_steps < 1 or not control_transformer_flops > 0 or not control_flops >= control_transformer_flops:
        raise StatsError(f"control FLOPs {control_flops} (transformer {control_transformer_flops}) at "
                         f"{control_steps} steps: not a counted run's figures")
    if not arm_flops > 0:
        raise StatsError(f"{arm}: counted FLOPs {arm_flops}: not a counted run's figure")
    step = control_transformer_flops / control_steps
    rest = control_flops - control_transformer_flops
    k = (arm_flops - rest) / step

    def made(steps: tuple[int, ...], why: str | None = None) -> Derivation:
        return Derivation(arm, control_steps, step, rest, arm_flops, k, steps, why)

    if k >= control_steps * (1 - WHOLE):
        return made((), f"not cheaper than control ({k:.3g} of {control_steps} steps' compute): control is its "
                        "equal-compute comparator")
    near = round(k)
    if near >= 1 and abs(k - near) <= WHOLE * max(1.0, k):
        return made((near,))
    return made(tuple(n for n in (math.floor(k), math.ceil(k)) if 1 <= n < control_steps))


def controls(arms: Sequence[ArmSpec], counted: Mapping[str, Mapping[str, Any]], control_steps: int) -> dict[str, Any]:
    """The iso-compute controls of ``arms`` (the declared ones, control among them) from
    ``counted`` (arm name -> an entry with ``compute: {total_flops, transformer_flops}``,
    per video: the calibration's counts): each eligible arm's ``Derivation``, each other
    arm with why it has none, and the plain arms to add (one per step count, naming the
    arms it is the control of). What ``Layout.iso_compute`` holds."""
    c = counted["control"]["compute"]
    derivations: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    by_steps: dict[int, list[str]] = {}
    for a in arms:
        why = eligible(a)
        f = (counted.get(a.name) or {}).get("compute") or {}
        if why is None and not (f.get("total_flops") or 0) > 0:
            why = "its FLOPs were not counted (an attention kernel outside aten: a lower bound only)"
        if why is not None:
            if not a.is_control:
                skipped[a.name] = why
            continue
        d = derive(a.name, control_steps, float(c["total_flops"]), float(c["transformer_flops"]),
                   float(f["total_flops"]))
        derivations.append(d.asdict())
        for k in d.steps:
            by_steps.setdefault(k, []).append(a.name)
        if not d.steps:
            skipped[a.name] = str(d.why_none)
    return {"format": FORMAT, "control_steps": control_steps, "counted": "calibration: one representative "
            "candidate per arm, FLOPs counted in full (FlopCounterMode)", "derivations": derivations,
            "skipped": skipped, "arms": [{"name": iso_arm(k).name, "steps": k, "for": names}
                                         for k, names in sorted(by_steps.items())]}


def iso_arm(steps: int) -> ArmSpec:
    """The plain arm of the control's pipeline at ``steps`` steps."""
    return ArmSpec(f"{ISO_PREFIX}{steps}", steps=steps)


def against(gen_records: Sequence[GenerationRecord], score_records: Sequence[ScoreRecord],
            timing_records: Sequence[TimingRecord], arm: str, plain: str, s: StatsSpec) -> Comparison:
    """``arm`` against the plain arm ``plain``, paired by prompt and seed (see the module):
    ``stats.analyse``'s comparison with ``plain`` as the reference. Records of other arms
    are passed over. Raises PairingError as ``analyse`` does (a pair without its partner)."""
    def keep(recs: Sequence[Any], fidelity_as_difference: bool = False) -> list[Any]:
        out = []
        for r in recs:
            name = r["arm"]["name"]
            if name not in (arm, plain):
                continue
            r = copy.deepcopy(r)
            if name == plain:
                r["arm"]["name"] = REFERENCE
            if fidelity_as_difference:
                for v in r["scores"].values():
                    if v["spec"]["kind"] == "FR":
                        v["spec"]["kind"] = "NR"
            out.append(r)
        return out

    fidelity = {n for r in score_records for n, v in r["scores"].items() if v["spec"]["kind"] == "FR"}
    spec = dataclasses.replace(s, floors={}, margins={k: v for k, v in s.margins.items() if k not in fidelity})
    return analyse(keep(gen_records), keep(score_records, True), keep(timing_records), [arm], spec)["comparisons"][0]


def side(steps: int, matched: float) -> str:
    """Where the plain arm's cost lies against the arm's: ``equal compute`` (the matched
    count is whole), ``fewer steps`` (cheaper) or ``more steps`` (dearer)."""
    if abs(steps - matched) <= WHOLE * max(1.0, matched):
        return "equal compute"
    return "fewer steps" if steps < matched else "more steps"


def section(derivation: Mapping[str, Any], gen_records: Sequence[GenerationRecord],
            score_records: Sequence[ScoreRecord], timing_records: Sequence[TimingRecord],
            s: StatsSpec) -> dict[str, Any]:
    """The study statistics' ``iso_compute`` part: the derivation (``controls``: what rule
    calibrate wrote); for each arm and each of its plain arms, ``against``'s comparison
    with the plain arm's step count and side; and the steps curve (``curve``: each plain
    arm against control, as the study table reads an arm, in a family of their own)."""
    rows = []
    for d in derivation["derivations"]:
        for k in d["steps"]:
            plain = iso_arm(int(k)).name
            rows.append({"arm": d["arm"], "reference": plain, "steps": int(k), "side": side(int(k), d["matched_steps"]),
                         "comparison": against(gen_records, score_records, timing_records, d["arm"], plain, s)})
    plains = sorted({r["reference"] for r in rows}, key=lambda n: int(n.removeprefix(ISO_PREFIX)))
    curve = analyse(gen_records, score_records, timing_records, plains, s)["comparisons"] if plains else []
    return {"derivations": list(derivation["derivations"]), "skipped": dict(derivation.get("skipped", {})),
            "family": "one Holm family per (arm, plain arm): its quality metrics", "comparisons": rows,
            # the steps curve: each plain arm against control (its own family; what the plot draws)
            "curve": curve}
