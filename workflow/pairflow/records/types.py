"""The types of PairFlow's records, manifests and statistics.

Each sealed record kind (``generation``, ``score``, ``timing``, ``failure``,
``retirement``) is a ``TypedDict`` here and a JSON Schema in
``workflow/schemas/record.<kind>.schema.yaml``; manifests are ``Manifest`` and
``manifest.schema.yaml``. ``records.write_record`` validates a record against its
kind's schema before it is written and ``records.read_record`` after its self-digest
is checked, so code holding one of these types holds a record whose required fields,
enums and types were checked at run time as well as by mypy. ``tests/test_records.py``
keeps the TypedDicts' keys and the schemas' properties in step.

The statistics' output (``stats.analyse``, read by ``table`` and ``plots``) is typed
here too: ``StudyStats`` > ``Comparison`` > ``MetricResult``.

Imports without torch.
"""

# No ``from __future__ import annotations``: the TypedDicts' required and optional keys
# are read at run time (tests/test_records.py checks them against the schemas).
import sys
from typing import Any, Literal, TypedDict

if sys.version_info >= (3, 11):
    from typing import NotRequired
else:  # pragma: no cover - Python 3.10
    from typing_extensions import NotRequired

RecordKind = Literal["generation", "score", "timing", "failure", "retirement"]
RECORD_KINDS: tuple[RecordKind, ...] = ("generation", "score", "timing", "failure", "retirement")
ManifestKind = Literal["panel-generation", "panel-scores", "timing", "study", "archive"]
MetricKind = Literal["NR", "FR", "prompt"]
"""NR: per video; FR: against the control video of the same pair; prompt: against the prompt text."""
ArmKind = str
"""A registered kind of arm (``pairflow.arms.KINDS``; the record schema's enum is filled from it)."""
Decoding = Literal["bt709", "bt601"]
StaticFilter = Literal["none", "intersection"]
FailureClass = Literal["device_oom", "host_oom_or_killed", "other"]
Clock = Literal["cuda_events", "perf_counter"]
VerdictCode = Literal["superior", "non_inferior", "equivalent", "worse_non_inferiority_not_shown", "inferior",
                      "inconclusive"]
"""A cell's verdict, machine-readable (``analysis.verdicts`` words it)."""


class CandidateFields(TypedDict):
    """A candidate's identity (``identity.CandidateKey``) with its id, stream seed and prompt."""

    study: str
    panel: str
    prompt_id: str
    prompt_digest: str
    seed: int
    arm: str
    arm_digest: str
    model_digest: str
    candidate_id: str
    stream_seed: int
    prompt: str


class SearchFields(TypedDict):
    n: int
    verifier: str


class ArmFields(TypedDict):
    """What a record says of its arm (``provenance.arm_record``): the optional keys are
    there only for the kinds the arm declares. Each kind's fields are declared by its
    module (``ArmKind.record_schema``, which the record schema is filled from); the ones
    typed here are those code reads, and a test keeps them among the declared ones. A
    kind added later carries its fields in records without a type here."""

    name: str
    kinds: list[ArmKind]
    cache_class: str | None
    cache_params: dict[str, Any]
    digest: str
    steps: NotRequired[int]
    guidance: NotRequired[float]
    scheduler_class: NotRequired[str]
    scheduler_params: NotRequired[dict[str, Any]]
    model: NotRequired[dict[str, Any]]
    dtype: NotRequired[str]
    attention_backend: NotRequired[str]
    search: NotRequired[SearchFields]


class GenerationSettings(TypedDict):
    """``config.GenerationSpec`` as records carry it."""

    frames: int
    height: int
    width: int
    steps: int
    guidance: float
    fps: int
    dtype: str
    threads: int
    negative_prompt: str
    max_text_tokens: int | None


class VideoFields(TypedDict):
    """``video.VideoInfo``; ``path`` relative to the panel directory."""

    path: str
    digest: str
    bytes: int
    frames: int
    height: int
    width: int
    fps: str
    pix_fmt: str
    raw_digest: str


class FrameFields(TypedDict):
    mean: float
    std: float
    flags: list[str]


class CrossCheck(TypedDict):
    """A fully counted run's FLOPs derived from the table as well (``compute.counting``)."""

    derived_transformer_flops: int | None
    equal: bool


class PhaseMemoryEntry(TypedDict):
    """One phase's peaks (``telemetry.PhaseMemory``); ``host_scope``: ``phase`` when the
    host peak was reset at the phase's start, ``process`` where it could not be."""

    peak_rss_mb: float
    peak_device_mb: float | None
    host_scope: Literal["phase", "process"]


