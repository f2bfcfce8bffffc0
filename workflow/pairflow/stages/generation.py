"""Generation stage: each incomplete candidate of a panel is generated from its seed,
guarded, encoded by the fixed recipe and recorded, as one Parsl task per candidate.

A candidate is complete when its record verifies (self-digest), names the same
candidate id and encoder recipe, and its video's bytes match the recorded digest. Only
incomplete candidates run, so a rerun after a kill or a deleted video redoes exactly
those.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, cast

from ..arms import arm_model, record_sections, verifier_for
from ..arms import device as run_device
from ..atomic import job_start
from ..budget.calibrate import workers_for
from ..errors import PairFlowError
from ..fleet.pool import Grant, TaskHooks, run_tasks, worker_identity
from ..fleet.telemetry import PhaseMemory, close_job
from ..generation import compute
from ..generation import generate as g
from ..generation.armrun import arm_pipeline, run_arm
from ..generation.provenance import arm_record, config_snapshot, provenance
from ..identity import digest_obj
from ..layout import Layout
from ..locks import hold
from ..media.frames import prepare_frames
from ..media.recipe import recipe_digest
from ..media.video import encode
from ..plan.candidates import (
    Candidate,
    candidates,
    failure_path,
    generation_stale,
    panel_dir,
    record_path,
    task_identity,
    telemetry_path,
    video_path,
)
from ..plan.config import GenerationSpec, StudySpec
from ..plan.context import load_context, write_context
from ..records.store import (
    build_manifest,
    check_streams,
    check_video,
    read_record,
    stable_root,
    write_manifest,
    write_record,
)
from ..records.types import (
    CandidateFields,
    ComputeFields,
    GenerationRecord,
    GenerationSettings,
    PhaseMemoryFields,
    Provenance,
    VideoFields,
)
from ..records.vouch import vouch
from ..report.card import sealed_card
from .jobs import WARM_UP, clear_failures, describe, sweep_after, sweep_panel, timed_imports

log = logging.getLogger(__name__)


def candidate_fields(c: Candidate) -> CandidateFields:
    """What a record says of its candidate: its key, id, stream seed and prompt text."""
    k = c.key
    return {"study": k.study, "panel": k.panel, "prompt_id": k.prompt_id, "prompt_digest": k.prompt_digest,
            "seed": k.seed, "arm": k.arm, "arm_digest": k.arm_digest, "model_digest": k.model_digest,
            "candidate_id": k.candidate_id, "stream_seed": k.stream_seed, "prompt": c.prompt.text}


def generation_settings(g: GenerationSpec) -> GenerationSettings:
    """``config.GenerationSpec`` as records carry it."""
    return {"frames": g.frames, "height": g.height, "width": g.width, "steps": g.steps, "guidance": g.guidance,
            "fps": g.fps, "dtype": g.dtype, "threads": g.threads, "negative_prompt": g.negative_prompt,
            "max_text_tokens": g.max_text_tokens}


def complete_record(study: StudySpec, c: Candidate, recipe_digest: str) -> GenerationRecord | None:
    """The candidate's record when it and its video verify and match the candidate's
    identity and encoder recipe; None when the candidate must be (re)generated."""
    layout = Layout(study.scratch)
    path = record_path(layout, c)
    if not path.exists():
        return None
    try:
        record = read_record(path, "generation")
        check_video(record, path)
    except PairFlowError as e:
        log.warning("will regenerate: %s", e)
        return None
    return None if generation_stale(record, c, recipe_digest) else record


def warm_generation(payload: dict[str, Any], marks: dict[str, float] | None = None) -> dict[str, Any]:
    """Parsl warm-up task: import torch and diffusers and load the model in this worker
    while the driver still prepares the job's candidates. Returns (and keeps for the
    worker's records) the seconds spent on each; ``marks`` (the caller's start-up
    timeline, ``startup.worker_marks``) gets when the imports and the load ended."""
    # imports include the pipeline's lazily imported modules (generate.pipeline_imports),
    # so load_s is the weights alone
    import_s = timed_imports(("torch", "diffusers")) + g.pipeline_imports(payload["model"])
    started = time.perf_counter()
    if marks is not None:
        marks["pipeline_imported"] = time.time()
    g.load_pipeline(payload["model"], payload["dtype"], payload["threads"])
    if marks is not None:
        marks["model_loaded"] = time.time()
    WARM_UP.update({"import_s": import_s, "load_s": time.perf_counter() - started})
    return dict(WARM_UP)


def generate_task(payload: dict[str, Any]) -> dict[str, Any]:
    """Parsl task: generate, guard, encode and record one candidate (runs in a worker)."""
    shared = load_context(payload["context"])
    study: StudySpec = shared["study"]
    layout = Layout(study.scratch)
    c: Candidate = payload["candidate"]
    import_s = timed_imports(("torch", "diffusers")) + g.pipeline_imports(arm_model(c.arm, study.model))
    loaded = time.perf_counter()
    pipe = arm_pipeline(c.arm, study.model, study.generation)
    load_s = time.perf_counter() - loaded
    tokens = g.text_tokens(pipe, study.generation)
    # The bulk pass counts the transformer's work (compute.counting); the timed pass does not.
    result = counted_run(study, c, pipe, tokens, payload.get("flops_check", True))
    frames, stats = prepare_frames(result.frames, study.encoder)
    memory = result.memory or PhaseMemory(result.device == "cuda")
    started = time.perf_counter()
    memory.start("encode")
    info = encode(frames, video_path(layout, c), study.encoder, study.generation.fps)
    memory.stop("encode")
    encode_s = time.perf_counter() - started
    prov: Provenance = shared["provenance"]
    record: GenerationRecord = {
        "kind": "generation",
        "candidate": candidate_fields(c),
        "arm": arm_record(c.arm),
        "generation": generation_settings(study.generation),
        # What this arm ran with: the study's generation settings with its overrides.
        "effective_generation": generation_settings(g.effective_generation(c.arm, study.generation)),
        "pipeline": g.pipeline_info(pipe, tokens),
        "compute": cast(ComputeFields, result.compute),
        # The video's path is relative to the panel directory, so records stay valid when a
        # scratch tree is moved and compare equal across sites.
        "video": cast(VideoFields, {**info.asdict(), "path": video_path(layout, c).relative_to(
            panel_dir(layout, c.key.panel)).as_posix()}),
        "frames": {"mean": stats.mean, "std": stats.std, "flags": list(stats.flags)},
        # import_s and load_s are what this task spent importing and loading (0 when the
        # worker's warm-up task or an earlier task already did); the warm-up's own figures
        # are under worker.warm_up.
        "timing": {"pass": "bulk", "import_s": import_s, "load_s": load_s, "generate_s": result.seconds,
                   "generate_cpu_s": result.cpu_seconds,
                   "generate_wait_s": result.wait_seconds, "encode_s": encode_s, "peak_rss_mb": result.peak_rss_mb},
        # peak host RSS and device memory per phase (telemetry.PhaseMemory)
        "memory": cast(PhaseMemoryFields, memory.asdict()),
        "worker": {**worker_identity(), "device": result.device, "threads": result.threads,
                   "model_loads": dict(g.LOAD_COUNTS), "warm_up": WARM_UP or None},
        "code": prov["code"], "environment": prov["environment"], "model": prov["model"],
        "encoder": prov["encoder"], "config_digest": prov["config_digest"], "site": prov["site"],
    }
    if shared.get("card_seal"):  # the claim card this candidate was generated under (generation_context)
        record["card_seal"] = shared["card_seal"]
    # each declared kind's own section (a search's candidates, a student's weights)
    cast(dict[str, Any], record).update(record_sections(c.arm, result, study.model))
    write_record(record_path(layout, c), record)
    return {"candidate_id": c.key.candidate_id, "worker": record["worker"]}


def counted_run(study: StudySpec, c: Candidate, pipe: Any, tokens: int | None, check: bool) -> Any:
    """Run ``c``'s arm counting its compute: FLOPs derived from the table for its key
    (``compute.table_key``) when one exact table is saved, else counted in full and the
    table measured and saved. ``check``: count in full even with a table and cross-check
    the derived figure; a mismatch saves the table as inexact, so every later run of
    that key, in any worker, is counted in full (a figure is never derived from a table
    that was wrong). The table is read from scratch for every run (a small JSON), so a
    worker sees another's verdict at once, and an inexact table is never overwritten by
    an exact one. A table that lacked a unit the run called (a cache that skipped where
    the measuring run did not) is not wrong: the run is counted in full, and its
    measurement adds the missing units when the two agree on every unit both have."""
    folder = Layout(study.scratch).flop_tables
    eff = _effective(c, study)
    key = compute.table_key(arm_model(c.arm, study.model).identity(), dict(arm_record(c.arm)), eff, tokens,
                            run_device())
    table = compute.load_table(folder, key)
    full = check or table is None or not table.exact
    result = run_arm(pipe, c.prompt.text, c.key.stream_seed, c.arm, study.generation, tokens, count=True,
                     verifier=verifier_for(c.arm, study), table=table, full=full, table_key=key)
    cross = (result.compute or {}).get("cross_check")
    measured = result.measured
    if cross is not None and cross["derived_transformer_flops"] is None and table is not None and table.exact:
        merged = compute.merged(table, measured) if measured is not None else None
        if merged is not None:
            compute.save_table(folder, merged)
    elif cross is not None and not cross["equal"] and table is not None and table.exact:
        log.warning("FLOP table %s disagrees with full counting for %s (derived %s, counted %s); later runs of "
                    "this key are counted in full", key, c.key.candidate_id, cross["derived_transformer_flops"],
                    (result.compute or {}).get("transformer_flops"))
        compute.save_table(folder, compute.FlopTable(key, table.per_call, table.rest, table.verifier, False))
    elif measured is not None and table is None:
        compute.save_table(folder, measured)
    return result



def _effective(c: Candidate, study: StudySpec) -> dict[str, Any]:
    """The generation settings ``c``'s arm runs with, as records carry them."""
    return dict(generation_settings(g.effective_generation(c.arm, study.generation)))


