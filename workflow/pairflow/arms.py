"""Arms beyond caches: what each kind of change needs before and while it runs.

An arm (``config.ArmSpec``) is a declared change to control of one or more kinds:
``cache`` (a diffusers cache config), generation overrides (``steps``, ``guidance``,
``scheduler``), ``model`` (another checkpoint, e.g. a distilled student), ``dtype``,
``attention_backend`` and ``search`` (best of N under a verifier metric). This module
checks every kind before any model loads (``check_arms``), picks the pipeline an arm
runs on (``arm_pipeline``) and runs an arm for one pair (``run_arm``), including the
search's N candidates.

Search seeds. Candidate 0 of a pair replays the pair's stream seed, the noise every
other arm of the pair starts from; candidate i >= 1 uses
``xxh3_64(canonical_json(["search", stream_seed, i])) & (2**63 - 1)`` (``search_seeds``).
So candidate seeds depend only on the pair, never on worker or order, and a best-of-N arm
always contains the control's own sample among its candidates.

Cost. A search arm's video costs all N generations and all N verifier scorings: its
compute count adds every candidate's, its timed latency is the wall time of the whole
search (generation and scoring), and every candidate's seed, score, frame digest and
compute is kept in the record as evidence.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from .config import ArmSpec, GenerationSpec, ModelSpec
from .errors import ConfigError
from .identity import canonical_json

log = logging.getLogger(__name__)

def search_seeds(stream_seed: int, n: int) -> list[int]:
    """The generator seeds of a search arm's ``n`` candidates for a pair whose stream seed
    is ``stream_seed`` (see the module docstring for the derivation)."""
    return [stream_seed] + [xxhash.xxh3_64_intdigest(canonical_json(["search", stream_seed, i])) & 0x7FFF_FFFF_FFFF_FFFF
                            for i in range(1, n)]


def _component(model: ModelSpec, part: str) -> dict[str, Any] | None:
    from .generate import _model_root

    path = _model_root(model) / part / "config.json" if part != "model_index" else _model_root(model) / \
        "model_index.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _with_defaults(cfg: dict[str, Any]) -> dict[str, Any]:
    """A component's ``config.json`` with the keys it leaves out filled from its diffusers
    class's defaults, as ``from_pretrained`` fills them (a checkpoint saved by an older
    diffusers lacks keys a newer one reads, e.g. AutoencoderKLWan's ``scale_factor_*``)."""
    import inspect

    import diffusers

    cls = getattr(diffusers, str(cfg.get("_class_name")), None)
    if cls is None:
        return cfg
    params = inspect.signature(cls.__init__).parameters.values()
    return {**{p.name: p.default for p in params if p.default is not inspect.Parameter.empty}, **cfg}


def _compression(vae: dict[str, Any]) -> tuple[Any, Any]:
    """(spatial, temporal) compression of a VAE config, read as the pipelines read it:
    Wan's ``scale_factor_spatial``/``_temporal``; else HunyuanVideo's and LTX's
    ``spatial_``/``temporal_compression_ratio``; else LTX's ``patch_size`` times 2 per
    ``spatio_temporal_scaling`` stage; else CogVideoX's 2 per ``block_out_channels`` stage
    after the first (spatial) and ``temporal_compression_ratio``. None where a VAE says nothing."""
    spatial = vae.get("scale_factor_spatial") or vae.get("spatial_compression_ratio")
    temporal = vae.get("scale_factor_temporal") or vae.get("temporal_compression_ratio")
    stages = vae.get("spatio_temporal_scaling")
    if stages is not None:
        spatial = spatial or vae.get("patch_size", 1) * 2 ** sum(map(bool, stages))
        temporal = temporal or vae.get("patch_size_t", 1) * 2 ** sum(map(bool, stages))
    if spatial is None and vae.get("block_out_channels"):
        spatial = 2 ** (len(vae["block_out_channels"]) - 1)
    return spatial, temporal


