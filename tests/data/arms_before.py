"""What the arms refactor must keep (see arms_before.md): ``identities(root)`` and
``frames(root, model)`` are compared with ``arms_before.json`` by tests/test_arms.py.

The identities (ids, digests, records) are pure functions of the code and the config: one
recording for every machine. The frames' digests are bit-for-bit outputs of a numeric stack
(torch build, its CPU kernels, thread count, numpy, diffusers, transformers): they are kept
per stack, side by side under ``tiny_frames``, keyed by ``stack_key(stack())``, and compared
only where the current stack is a recorded one. Run as a script:

    python tests/data/arms_before.py --record        # add or replace this stack's frame digests
    python tests/data/arms_before.py --identities    # rewrite the identities (an intended change)

(``--model DIR`` uses that tiny model instead of building one; ``--json PATH`` writes elsewhere.)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from importlib.metadata import version
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
    kind's digest, keys, kinds and record (pure functions, no model). The declared arms
    only: the iso-compute controls a run of the default study derived (its
    results/scratch/study/iso_compute.json, where one exists) are not what was recorded."""
    study = load_study(root / "config" / "config.yaml", root)
    default = {"arms": {a.name: {"digest": arm_digest(a), "record": dict(arm_record(a))} for a in study.declared_arms},
               "panels": {p.name: study.panel_digest(p.name) for p in study.panels},
               "candidates": [c.key.candidate_id for p in study.panels for c in candidates(study, p)
                              if not c.arm.derived_for]}
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


CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16")
"""CPU features that choose oneDNN/brgemm kernels beyond torch's capability level (bf16 matmul
and attention take AMX or AVX512-BF16 paths where the CPU has them)."""


def stack() -> dict[str, Any]:
    """The numeric stack the frames are a function of, besides the code: torch's build, the
    CPU kernels it dispatches to, its intra-op threads (read after ``frames``, which sets them
    from the generation settings), the CPU's kernel-choosing features, and the numeric libraries."""
    import torch

    flags: list[str] = []
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        words = set(cpuinfo.read_text().split())
        flags = [f for f in CPU_FLAGS if f in words]
    return {"torch": torch.__version__, "torch_git": torch.version.git_version[:12],
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
            "machine": platform.machine(), "cpu_flags": flags, "numpy": np.__version__,
            "diffusers": version("diffusers"), "transformers": version("transformers")}


def stack_key(s: dict[str, Any]) -> str:
    return (f"torch {s['torch']} ({s['torch_git']}) {s['machine']} {s['cpu_capability']} "
            f"[{' '.join(s['cpu_flags'])}] threads={s['threads']} numpy {s['numpy']} "
            f"diffusers {s['diffusers']} transformers {s['transformers']}")


def stack_independent(frames_: dict[str, Any]) -> dict[str, Any]:
    """What of ``frames`` is a property of the code alone: the arms, their effective generation
    settings, and a search's candidate indices and seeds (not digests, scores or the choice)."""
    return {name: {"effective_generation": a["effective_generation"],
                   "candidates": [{"index": c["index"], "seed": c["seed"]} for c in a["candidates"]]}
            for name, a in frames_.items()}


def _commit(root: Path) -> str | None:
    res = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         check=False)
    return res.stdout.strip() or None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Record what tests/test_arms.py compares with.")
    parser.add_argument("--record", action="store_true", help="add or replace this stack's frame digests")
    parser.add_argument("--identities", action="store_true", help="rewrite the identities (an intended change)")
    parser.add_argument("--model", type=Path, help="the embedded tiny model's folder (default: build one)")
    parser.add_argument("--json", type=Path, default=Path(__file__).with_suffix(".json"))
    args = parser.parse_args(argv)
    if not (args.record or args.identities):
        parser.error("say what to write: --record and/or --identities")
    root = Path(__file__).resolve().parents[2]
    data = json.loads(args.json.read_text()) if args.json.exists() else {"tiny_frames": {}}
    if args.identities:
        data.update(identities(root))
    if args.record:
        with tempfile.TemporaryDirectory() as tmp:
            if args.model is None:
                from pairflow.tinymodel import build_tiny_model

                args.model = build_tiny_model(Path(tmp) / "tiny-wan")
            now = frames(root, args.model)
        s = stack()
        key = stack_key(s)
        data["tiny_frames"][key] = {"stack": s, "commit": _commit(root),
                                    "aten_cpu_capability_env": os.environ.get("ATEN_CPU_CAPABILITY"),
                                    "frames": json.loads(json.dumps(now))}
        print(f"recorded {key}")
    args.json.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