def flop_checks(cands: list[Candidate], seed: int) -> set[str]:
    """The seeded sample of candidates counted in full and cross-checked against their
    derived FLOPs: per arm of the panel, the candidate whose xxh3 of (seed, candidate id)
    is smallest, so the same one is checked however the job's tasks are split or rerun."""
    best: dict[str, tuple[str, str]] = {}
    for c in cands:
        d = digest_obj(["flop-check", seed, c.key.candidate_id])
        if c.arm.name not in best or d < best[c.arm.name][0]:
            best[c.arm.name] = (d, c.key.candidate_id)
    return {cid for _, cid in best.values()}


def checks_last(todo: list[Candidate], checks: set[str]) -> list[Candidate]:
    """``todo`` with the cross-checked candidates (``flop_checks``) queued after the others,
    order otherwise kept: by the time one runs, its arm's table has most likely been
    measured by another candidate, so the check compares a derived figure with a full
    count rather than measuring the table itself (a run with no table to check against
    records no ``cross_check``)."""
    return sorted(todo, key=lambda c: c.key.candidate_id in checks)


def run_generation(study: StudySpec, panel_name: str, manifest_out: Path, run_dir: Path,
                   grant: Grant) -> dict[str, Any]:
    """Generate every incomplete candidate of a panel, then write its generation manifest.

    ``grant`` is what this job was given (``sites.grant_from_env``): workers per
    granted accelerator (one unless the calibration table shows more fit,
    ``calibrate.workers_for``), else CPU workers. Holds the panel's lock throughout: a second
    run on the same panel fails at once."""
    layout = Layout(study.scratch)
    with hold(panel_dir(layout, panel_name), f"generate {panel_name}"):
        return _run_generation(study, panel_name, manifest_out, run_dir, grant)