PhaseMemoryFields = dict[str, PhaseMemoryEntry]
"""Peak memory by phase: denoise, decode, encode (generation records), score (score records)."""


class ComputeFields(TypedDict, total=False):
    """The bulk pass's counted work (``compute.py``); every key optional (an uncounted run)."""

    work_flops: float
    total_flops: float
    transformer_flops: float
    verifier_flops: float
    transformer_calls: int
    blocks_computed: int
    blocks_skipped: int
    attention_computed: int
    attention_skipped: int
    uncounted_attention: int
    generations: int
    latent_shape: list[int] | None
    counter: str
    verifier: str
    method: Literal["counted", "derived"]
    table: str
    cross_check: CrossCheck


BulkTiming = TypedDict("BulkTiming", {
    "pass": Literal["bulk"], "import_s": float, "load_s": float, "generate_s": float, "encode_s": float,
    "peak_rss_mb": float | None, "generate_cpu_s": NotRequired[float | None],
    "generate_wait_s": NotRequired[float | None]})
"""Seconds the bulk pass spent (recorded, never reported as latency); "pass" is a keyword,
hence the functional form. ``generate_cpu_s``: the worker process's CPU time (every
thread, ``time.process_time``) over the interval ``generate_s`` is the wall time of: the
generation's cost, which other processes on the same cores do not inflate;
``generate_wait_s``: of ``generate_s``, how long the worker's thread was ready to run but
waited for a CPU (Linux schedstat; None elsewhere): the share other processes took."""


class EncoderFingerprint(TypedDict):
    version: str
    digest: str


class EncoderFields(TypedDict):
    recipe: dict[str, Any]
    recipe_digest: str
    fingerprint: EncoderFingerprint


class ModelFields(TypedDict):
    kind: str
    id: str
    revision: str | None
    weights: dict[str, str]


class CodeFields(TypedDict):
    commit: str | None
    dirty: bool | None


class Provenance(TypedDict):
    """Fields shared by every generation record of a run (``provenance.provenance``)."""

    code: CodeFields
    environment: dict[str, Any]
    model: ModelFields
    encoder: EncoderFields
    config_digest: str
    site: dict[str, Any]


class SearchRecord(TypedDict):
    n: int
    verifier: str
    chosen: int
    seeds: str
    candidates: list[dict[str, Any]]


class _Sealed(TypedDict):
    schema_version: NotRequired[int]
    record_digest: NotRequired[str]


class GenerationRecord(Provenance, _Sealed):
    """One candidate's generation record (``stages.generation.generate_task``)."""

    kind: Literal["generation"]
    candidate: CandidateFields
    arm: ArmFields
    generation: GenerationSettings
    effective_generation: GenerationSettings
    pipeline: dict[str, Any]
    compute: ComputeFields | None
    video: VideoFields
    frames: FrameFields
    timing: BulkTiming
    memory: NotRequired[PhaseMemoryFields]
    worker: dict[str, Any]
    search: NotRequired[SearchRecord]
    arm_model: NotRequired[dict[str, Any]]
    card_seal: NotRequired[str]


class MetricSpecFields(TypedDict):
    """``scoring.MetricSpec.asdict``: what a score means."""

    name: str
    version: str
    kind: MetricKind
    higher_is_better: bool
    range: str
    source: str
    weights: list[list[str | None]]


class ScoreEntry(TypedDict):
    value: float
    spec: MetricSpecFields
    decoded_with: Decoding
    static: NotRequired[bool]


class StaticFilterFields(TypedDict):
    temporal_flickering: StaticFilter
    meaning: str


class ScorerBuild(TypedDict):
    """What computed the scores (``stages.scoring.scorer_build``), shared by both arms."""

    digest: str
    code_digest: str
    packages: dict[str, str | None]
    weights_lock: str | None
    weights_origin: str | None
    static_filter: StaticFilter
    decode: Literal["bt709", "vbench"]
    device: str
    precision: str
    threads: int
    batch: int
    workers: int
    layout: str
    cuda_settings: NotRequired[dict[str, bool]]  # on CUDA only: generate.CUDA_SETTINGS, pinned by every worker


class ScoreTiming(TypedDict):
    score_s: float


class ScoreRecord(_Sealed):
    """One candidate's scores (``stages.scoring.score_task``)."""

    kind: Literal["score"]
    candidate: CandidateFields
    arm: ArmFields
    video_digest: str
    control_video_digest: str
    generation_record_digest: str
    compared_frames: str
    static_filter: StaticFilterFields
    scores: dict[str, ScoreEntry]
    scorer: ScorerBuild
    timing: ScoreTiming
    memory: NotRequired[PhaseMemoryFields]
    worker: dict[str, Any]


