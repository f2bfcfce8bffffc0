"""Kind ``search``: test-time search, the best of N candidates under a verifier metric.

Search seeds. Candidate 0 of a pair replays the pair's stream seed, the noise every
other arm of the pair starts from; candidate i >= 1 uses
``xxh3_64(canonical_json(["search", stream_seed, i])) & (2**63 - 1)`` (``search_seeds``).
So candidate seeds depend only on the pair, never on worker or order, and a best-of-N arm
always contains the control's own sample among its candidates.

Cost. A search arm's video costs all N generations and all N verifier scorings: its
compute count adds every candidate's, its timed latency is the wall time of the whole
search (generation and scoring), and every candidate's seed, score, frame digest and
compute is kept in the record's ``search`` section as evidence. The loop itself is
``armrun.run_arm``'s (it generates, which this module, read while planning, never does).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import xxhash

from ...errors import ConfigError
from ...identity import canonical_json
from ...metrics import ScoreContext, metric_spec, score
from ...specs import ArmSpec, ModelSpec, SearchSpec
from ..base import ArmKind, ParseContext, device

SEEDS_NOTE = ("candidate 0: the pair's stream seed; i >= 1: xxh3_64(['search', stream_seed, i]) & (2^63 - 1) "
              "(pairflow.arms.search_seeds)")
"""How a search record's candidate seeds were derived (its ``search.seeds``)."""


def search_seeds(stream_seed: int, n: int) -> list[int]:
    """The generator seeds of a search arm's ``n`` candidates for a pair whose stream seed
    is ``stream_seed`` (see the module docstring for the derivation)."""
    return [stream_seed] + [xxhash.xxh3_64_intdigest(canonical_json(["search", stream_seed, i])) & 0x7FFF_FFFF_FFFF_FFFF
                            for i in range(1, n)]


def check_verifier(arm: ArmSpec) -> None:
    """A search verifier must be a registered NR metric (it scores one video alone)."""
    if arm.search is None:
        return
    try:
        spec = metric_spec(arm.search.verifier)
    except (KeyError, ImportError, ModuleNotFoundError, ValueError):
        spec = None
    if spec is None or spec.kind != "NR":
        raise ConfigError(f"arm {arm.name!r}: key 'arms/{arm.name}/search/verifier' is {arm.search.verifier!r}; a "
                          "verifier scores one video alone, so it must be an NR metric (temporal_flickering, "
                          "subject_consistency, background_consistency, aesthetic_quality, imaging_quality, "
                          "dynamic_degree, motion_smoothness_proxy)")


@dataclass(frozen=True)
class Verifier:
    """A search verifier: the NR metric ``name`` scored on the candidate's prepared uint8
    frames (before encoding, so the choice does not depend on codec noise)."""

    name: str
    higher_is_better: bool
    encoder: Any
    mirror: Path | None
    batch: int
    fps: int
    device: str = "cpu"

    def __call__(self, frames: Any, count: bool = False) -> tuple[float, int]:
        """(score, FLOPs the scoring took; 0 when not counted)."""
        ctx = ScoreContext(mirror=self.mirror, batch=self.batch, fps=self.fps, device=self.device)
        if not count:
            return float(score(self.name, frames, None, ctx)), 0
        from torch.utils.flop_counter import FlopCounterMode  # heavy: workers only

        with FlopCounterMode(display=False) as fc:
            value = float(score(self.name, frames, None, ctx))
        return value, int(fc.get_total_flops())


def verifier_for(arm: ArmSpec, study: Any) -> Verifier | None:
    """The study's verifier for a search arm, or None for any other arm."""
    if arm.search is None:
        return None
    # on the generating worker's device: a search scores where it generates
    return Verifier(arm.search.verifier, metric_spec(arm.search.verifier).higher_is_better, study.encoder,
                    study.weights.mirror, study.scoring.batch, study.generation.fps, device())


class Search(ArmKind):
    name = "search"
    rank = 60
    keys = ("search",)
    docs = "best of n candidates (seeds derived from the pair's stream seed) under an NR verifier metric"
    schema: ClassVar[Mapping[str, Any]] = {"search": {
        "type": "object", "additionalProperties": False, "required": ["n", "verifier"],
        "description": ("test-time search: best of n candidates (seeds derived from the pair's stream seed) "
                        "under the verifier metric"),
        "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 1024},
                       "verifier": {"type": "string", "description": (
                           "an NR metric among the scorers' names (e.g. temporal_flickering); higher or lower is "
                           "better as the metric declares")}}}}
    record_schema: ClassVar[Mapping[str, Any]] = {"search": {
        "type": "object", "additionalProperties": False, "required": ["n", "verifier"],
        "properties": {"n": {"type": "integer", "minimum": 2}, "verifier": {"type": "string"}}}}

    def parse(self, raw: Mapping[str, Any], ctx: ParseContext) -> dict[str, Any]:
        s = raw.get("search")
        return {"search": SearchSpec(s["n"], s["verifier"]) if s is not None else None}

    def fields(self, arm: ArmSpec) -> dict[str, Any]:
        return {"search": {"n": arm.search.n, "verifier": arm.search.verifier}} if arm.search is not None else {}

    def check(self, arm: ArmSpec, model: ModelSpec, device: str) -> None:
        check_verifier(arm)

    def section(self, arm: ArmSpec, result: Any, model: ModelSpec) -> dict[str, Any]:
        if arm.search is None:
            return {}
        return {"search": {"n": arm.search.n, "verifier": arm.search.verifier,
                           "chosen": result.chosen,  # a search always chooses (armrun.run_arm)
                           "seeds": SEEDS_NOTE, "candidates": list(result.candidates)}}


KIND = Search()