def latent_signature(model: ModelSpec) -> dict[str, Any] | None:
    """What decides the latents ``model`` draws from a seed, i.e. their shape for a given
    video size: the pipeline class, the VAE's latent channels (``z_dim`` or
    ``latent_channels``) and spatial and temporal compression, the transformer's input
    channels (the channels the pipelines draw noise in) and temporal patch (CogVideoX pads
    latent frames to it). Not the widths inside the VAE or the transformer, which change
    no latent. None when the model is not on disk yet."""
    index = _component(model, "model_index")
    if index is None:
        return None
    vae = _with_defaults(_component(model, "vae") or {})
    transformer = _with_defaults(_component(model, "transformer") or {})
    spatial, temporal = _compression(vae)
    return {"pipeline class": index.get("_class_name"),
            "VAE latent channels": vae.get("z_dim", vae.get("latent_channels")),
            "VAE spatial compression": spatial, "VAE temporal compression": temporal,
            "transformer input channels": transformer.get("in_channels"),
            "transformer temporal patch": transformer.get("patch_size_t")}


def check_same_latents(arm: ArmSpec, model: ModelSpec) -> None:
    """Refuse a ``model`` arm whose checkpoint would not draw the same initial noise as
    the study's model from the same seed (``latent_signature`` differs: another pipeline
    class, latent channels or compression): its pairs would not share their noise. A
    student whose VAE or transformer differs only in inner widths passes. Skipped while
    either model is not on disk (the embedded model is built by a rule; generation checks
    again)."""
    if arm.model is None:
        return
    a, b = latent_signature(model), latent_signature(arm.model)
    if a is None or b is None:
        if b is None and arm.model.kind != "hub-mirror":
            raise ConfigError(f"arm {arm.name!r}: key 'arms/{arm.name}/model/path' is {str(arm.model.path)!r}, which "
                              "has no model_index.json; point it at a diffusers checkpoint directory")
        return
    diff = [f"{k} {b[k]} (the study's model: {a[k]})" for k in a if a[k] != b[k]]
    if diff:
        raise ConfigError(f"arm {arm.name!r}: key 'arms/{arm.name}/model/path' is {str(arm.model.path)!r}, which "
                          f"makes other latents than the study's model {model.path} from the same seed: "
                          f"{'; '.join(diff)}. A pair must share its initial noise: use a student with the "
                          "teacher's pipeline class, latent channels and VAE compression (inner widths may differ)")


def check_arms(arms: tuple[ArmSpec, ...], model: ModelSpec) -> None:
    """Every check of every arm that needs no weights loaded: caches (class, params,
    support by the arm's transformer: ``generate.check_arms``), scheduler class and
    params, attention backend usable on this machine, a student's latent compatibility,
    and a search verifier that is an NR metric. Raises ConfigError naming the arm, the
    key, the value and what is allowed."""
    from . import generate as g

    g.check_arms(arms, model)
    for arm in arms:
        if arm.scheduler_class is not None:
            g.scheduler_class(arm)
        if arm.attention_backend is not None:
            g.check_attention_backend(arm, g._device())
        check_same_latents(arm, model)
        if arm.search is not None:
            check_verifier(arm)



def arms_check_key(arms: tuple[ArmSpec, ...], model: ModelSpec) -> str:
    """What the arms' check depends on besides the model files (rule ``check_arms`` takes
    those as inputs): every field of every arm (students included), the model's identity
    and the installed diffusers version, read from package metadata so that planning
    never imports diffusers or torch. A change reruns the check (a ``params`` trigger)."""
    from .envinfo import package_version
    from .identity import digest_obj

    return digest_obj({"arms": [a.asdict() for a in arms], "model": model.identity(),
                       "diffusers": package_version("diffusers")})