def _run_generation(study: StudySpec, panel_name: str, manifest_out: Path, run_dir: Path,
                    grant: Grant) -> dict[str, Any]:
    layout = Layout(study.scratch)
    started = job_start()
    sweep_panel(study, panel_name, started, ("records", "videos", "failures/generate"))
    todo_all = candidates(study, study.panel(panel_name))
    records: dict[Path, GenerationRecord] = {}  # verified records, so each video is hashed once per job
    todo: list[Candidate] = []

    def prepare() -> list[dict[str, Any]]:
        """Runs while the workers start and warm up: find the incomplete candidates."""
        todo.extend(incomplete(study, todo_all, records))
        log.info("generate %s: %d candidates, %d complete, %d to run", panel_name, len(todo_all),
                 len(todo_all) - len(todo), len(todo))
        ref = write_context(study.scratch, generation_context(study))
        checks = flop_checks(todo_all, study.stats.seed)
        return [generation_payload(ref, c, checks) for c in checks_last(todo, checks)]

    hooks = TaskHooks(telemetry_path(layout, panel_name, "generate"),
                      lambda p: failure_path(layout, p["candidate"], "generate"), describe,
                      warm=(warm_generation, warm_payload(study)),
                      # Start the pool before preparing only when work is certain (a record is
                      # missing); else only once prepare() found some, so a no-op job starts none.
                      start_early=any(not record_path(layout, c).exists() for c in todo_all))
    results = run_tasks(generate_task, prepare, run_dir, study.fleet, grant, f"generate {panel_name}", hooks,
                        workers_for(study, ("generate",), grant))
    sweep_after(study, panel_name, ("records", "videos"))
    finish_generation(study, panel_name, todo_all, todo, records, manifest_out)
    close_job(hooks.telemetry_out, started)  # the manifest's read-back is the job's time too
    return {"ran": len(todo), "reused": len(todo_all) - len(todo), "results": results}