TimedTiming = TypedDict("TimedTiming", {
    "pass": Literal["timed"],
    "latency_s": float | None,  # None exactly when the pair was not sampled
    "pairs": int | str,  # a count, "all" or "auto" (the schema allows only those)
    "seed": int,
    "seconds": NotRequired[list[float]],
    "rounds": NotRequired[list[int]],
    "cv": NotRequired[float | None],
    "max_cv": NotRequired[float],
    "over_max_cv": NotRequired[bool],
    "phases_s": NotRequired[dict[str, float]],
    "clock": NotRequired[Clock],
    "order": NotRequired[str],
    "warmup_per_arm": NotRequired[int],
    "repeats": NotRequired[int],
    "batch": NotRequired[int],
    "synchronised": NotRequired[bool],
    "device": NotRequired[str | None],
    "threads": NotRequired[int | None],
    "gpu_name": NotRequired[str | None],
    "cuda_settings": NotRequired[dict[str, Any] | None],
    "peak_device_mb": NotRequired[float | None],
    "sequential": NotRequired[dict[str, Any]],  # timing.pairs: auto: the design (analysis.sequential)
    "stopped": NotRequired[str],  # not timed: where the sequential design stopped (precision, ceiling, exhausted)
    "covers": NotRequired[str],
})
"""A timed-pass timing: the measurement keys are present exactly when ``sampled`` is true."""


class TimingRecord(_Sealed):
    """One candidate's timed-pass record (``stages.timing``)."""

    kind: Literal["timing"]
    candidate: CandidateFields
    arm: ArmFields
    sampled: bool
    generation_record_digest: str
    timing: TimedTiming
    matches_bulk_frames: bool | None
    gpu: NotRequired[list[dict[str, Any]] | None]
    worker: NotRequired[dict[str, Any]]


class FailureSlot(TypedDict):
    """Where a failed task last ran (``fleet._failed_slot``): host and device, the slot's
    name (``telemetry.slot_name``) and which evidence said so (task, heartbeat, parsl)."""

    host: str | None
    device: str | None
    name: str | None
    source: Literal["task", "heartbeat", "parsl"]
    pid: NotRequired[int | None]
    rank: NotRequired[str | int | None]
    visible_devices: NotRequired[str | None]
    gpu_index: NotRequired[str | None]
    gpu_uuid: NotRequired[str | None]
    slurm_job: NotRequired[str | None]


FailureRecord = TypedDict("FailureRecord", {
    "kind": Literal["failure"],
    "schema_version": NotRequired[int],
    "record_digest": NotRequired[str],
    "candidate_id": NotRequired[str],
    "panel": NotRequired[str],
    "arm": NotRequired[str],
    "prompt_id": NotRequired[str],
    "seed": NotRequired[int],
    "label": str,
    "class": FailureClass,
    "exception": str,
    "message": str,
    "attempts": int,
    "time": float,
    "advice": NotRequired[str],
    "slot": FailureSlot | str | None,
})
"""A task that failed after its retries (``fleet``); "class" is a keyword, hence the functional form."""


class RetirementRecord(_Sealed):
    """A retired archive snapshot's note (``archive.retire``)."""

    kind: Literal["retirement"]
    snapshot: str
    why: str
    archive_root_digest: str | None
    found: list[str]
    by: str
    at: str


Record = GenerationRecord | ScoreRecord | TimingRecord | FailureRecord | RetirementRecord


class Manifest(TypedDict):
    """A manifest's common keys; each kind adds its own (study, panel, config, ...)."""

    kind: ManifestKind
    schema_version: int
    base: str
    files: dict[str, str]
    root_digest: str


# ---- statistics (stats.analyse -> table, plots) -------------------------------------

class Planning(TypedDict):
    """Sample size from a study as a pilot (``stats._planning``)."""

    sd_prompt: float | None
    sd_upper: float | None
    sd_upper_confidence: float
    power: float
    target_effect: float | None
    detectable_effect: float | None
    prompts_needed: int | None
    prompts_needed_upper: int | None
    var_prompt: float | None
    var_seed: float | None
    seeds_per_prompt: float
    advice: str


class TailPrompt(TypedDict):
    """One of a cell's worst prompts (``analysis.tail``): its loss (mean over seeds, in the
    metric's bad direction), the seed of its worst pair, that pair's gallery anchor and the
    two videos (paths inside the panel's folder)."""

    prompt: str
    loss: float
    seed: int
    anchor: str
    control_video: str
    treatment_video: str