def arms_check_inputs(arms: tuple[ArmSpec, ...], model: ModelSpec) -> list[Path]:
    """The model files the arms' check reads that exist when the run is planned: the
    ``model_index.json``, transformer config and VAE config of the study's model and of
    each arm's own model (a student: ``latent_signature`` reads all three). The embedded
    model is left out: its files appear when its rule builds it, and rule ``check_arms``
    takes that rule's output instead."""
    from .generate import _model_root

    models = [m for m in (model, *(a.model for a in arms)) if m is not None and m.kind != "embedded-tiny"]
    files = (_model_root(m) / part for m in models
             for part in ("model_index.json", "transformer/config.json", "vae/config.json"))
    return sorted({f for f in files if f.is_file()})


def write_arms_check(arms: tuple[ArmSpec, ...], model: ModelSpec, out: Path) -> None:
    """Rule ``check_arms``: run ``check_arms`` (imports diffusers, in the rule's own
    process, never the planning one) and, when every arm passes, write ``out`` with the
    check's key. Generation jobs take ``out`` as input, so no model loads before the arms
    passed. Raises ConfigError naming the arm, the key, the value and the fix."""
    from .atomic import write_text

    check_arms(arms, model)
    write_text(out, json.dumps({"check": "arms", "passed": True, "arms": [a.name for a in arms],
                                "key": arms_check_key(arms, model)}, indent=1) + "\n")
    log.info("arms %s passed their check against %s", [a.name for a in arms], model.path)


def check_verifier(arm: ArmSpec) -> None:
    """A search verifier must be a registered NR metric (it scores one video alone)."""
    from .metrics import metric_spec

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


def arm_model(arm: ArmSpec, model: ModelSpec) -> ModelSpec:
    return arm.model or model


def arm_pipeline(arm: ArmSpec, model: ModelSpec, gen: GenerationSpec) -> Any:
    """The pipeline ``arm`` runs on: its own checkpoint and dtype where it declares them
    (loaded once per worker process, like control's)."""
    from .generate import load_pipeline

    if arm.model is not None:
        check_same_latents(arm, model)  # the embedded model exists by now
    return load_pipeline(arm_model(arm, model), arm.dtype or gen.dtype, gen.threads)


@dataclass(frozen=True)
class ArmResult:
    """One arm's video for one pair. ``seconds``: wall time of everything the arm did for
    it (all search candidates and their scorings); ``compute``: summed counts (None when
    not counted); ``candidates``: a search's evidence, one entry per candidate."""

    frames: Any
    seconds: float
    peak_rss_mb: float
    device: str
    threads: int
    compute: dict[str, Any] | None
    candidates: tuple[dict[str, Any], ...] = ()
    chosen: int | None = None
    measured: Any = None  # the compute.FlopTable a run counted in full measured, or None
    memory: Any = None  # telemetry.PhaseMemory over every generation of the arm (denoise, decode)