def incomplete(study: StudySpec, cands: list[Candidate], records: dict[Path, GenerationRecord]) -> list[Candidate]:
    """The candidates of ``cands`` to (re)generate; the verified records of the others
    go into ``records`` (by record path), so each video is hashed once per job."""
    layout = Layout(study.scratch)
    rdigest = recipe_digest(study.encoder, study.generation.fps)
    todo = []
    for c in cands:
        record = complete_record(study, c, rdigest)
        if record is None:
            todo.append(c)
        else:
            records[record_path(layout, c)] = record
    return todo


def generation_context(study: StudySpec) -> dict[str, Any]:
    """What every generation task of a job shares (see ``context``): the study, its
    provenance and the seal of its claim card, sealed here, before this job generates
    anything, where no card is yet (``report.card.sealed_card``; a card sealed after
    another job's records landed says so)."""
    prov = provenance(study)
    card, _ = sealed_card(study, prov=prov)
    return {"study": study, "provenance": prov, "card_seal": card["seal"]}


def generation_payload(ref: Any, c: Candidate, checks: set[str]) -> dict[str, Any]:
    """One generation task's payload: the shared context's reference, the candidate and
    whether its FLOPs are counted in full and cross-checked (``flop_checks``)."""
    return {"context": ref, "candidate": c, "identity": task_identity(c), "stage": "generate",
            "flops_check": c.key.candidate_id in checks}


def warm_payload(study: StudySpec) -> dict[str, Any]:
    """What ``warm_generation`` loads: the study's model at its dtype and thread count."""
    return {"model": study.model, "dtype": study.generation.dtype, "threads": study.generation.threads}


def verified(study: StudySpec, c: Candidate) -> GenerationRecord:
    """``c``'s new record, self-digest, schema and video bytes checked (IntegrityError otherwise)."""
    layout = Layout(study.scratch)
    path = record_path(layout, c)
    record = read_record(path, "generation")
    check_video(record, path)
    return record


def generation_cost(recs: list[GenerationRecord]) -> dict[str, float] | None:
    """Summed bulk generation wall time, CPU time and run-queue wait of ``recs`` (issue 37:
    the wall time per candidate drifted with the share of the cores other processes took,
    the CPU time did not); None when a record lacks the CPU or wait figure (an older
    record, or a kernel without schedstat)."""
    times = [r["timing"] for r in recs]
    if not times or any(t.get("generate_cpu_s") is None or t.get("generate_wait_s") is None for t in times):
        return None
    wall = sum(t["generate_s"] for t in times)
    cpu = sum(t.get("generate_cpu_s") or 0.0 for t in times)
    wait = sum(t.get("generate_wait_s") or 0.0 for t in times)
    return {"generate_s": wall, "generate_cpu_s": cpu, "generate_wait_s": wait,
            "wait_share": wait / wall if wall > 0 else 0.0}


def finish_generation(study: StudySpec, panel_name: str, todo_all: list[Candidate], todo: list[Candidate],
                      records: dict[Path, GenerationRecord], manifest_out: Path) -> None:
    """After every task succeeded: clear the panel's generation failure records, verify
    each new record not yet in ``records`` (every new record must verify before the
    manifest binds it), check the seed streams and write the generation manifest."""
    layout = Layout(study.scratch)
    clear_failures(study, todo_all, "generate")  # every candidate is complete now
    for c in todo:
        path = record_path(layout, c)
        if path not in records:
            records[path] = verified(study, c)
    files = [record_path(layout, c) for c in todo_all]
    cost = generation_cost([records[record_path(layout, c)] for c in todo])
    if cost is not None:
        log.info("generate %s: %d generated in %.1f s of wall time: %.1f s of CPU and %.1f s waiting for a CPU "
                 "(%.0f%%: other processes on the same cores)", panel_name, len(todo), cost["generate_s"],
                 cost["generate_cpu_s"], cost["generate_wait_s"], 100 * cost["wait_share"])
    check_streams(list(records.values()))
    manifest = build_manifest("panel-generation", panel_dir(layout, panel_name), files,
                              {"study": study.study, "panel": panel_name,
                               "stable_root": stable_root(panel_dir(layout, panel_name), records),
                               "config": config_snapshot(study)})
    write_manifest(manifest_out, manifest)
    # Every record it lists was checked in this job: the first plan after it need not
    # check them again, nor re-hash the videos (pairflow.records.vouch).
    vouch(study.scratch, manifest_out, manifest, {p: records[p] for p in files if p in records})