class TailStatement(TypedDict):
    """What a cell's prompts rule out about prompts that break (``analysis.tail``)."""

    margin: float
    n_prompts: int
    exceed: int
    share: float
    upper: float
    upper_level: float
    outlier_z: float | None
    flag: bool
    target_share: float
    prompts_to_bound: int | None
    worst: list[TailPrompt]


class MetricResult(TypedDict):
    """One metric of one comparison: the paired estimate, its interval at the family's
    adjusted level, the test of its question and the verdict read from them."""

    metric: str
    kind: MetricKind
    higher_is_better: bool
    n_pairs: int
    n_prompts: int
    n_identical_pairs: int
    control_mean: float | None
    treatment_mean: float | None
    diff: float | None
    sd_prompt: float | None
    relative_effect: float | None
    standardised_effect: float | None
    wins: int | None
    ties: int | None
    losses: int | None
    margin: float | None
    floor: float | None
    hypothesis: str | None
    ci: list[float | None]
    ci_level: float
    ci_note: str | None
    p_value: float | None
    p_adjusted: float | None
    p_signflip: float | None
    signflip_min_p: float
    skewness: float | None
    diagnostics: list[str]
    test: str
    verdict: str | None
    verdict_code: VerdictCode | None
    verdict_detail: str | None
    p_verdict: float | None
    p_verdict_test: str | None
    p_verdict_family: str | None
    verdict_rests_on: list[str]
    planning: Planning | None
    tail: TailStatement | None


LatencySummary = TypedDict("LatencySummary", {
    "pass": list[str], "control_geomean_s": float, "treatment_geomean_s": float, "n_pairs": int,
    "dropped_frames_differ": int, "sampled_pairs": int, "pairs_over_max_cv": int,
    "control_cv_median": float | None, "treatment_cv_median": float | None,
    "control_median_s": float, "treatment_median_s": float,
    # what was timed: prompts, repeats per candidate, and the design that chose the pairs
    # ("fixed", or timing.pairs: auto's sequential design with its pilot and stop reasons)
    "timed_prompts": int, "repeats": list[int], "design": dict[str, Any]})
"""Latency of a comparison from the timed pass ("pass": the passes it came from)."""


class RatioSummary(TypedDict):
    geomean: float
    ci: list[float | None]
    ci_note: str | None


class ComputeSummary(TypedDict):
    ratio: float
    ci: list[float | None]
    ci_note: str | None
    control_flops_mean: float
    treatment_flops_mean: float
    control_blocks_computed: int
    blocks_computed: int
    blocks_skipped: int
    attention_computed: int
    attention_skipped: int
    generations: int
    counter: str | None


class ArmEfficiency(TypedDict):
    """One arm's estimated MFU (median over its timed candidates) and peak device memory
    (max over them); ``absent`` says why either is None."""

    mfu_median: float | None
    peak_memory_gib: float | None
    gpu: str | None
    peak_tflops: float | None
    absent: str | None


class EfficiencySummary(TypedDict):
    control: ArmEfficiency
    treatment: ArmEfficiency
    convention: str


class ScoringSetup(TypedDict):
    scorer_build: str | None
    weights_origin: str | None
    device: str | None
    precision: str | None
    compared_frames: list[str]
    static_filter: list[str]
    decoding: dict[str, list[str]]


class Comparison(TypedDict):
    """One treatment against control (``stats.compare``)."""

    treatment: str
    n_prompts: int
    n_pairs: int
    flags: list[str]
    notes: list[str]
    metrics: list[MetricResult]
    scoring: ScoringSetup
    latency: LatencySummary
    speedup: RatioSummary
    compute: ComputeSummary | None
    efficiency: EfficiencySummary
    kinds: list[str]


class StudyStats(TypedDict):
    """``stats.analyse``: every treatment against control; ``provenance`` added when written."""

    estimand: str
    procedure: str
    level: float
    resamples: int
    seed: int
    missing_policy: str
    power: float
    multiplicity: str
    family_size: int
    comparisons: list[Comparison]
    provenance: NotRequired[dict[str, str]]
    iso_compute: NotRequired[dict[str, Any]]
    """Each acceleration arm against its plain arms of equal compute (``analysis.isocompute.section``)."""
    sequential: NotRequired[dict[str, Any]]
    """A group-sequential study's looks, where it stopped and what that saved (``analysis.looks.section``)."""