def run_arm(pipe: Any, prompt: str, stream_seed: int, arm: ArmSpec, gen: GenerationSpec, tokens: int | None,
            count: bool = False, verifier: Any = None, table: Any = None, full: bool = True,
            table_key: str | None = None) -> ArmResult:
    """Run ``arm`` for one pair. Without ``search``: one generation from ``stream_seed``.
    With it: N candidates (``search_seeds``), each generated and scored with ``verifier``
    (a callable uint8 (F, H, W, 3) frames -> float, ``higher_is_better`` attribute), and
    the best kept (ties: the lowest index). ``count``: count compute (bulk pass only);
    ``full``, ``table``: count FLOPs in full (cross-checked against ``table``) or derive
    them from ``table`` (``compute.counting``). A run counted in full under ``table_key``
    returns the ``FlopTable`` it measured (``ArmResult.measured``)."""
    from .compute import ComputeCount, measure
    from .generate import generate

    if arm.search is None:
        r = generate(pipe, prompt, stream_seed, arm, gen, tokens, count=count, table=table, full=full)
        measured = None
        if r.count is not None and r.count.method == "counted" and table_key is not None:
            measured = measure(r.count, table_key, {r.count.total_flops - r.count.transformer_flops}, {0})
        return ArmResult(r.frames, r.seconds, r.peak_rss_mb, r.device, r.threads, r.compute, measured=measured,
                         memory=r.memory)
    if verifier is None:
        raise ConfigError(f"arm {arm.name!r} searches (search: n={arm.search.n}), so run_arm needs its verifier; "
                          "pass arms.verifier_for(arm, study)")
    from .identity import digest_bytes
    from .video import prepare_frames

    total = ComputeCount() if count else None
    evidence: list[dict[str, Any]] = []
    best: int | None = None
    best_frames: Any = None
    seconds, last = 0.0, None
    rest: set[int] = set()
    vseen: set[int] = set()
    memory: Any = None
    for i, seed in enumerate(search_seeds(stream_seed, arm.search.n)):
        r = last = generate(pipe, prompt, seed, arm, gen, tokens, count=count, table=table, full=full)
        counted = r.count is not None and r.count.method == "counted"
        if memory is None:
            memory = r.memory
        elif r.memory is not None:
            memory.merge(r.memory)
        started = time.perf_counter()
        frames, _ = prepare_frames(r.frames, verifier.encoder)
        value, vflops = verifier(frames, count and (counted or table is None))
        if count and not counted:
            vflops = table.verifier  # derived: one scoring's FLOPs from the table
        seconds += r.seconds + time.perf_counter() - started
        if total is not None and r.count is not None:
            total.add(r.count)
            total.verifier_flops += vflops
            if counted:
                rest.add(r.count.total_flops - r.count.transformer_flops)
                vseen.add(vflops)
        evidence.append({"index": i, "seed": seed, "score": value, "raw_digest": digest_bytes(frames.tobytes()),
                         "generate_s": r.seconds, "compute": r.compute})
        better = best is None or (value > evidence[best]["score"] if verifier.higher_is_better
                                  else value < evidence[best]["score"])
        if better:
            best, best_frames = i, r.frames
    if last is None or best is None:
        raise ConfigError(f"arm {arm.name!r}: search n={arm.search.n}; a search needs n >= 1 candidates "
                          f"(set arms.{arm.name}.search.n to 1 or more)")
    compute, measured = None, None
    if total is not None:
        methods = {e["compute"]["method"] for e in evidence if e["compute"]}
        total.method = "counted" if "counted" in methods else "derived"
        total.table = table.key if table is not None else None
        checks = [e["compute"]["cross_check"] for e in evidence if e["compute"] and "cross_check" in e["compute"]]
        if checks:
            total.cross_check = {"derived_transformer_flops": sum(c["derived_transformer_flops"] or 0 for c in checks),
                                 "equal": all(c["equal"] for c in checks)}
        compute = {**total.asdict(), "verifier": arm.search.verifier}
        if methods == {"counted"} and table_key is not None:
            measured = measure(total, table_key, rest, vseen)
    return ArmResult(best_frames, seconds, last.peak_rss_mb, last.device, last.threads, compute, tuple(evidence),
                     best, measured, memory)


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
        from .metrics import ScoreContext, score

        ctx = ScoreContext(mirror=self.mirror, batch=self.batch, fps=self.fps, device=self.device)
        if not count:
            return float(score(self.name, frames, None, ctx)), 0
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as fc:
            value = float(score(self.name, frames, None, ctx))
        return value, int(fc.get_total_flops())


def verifier_for(arm: ArmSpec, study: Any) -> Verifier | None:
    """The study's verifier for a search arm, or None for any other arm."""
    if arm.search is None:
        return None
    from .generate import _device
    from .metrics import metric_spec

    # on the generating worker's device: a search scores where it generates
    return Verifier(arm.search.verifier, metric_spec(arm.search.verifier).higher_is_better, study.encoder,
                    study.weights.mirror, study.scoring.batch, study.generation.fps, _device())
