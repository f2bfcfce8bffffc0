"""What the arms refactor must keep (see arms_before.md): ``snapshot(root, model)`` is
compared with ``arms_before.json`` by tests/test_arms.py; run as a script it rewrites it:

    python tests/data/arms_before.py <project> tests/data/arms_before.json <tiny model dir>
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from pairflow.arms.registry import arm_digest, declared_keys, declared_kinds
from pairflow.generation.provenance import arm_record
from pairflow.identity import digest_bytes
from pairflow.plan.candidates import candidates
from pairflow.plan.config import ArmSpec, GenerationSpec, ModelSpec, SearchSpec, load_study

VARIANTS = [ArmSpec("control"), ArmSpec("fb", "FirstBlockCacheConfig", {"threshold": 0.2}),
            ArmSpec("few", steps=2), ArmSpec("g", guidance=1.0),
            ArmSpec("sched", scheduler_class="FlowMatchEulerDiscreteScheduler", scheduler_params={"shift": 2.0}),
            ArmSpec("student", model=ModelSpec("local", Path("/m/student"))), ArmSpec("bf16", dtype="bfloat16"),
            ArmSpec("attn", attention_backend="native"), ArmSpec("best2", search=SearchSpec(2, "temporal_flickering")),
            ArmSpec("mix", "FirstBlockCacheConfig", {"threshold": 0.2}, steps=3, guidance=2.0, dtype="bfloat16",
                    attention_backend="_native_math", search=SearchSpec(3, "dynamic_degree"))]
GENERATED = [ArmSpec("control"),
             ArmSpec("pab", "PyramidAttentionBroadcastConfig",
                     {"spatial_attention_block_skip_range": 2, "spatial_attention_timestep_skip_range": [-1, 1000]}),
             ArmSpec("few", steps=2, guidance=1.0),
             ArmSpec("sched", scheduler_class="FlowMatchEulerDiscreteScheduler", scheduler_params={"shift": 2.0}),
             ArmSpec("attn", attention_backend="_native_math"), ArmSpec("bf16", dtype="bfloat16"),
             ArmSpec("best2", search=SearchSpec(2, "temporal_flickering"))]


def identities(root: Path) -> dict[str, Any]:
    """The default study's candidate ids, panel digests and arm records, and one arm per
    kind's digest, keys, kinds and record (pure functions, no model)."""
    study = load_study(root / "config" / "config.yaml", root)
    default = {"arms": {a.name: {"digest": arm_digest(a), "record": dict(arm_record(a))} for a in study.arms},
               "panels": {p.name: study.panel_digest(p.name) for p in study.panels},
               "candidates": [c.key.candidate_id for p in study.panels for c in candidates(study, p)]}
    variants = {a.name: {"digest": arm_digest(a), "keys": list(declared_keys(a)), "kinds": list(declared_kinds(a)),
                         "record": dict(arm_record(a))} for a in VARIANTS}
    return {"default_study": default, "variants": variants}


def frames(root: Path, model: Path, arms: list[ArmSpec] = GENERATED) -> dict[str, Any]:
    """Digest of the frames the tiny model at ``model`` generates for each of ``arms``
    (5 frames of 32x32, 3 steps, one prompt, stream seed 1234), with a search's candidates."""
    from pairflow.arms import verifier_for
    from pairflow.generation.armrun import arm_pipeline, run_arm
    from pairflow.generation.generate import effective_generation, text_tokens

    study = load_study(root / "config" / "config.yaml", root)
    gen = GenerationSpec(frames=5, height=32, width=32, steps=3, guidance=5.0, fps=8, dtype="float32", threads=1)
    m = ModelSpec("embedded-tiny", model)

    class Study:  # what verifier_for reads of a study
        encoder, weights, scoring, generation = study.encoder, study.weights, study.scoring, gen

    out = {}
    for arm in arms:
        pipe = arm_pipeline(arm, m, gen)
        r = run_arm(pipe, "a red fox in snow", 1234, arm, gen, text_tokens(pipe, gen), verifier=verifier_for(arm, Study))
        out[arm.name] = {"frames": digest_bytes(np.ascontiguousarray(r.frames, dtype=np.float32).tobytes()),
                         "effective_generation": effective_generation(arm, gen).__dict__,
                         "candidates": [{k: e[k] for k in ("index", "seed", "score", "raw_digest")}
                                        for e in r.candidates], "chosen": r.chosen}
    return out


if __name__ == "__main__":
    root, out, model = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    out.write_text(json.dumps({**identities(root), "tiny_frames": frames(root, model)}, indent=1, sort_keys=True)
                   + "\n")
