"""The ``payload`` section of ``benchmarks/run.py``. Task payload: bytes and serialise time of
one generation task, before and now."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from .common import (
    median_time,
    scale_project,
)


def _payload_study(panels: int, prompts: int) -> Any:
    """A typed study of ``panels`` x ``prompts`` x 1 seed x 2 arms, without files on disk
    beyond its panel sheets."""
    from pairflow.plan.config import study_from_raw

    proj = scale_project(panels, prompts)
    import yaml

    raw = yaml.safe_load((proj / "config" / "config.yaml").read_text())
    return proj, study_from_raw(raw, proj, source="benchmark")


def bench_payload(runs: int, quick: bool = False) -> dict[str, Any]:
    """Bytes and dill serialise time of one generation task's payload, as Parsl ships it,
    at several study sizes: before (the task carried the study and provenance) and now
    (the candidate and a reference to the job's context file)."""
    import dill

    from pairflow.generation.provenance import provenance
    from pairflow.plan.candidates import candidates, task_identity
    from pairflow.plan.context import write_context

    sizes = {"100": (2, 25), "1k": (16, 31)} if quick else {"1k": (16, 31), "31k": (500, 31), "100k": (1613, 31)}
    out = {}
    for label, (panels, prompts) in sizes.items():
        proj, study = _payload_study(panels, prompts)
        prov = provenance(study)
        c = candidates(study, study.panels[-1])[-1]
        ref = write_context(study.scratch, {"study": study, "provenance": prov})
        old = {"study": study, "candidate": c, "provenance": prov, "identity": task_identity(c)}
        new = {"context": ref, "candidate": c, "identity": task_identity(c)}
        row: dict[str, Any] = {"candidates": panels * prompts * 2,
                               "context_file_bytes": Path(ref.path).stat().st_size}
        for name, payload in (("old", old), ("new", new)):
            row[f"{name}_bytes"] = len(dill.dumps(payload))
            row[f"{name}_serialize_ms"] = median_time(lambda p=payload: dill.dumps(p), runs) * 1e3
        # Driver CPU per stage: every task serialised once.
        row["old_driver_s_per_stage"] = row["old_serialize_ms"] * row["candidates"] / 1e3
        row["new_driver_s_per_stage"] = row["new_serialize_ms"] * row["candidates"] / 1e3
        out[label] = row
        shutil.rmtree(proj)
        print(f"  {label}: old {row['old_bytes']} B {row['old_serialize_ms']:.2f} ms, new {row['new_bytes']} B "
              f"{row['new_serialize_ms']:.3f} ms", flush=True)
    return {"points": out}
