"""Seeded, paired generation with a pipeline loaded once per worker process.

The pipeline is loaded with ``DiffusionPipeline.from_pretrained`` (the embedded tiny
model takes the same path as a real checkpoint) and kept in a module-level cache, so a
Parsl worker that runs many candidates loads it once. A treatment's cache is enabled
for its video and disabled in ``finally``: a failure never leaks cache state.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import progress
from .config import ArmSpec, GenerationSpec, ModelSpec
from .errors import ConfigError

log = logging.getLogger(__name__)

_PIPELINES: dict[tuple[str, str, str], Any] = {}
LOAD_COUNTS: dict[str, int] = {}
"""How many times this process loaded each model (key: model path); goes into records."""


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


CUDA_SETTINGS = {"cudnn_benchmark": False, "cudnn_deterministic": True, "matmul_tf32": False, "cudnn_tf32": False}
"""Pinned for bulk and timed runs alike, so both compute the same frames at a stable speed:
no cuDNN autotuning (it picks kernels by timing them, so speed and sometimes results vary
run to run), deterministic cuDNN kernels, and no TF32 in float32 matmuls and convolutions."""


def pin_cuda() -> dict[str, Any] | None:
    """Apply ``CUDA_SETTINGS`` where CUDA is in use and return the settings as torch now
    reports them (for records); None on CPU."""
    import torch

    if _device() != "cuda":
        return None
    torch.backends.cudnn.benchmark = CUDA_SETTINGS["cudnn_benchmark"]
    torch.backends.cudnn.deterministic = CUDA_SETTINGS["cudnn_deterministic"]
    torch.backends.cuda.matmul.allow_tf32 = CUDA_SETTINGS["matmul_tf32"]
    torch.backends.cudnn.allow_tf32 = CUDA_SETTINGS["cudnn_tf32"]
    return {"cudnn_benchmark": torch.backends.cudnn.benchmark,
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "matmul_tf32": torch.backends.cuda.matmul.allow_tf32, "cudnn_tf32": torch.backends.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision()}


def load_pipeline(model: ModelSpec, dtype: str, threads: int) -> Any:
    """Return this process's pipeline for ``model``, loading it on first use.

    Sets torch's intra-op thread count to ``threads`` (outputs depend on it). With
    ``kind: hub-mirror`` the id and revision are resolved from the local mirror at
    ``model.path`` with ``local_files_only``; nothing is downloaded (jobs also run with
    HF_HUB_OFFLINE=1, see ``jobenv.cache_env``).
    """
    import torch
    from diffusers import DiffusionPipeline

    torch.set_num_threads(threads)
    pin_cuda()
    key = (str(model.path), dtype, _device())
    if key in _PIPELINES:
        return _PIPELINES[key]
    if model.kind == "hub-mirror":
        kwargs: dict[str, Any] = {"cache_dir": str(model.path), "revision": model.revision,
                                  "local_files_only": True}
        source = model.id or ""
    else:
        if not (model.path / "model_index.json").is_file():
            raise ConfigError(f"model path {model.path} has no model_index.json; for the embedded "
                              "model run 'snakemake resources/tiny-wan' (the build rule), otherwise "
                              "point 'model/path' at a diffusers checkpoint directory")
        kwargs, source = {}, str(model.path)
    started = time.perf_counter()
    pipe = DiffusionPipeline.from_pretrained(source, dtype=getattr(torch, dtype), **kwargs)
    pipe.to(_device())
    pipe.set_progress_bar_config(disable=True)
    LOAD_COUNTS[str(model.path)] = LOAD_COUNTS.get(str(model.path), 0) + 1
    log.info("loaded %s in %.2fs (load #%d in pid %d)", source, time.perf_counter() - started,
             LOAD_COUNTS[str(model.path)], os.getpid())
    _PIPELINES[key] = pipe
    return pipe


def pipeline_imports(model: ModelSpec) -> float:
    """Import every module the model's pipeline will need, now, and return the seconds it
    took (about 0 once this process has them). diffusers and transformers import their
    classes lazily, on first attribute access, so without this the pipeline's own module
    and each component's (text encoder, tokenizer, VAE, transformer, scheduler) would be
    imported inside ``from_pretrained`` and booked as model load: 16.6 s of imports
    against 0.8 s of weights for the embedded tiny model on this machine. Reads the
    model's ``model_index.json``; a model not on disk yet imports nothing here."""
    import importlib
    import json

    index = _model_root(model) / "model_index.json"
    if not index.is_file():
        return 0.0
    started = time.perf_counter()
    spec = json.loads(index.read_text())
    import diffusers

    getattr(diffusers, spec.get("_class_name", ""), None)
    for value in spec.values():
        if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
            try:
                getattr(importlib.import_module(value[0]), value[1], None)
            except ImportError:
                continue  # from_pretrained names the missing library itself
    return time.perf_counter() - started


def cache_class(arm: ArmSpec) -> Any:
    """The installed diffusers cache config class an arm names. Raises ConfigError naming
    the arm, the class, the installed diffusers version and the classes it has."""
    import diffusers

    cls = getattr(diffusers, arm.cache_class or "", None)
    if cls is None or not dataclasses.is_dataclass(cls):
        known = sorted(n for n in dir(diffusers) if n.endswith("Config") and dataclasses.is_dataclass(
            getattr(diffusers, n)) and ("Cache" in n or "Broadcast" in n))
        hint = difflib.get_close_matches(arm.cache_class or "", known, n=1)
        raise ConfigError(f"arm {arm.name!r}: key 'arms/{arm.name}/cache/class' is {arm.cache_class!r}, which "
                          f"diffusers {diffusers.__version__} does not have"
                          + (f"; did you mean {hint[0]!r}?" if hint else ".") + f" Cache configs: {known}")
    return cls


def cache_params(arm: ArmSpec, cls: Any) -> dict[str, Any]:
    """The arm's cache parameters type-checked against ``cls``'s dataclass fields and
    converted where YAML cannot say it (a list for a tuple field). Raises ConfigError
    naming the arm, the key, the expected and the given type; callbacks and private fields
    are PairFlow's to set, never the config's."""
    import typing

    hints = typing.get_type_hints(cls)
    settable = sorted(f.name for f in dataclasses.fields(cls)
                      if not f.name.startswith("_") and not _is_callable(hints[f.name]))
    out = {}
    for key, value in arm.cache_params.items():
        where = f"arm {arm.name!r}: key 'arms/{arm.name}/cache/params/{key}'"
        if key not in settable:
            hint = difflib.get_close_matches(key, settable, n=1)
            raise ConfigError(f"{where}: {cls.__name__} has no settable parameter {key!r}"
                              + (f"; did you mean {hint[0]!r}?" if hint else ".") + f" Allowed: {settable}")
        converted = _typed(value, hints[key])
        if converted is _BAD:
            raise ConfigError(f"{where} is {value!r} ({type(value).__name__}); {cls.__name__} expects "
                              f"{_type_name(hints[key])}. Fix the value in the config")
        out[key] = converted
    return out


_BAD = object()


def _is_callable(hint: Any) -> bool:
    import collections.abc
    import typing

    return any(typing.get_origin(h) is collections.abc.Callable or h is collections.abc.Callable
               for h in (hint, *typing.get_args(hint)))


def _type_name(hint: Any) -> str:
    if getattr(hint, "__args__", None):
        return str(hint).replace("typing.", "")
    # get_type_hints resolves every hint, so one without __args__ is a class with a __name__.
    return str(getattr(hint, "__name__", hint))


def _typed(value: Any, hint: Any) -> Any:
    """``value`` (from YAML) as ``hint`` wants it, or ``_BAD``. Only the shapes diffusers'
    cache configs use: int, float, bool, str, None, unions, tuple[T, T], tuple[T, ...], list[T]."""
    import types
    import typing

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is type(None):
        return None if value is None else _BAD
    if origin in (typing.Union, types.UnionType):
        for h in args:
            got = _typed(value, h)
            if got is not _BAD:
                return got
        return _BAD
    if hint is bool:
        return value if isinstance(value, bool) else _BAD
    if hint is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _BAD
    if hint is float:
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else _BAD
    if hint is str:
        return value if isinstance(value, str) else _BAD
    if origin in (tuple, list) and isinstance(value, (list, tuple)):
        if origin is tuple and args and args[-1] is not Ellipsis and len(args) != len(value):
            return _BAD
        each = [args[0] if (origin is list or args[-1] is Ellipsis) else a
                for a in (args if origin is tuple and args[-1] is not Ellipsis else [None] * len(value))]
        pairs = zip(value, each, strict=False)
        items = [_typed(v, h) if h is not None else v for v, h in pairs] if args else list(value)
        return _BAD if any(i is _BAD for i in items) else (tuple(items) if origin is tuple else items)
    return _BAD  # tensors, dtypes, modules: not expressible in a config


def check_arms(arms: tuple[ArmSpec, ...], model: ModelSpec) -> None:
    """Everything about the arms' caches that can be known without loading weights: the
    class exists in the installed diffusers, its parameters have the right names and types,
    and the transformer of the model the arm runs (its ``model`` or the study's, from
    ``transformer/config.json``) takes that cache (``supported_caches``). Raises
    ConfigError naming the caches that do apply. Run before any model loads
    (``check-config``, the Snakefile); ``arms.check_arms`` runs it with every other check."""
    cached = [(a, a.cache_class) for a in arms if a.cache_class is not None]
    if not cached:
        return  # nothing to check, and no need to import diffusers
    for arm, _ in cached:
        cache_params(arm, cache_class(arm))
    for arm, name in cached:
        m = arm.model or model
        transformer = _transformer_class(m)
        if transformer is None:
            continue  # not on disk yet (the embedded model is built by a rule): checked when it loads
        from diffusers.models.cache_utils import CacheMixin

        if not issubclass(transformer, CacheMixin):
            raise ConfigError(f"arm {arm.name!r}: the model's transformer {transformer.__name__} "
                              f"({m.path}) does not support diffusers caches (no enable_cache); use a "
                              "model whose transformer does, or run only the control arm")
        supported = supported_caches(m)
        if name not in supported:
            raise ConfigError(f"arm {arm.name!r}: key 'arms/{arm.name}/cache/class' is {arm.cache_class!r}, which "
                              f"diffusers cannot apply to {transformer.__name__} ({m.path}): "
                              f"{supported.refused.get(name, '')}")


class _Support(dict[str, bool]):
    """Cache class name -> True for the caches a transformer takes; ``refused`` holds why
    each other one was refused, followed by the list of those that apply."""

    refused: dict[str, str]


@functools.lru_cache(maxsize=8)
def supported_caches(model: ModelSpec) -> _Support:
    """Which of the installed diffusers' cache configs the model's transformer takes:
    each is enabled (with its defaults, and a timestep callback where it needs one) on
    the transformer built from its config on the ``meta`` device (no weights, no
    memory), exactly as ``enable_cache`` would at run time, then disabled. Returns a
    mapping whose keys are the classes that apply, with ``refused`` naming why each other
    class failed (its error, plus the list that applies). Configs whose defaults cannot be
    built (MagCache needs calibrated ratios) count as applying when the transformer's
    blocks are ones diffusers registers; their params are checked at run time."""
    import json

    import torch

    cls = _transformer_class(model)
    config = json.loads(_model_root(model).joinpath("transformer", "config.json").read_text())
    with torch.device("meta"):
        transformer = cls.from_config({k: v for k, v in config.items() if not k.startswith("_")})
    out = _Support()
    refused: dict[str, str] = {}
    quiet = logging.getLogger("diffusers")  # the probe's default-config warnings are not the user's
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        _probe(transformer, out, refused)
    finally:
        quiet.setLevel(level)
    applies = sorted(out)
    out.refused = {k: f"{v}. Caches that apply to {cls.__name__}: {applies}" for k, v in refused.items()}
    return out


def _probe(transformer: Any, out: dict[str, bool], refused: dict[str, str]) -> None:
    """Enable and disable each cache config on ``transformer`` (see ``supported_caches``)."""
    import diffusers

    for name in _cache_names():
        ccls = getattr(diffusers, name)
        kwargs: dict[str, Any] = {}
        if "current_timestep_callback" in {f.name for f in dataclasses.fields(ccls)}:
            kwargs["current_timestep_callback"] = lambda: 500
        try:
            cfg = ccls(**kwargs)
        except (ValueError, TypeError):
            out[name] = True  # needs calibrated params; diffusers checks them when enabling
            continue
        try:
            transformer.enable_cache(cfg)
            out[name] = True
        except (ValueError, TypeError, KeyError, AttributeError, NotImplementedError) as e:
            refused[name] = f"{type(e).__name__}: {e}"
        finally:
            if transformer.is_cache_enabled:
                transformer.disable_cache()


def _cache_names() -> list[str]:
    import diffusers

    return sorted(n for n in dir(diffusers) if n.endswith("Config") and dataclasses.is_dataclass(
        getattr(diffusers, n)) and ("Cache" in n or "Broadcast" in n))


def _model_root(model: ModelSpec) -> Path:
    """Where the model's component folders are (for a hub mirror, the pinned snapshot)."""
    root = Path(model.path)
    if model.kind == "hub-mirror" and model.id and model.revision:
        repo = root / f"models--{model.id.replace('/', '--')}"
        ref = repo / "refs" / model.revision  # a branch or tag name points at a commit
        commit = ref.read_text().strip() if ref.is_file() else model.revision
        root = repo / "snapshots" / commit
    return root


def _transformer_config(model: ModelSpec) -> Path | None:
    """The model's ``transformer/config.json`` (for a hub mirror, in the pinned snapshot
    of the Hugging Face cache layout), or None when it is not on disk yet."""
    config = _model_root(model) / "transformer" / "config.json"
    return config if config.is_file() else None


def _transformer_class(model: ModelSpec) -> Any:
    """The model's transformer class named in ``transformer/config.json`` (for a hub
    mirror, in the pinned snapshot of the Hugging Face cache layout), or None when the
    model is not on disk yet (the embedded model is built by a rule)."""
    import json

    import diffusers

    config = _transformer_config(model)
    if config is None:
        return None
    name = json.loads(config.read_text()).get("_class_name", "")
    cls = getattr(diffusers, name, None)
    if cls is None:
        raise ConfigError(f"model {model.path}: its transformer class {name!r} is not in diffusers "
                          f"{diffusers.__version__}; install the diffusers version the checkpoint needs")
    return cls


def cache_config(arm: ArmSpec, pipe: Any) -> Any:
    """Build the diffusers cache config object an arm names, or None for no cache.

    Configs that need the pipeline's current timestep (PAB, FasterCache) get a callback
    bound to ``pipe``; everything else comes from the arm's params (see ``cache_params``).
    """
    if arm.cache_class is None:
        return None
    cls = cache_class(arm)
    params = cache_params(arm, cls)
    if "current_timestep_callback" in {f.name for f in dataclasses.fields(cls)}:
        params["current_timestep_callback"] = lambda: pipe.current_timestep
    return cls(**params)


@dataclass(frozen=True)
class GenerationResult:
    """Frames from one candidate and how they were made. ``compute`` is the transformer
    work counted (``compute.ComputeCount.asdict``), or None when counting was off."""

    frames: Any  # float32 numpy (F, H, W, 3) in [0, 1]
    seconds: float
    peak_rss_mb: float
    device: str
    threads: int
    compute: dict[str, Any] | None = None
    count: Any = None  # the compute.ComputeCount behind ``compute`` (its per-unit FLOPs), or None
    memory: Any = None  # telemetry.PhaseMemory: peak host RSS and device memory of denoise and decode


def _report_step(steps: int) -> Any:
    """A diffusers ``callback_on_step_end`` that reports each finished denoising step as
    progress (``progress.report``: the job's stall check) and changes nothing."""
    def callback(pipe: Any, step: int, timestep: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        progress.report(f"denoising step {step + 1}/{steps}")
        return {}

    return callback


def effective_generation(arm: ArmSpec, gen: GenerationSpec) -> GenerationSpec:
    """The generation settings an arm runs with: the study's, with the arm's steps,
    guidance and dtype overrides."""
    return dataclasses.replace(gen, steps=arm.steps if arm.steps is not None else gen.steps,
                               guidance=arm.guidance if arm.guidance is not None else gen.guidance,
                               dtype=arm.dtype or gen.dtype)


def scheduler_class(arm: ArmSpec) -> Any:
    """The diffusers scheduler class an arm names. Raises ConfigError naming the arm, the
    class and the scheduler classes the installed diffusers has."""
    import diffusers
    from diffusers import SchedulerMixin

    cls = getattr(diffusers, arm.scheduler_class or "", None)
    if not (isinstance(cls, type) and issubclass(cls, SchedulerMixin)):
        known = sorted(n for n in dir(diffusers) if n.endswith("Scheduler") and isinstance(getattr(diffusers, n), type)
                       and issubclass(getattr(diffusers, n), SchedulerMixin))
        hint = difflib.get_close_matches(arm.scheduler_class or "", known, n=1)
        raise ConfigError(f"arm {arm.name!r}: key 'arms/{arm.name}/scheduler/class' is {arm.scheduler_class!r}, which "
                          f"is not a scheduler of diffusers {diffusers.__version__}"
                          + (f"; did you mean {hint[0]!r}?" if hint else ".") + f" Schedulers: {known}")
    import inspect

    allowed = sorted(k for k in inspect.signature(cls.__init__).parameters if k != "self")
    for key in arm.scheduler_params:
        if key not in allowed:
            hint = difflib.get_close_matches(key, allowed, n=1)
            raise ConfigError(f"arm {arm.name!r}: key 'arms/{arm.name}/scheduler/params/{key}': {cls.__name__} has no "
                              f"such parameter" + (f"; did you mean {hint[0]!r}?" if hint else ".")
                              + f" Allowed: {allowed}")
    return cls


CPU_BACKENDS = ("native", "_native_math", "flex")
"""Attention backends usable without an accelerator (torch's own kernels)."""


def attention_backends(device: str) -> list[str]:
    """The diffusers attention backends usable here: on CPU torch's own (``CPU_BACKENDS``);
    on CUDA every backend whose package diffusers finds, except hub kernels (downloaded
    at run time, which jobs never do)."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _check_attention_backend_requirements

    out = []
    for b in AttentionBackendName:
        if b.value.endswith("_hub") or (device != "cuda" and b.value not in CPU_BACKENDS):
            continue
        if any(k in b.value for k in ("npu", "xla")):
            continue
        try:
            _check_attention_backend_requirements(b)
        except (RuntimeError, ImportError):
            continue
        out.append(b.value)
    return sorted(out)


def check_attention_backend(arm: ArmSpec, device: str) -> None:
    """Refuse an arm's attention backend that diffusers does not offer on ``device``,
    naming the ones it does."""
    if arm.attention_backend is None:
        return
    usable = attention_backends(device)
    if arm.attention_backend not in usable:
        raise ConfigError(f"arm {arm.name!r}: key 'arms/{arm.name}/attention_backend' is {arm.attention_backend!r}, "
                          f"which diffusers cannot use on this {device} machine. Usable here: {usable}")


def generate(pipe: Any, prompt: str, seed: int, arm: ArmSpec, gen: GenerationSpec,
             max_sequence_length: int | None = None, count: bool = False, table: Any = None,
             full: bool = True) -> GenerationResult:
    """Generate one video from a fresh ``torch.Generator`` seeded with ``seed``.

    ``gen`` is the study's generation spec; the arm's steps and guidance override it.
    The arm's scheduler, attention backend and cache are applied for this call only and
    always restored afterwards (``pipe`` is shared by every arm of a worker). ``count``:
    count the transformer's work (``compute.counting``; for the bulk pass, never the
    timed one): with ``full`` its FLOPs are counted by FlopCounterMode (cross-checked
    against ``table`` when given), otherwise derived from ``table`` (a ``FlopTable``);
    a derivation the table cannot make (a unit it never measured) repeats the generation
    counted in full, so a figure is never missing or guessed.
    """
    r = _generate(pipe, prompt, seed, arm, gen, max_sequence_length, count, table, full)
    if r.count is None or r.count.transformer_flops >= 0:
        return r
    log.info("arm %s: FLOP table %s lacks a unit this run called; counting it in full", arm.name, table.key)
    return _generate(pipe, prompt, seed, arm, gen, max_sequence_length, True, table, True)


def _generate(pipe: Any, prompt: str, seed: int, arm: ArmSpec, gen: GenerationSpec, max_sequence_length: int | None,
              count: bool, table: Any, full: bool) -> GenerationResult:
    import contextlib
    import resource

    import torch

    from .compute import counting
    from .telemetry import PhaseMemory

    eff = effective_generation(arm, gen)
    config = cache_config(arm, pipe)
    kwargs: dict[str, Any] = {}
    if max_sequence_length is not None:
        kwargs["max_sequence_length"] = max_sequence_length
    device = _device()
    scheduler = pipe.scheduler
    backend = None
    try:
        if arm.scheduler_class is not None:
            pipe.scheduler = scheduler_class(arm).from_config(scheduler.config, **arm.scheduler_params)
        if arm.attention_backend is not None:
            from diffusers.models.attention_dispatch import _AttentionBackendRegistry

            backend = _AttentionBackendRegistry._active_backend
            check_attention_backend(arm, device)
            pipe.transformer.set_attention_backend(arm.attention_backend)
        if config is not None:
            pipe.transformer.enable_cache(config)
        generator = torch.Generator(device="cpu").manual_seed(seed)
        counter = counting(pipe.transformer, table, full) if count else contextlib.nullcontext()
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        if "callback_on_step_end" in inspect.signature(pipe.__call__).parameters:
            kwargs["callback_on_step_end"] = _report_step(eff.steps)
        memory = PhaseMemory(device == "cuda")
        with torch.inference_mode(), counter as work, memory.track(pipe):
            out = pipe(prompt=prompt, negative_prompt=gen.negative_prompt, height=gen.height,
                       width=gen.width, num_frames=gen.frames, num_inference_steps=eff.steps,
                       guidance_scale=eff.guidance, generator=generator, output_type="np", **kwargs)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
    finally:
        if config is not None:
            pipe.transformer.disable_cache()
        if arm.attention_backend is not None:
            pipe.transformer.reset_attention_backend()
            if backend is not None:  # diffusers keeps the last backend set as the process default
                from diffusers.models.attention_dispatch import _AttentionBackendRegistry

                _AttentionBackendRegistry.set_active_backend(backend)
        pipe.scheduler = scheduler
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    frames = out.frames[0]
    if len(frames) != gen.frames:
        from .errors import FrameError

        raise FrameError(f"{type(pipe).__name__} returned {len(frames)} frames for generation/frames "
                         f"{gen.frames}; this model family's VAE decodes another count for that length. Pick "
                         "a frame count the family supports (e.g. 9, 17, 49 for 4x temporal compression)")
    return GenerationResult(frames, seconds, peak, device, torch.get_num_threads(),
                            work.asdict() if work is not None else None, work, memory)


def text_tokens(pipe: Any, gen: GenerationSpec) -> int | None:
    """Text tokens per prompt (the pipeline's ``max_sequence_length``), or None when the
    pipeline takes no such argument.

    ``generation/max_text_tokens`` when set; otherwise the smallest of the pipeline's
    default, the transformer's configured maximum (``max_text_seq_length``, e.g.
    CogVideoX's) and the tokenizer's ``model_max_length`` (the embedded tiny model's 64).
    Raises ConfigError when the configured value exceeds the transformer's maximum: a
    longer text would fail deep inside diffusers with a tensor-size mismatch.
    """
    import inspect

    param = inspect.signature(type(pipe).__call__).parameters.get("max_sequence_length")
    if param is None:
        return None
    cap = getattr(getattr(pipe, "transformer", None), "config", {}).get("max_text_seq_length")
    if gen.max_text_tokens is not None:
        if cap is not None and gen.max_text_tokens > cap:
            raise ConfigError(f"key 'generation/max_text_tokens' is {gen.max_text_tokens}, but the model's "
                              f"transformer ({type(pipe.transformer).__name__}) takes at most {cap} text tokens; "
                              f"set it to {cap} or less, or leave it unset")
        return int(gen.max_text_tokens)
    tokenizer_max = getattr(getattr(pipe, "tokenizer", None), "model_max_length", None)
    limits = [param.default, cap, tokenizer_max if isinstance(tokenizer_max, int) and tokenizer_max < 1 << 20 else None]
    return min(int(v) for v in limits if isinstance(v, int))


def pipeline_info(pipe: Any, tokens: int | None) -> dict[str, Any]:
    """What records say about the pipeline that ran: its class, the model family (the
    diffusers pipelines subpackage, e.g. ``wan``, ``cogvideo``, ``ltx``), the transformer
    class and the text tokens used."""
    module = type(pipe).__module__.split(".")
    family = module[2] if len(module) > 2 and module[:2] == ["diffusers", "pipelines"] else module[0]
    return {"class": type(pipe).__name__, "family": family,
            "transformer": type(getattr(pipe, "transformer", None)).__name__, "max_text_tokens": tokens}


def model_digests(model: ModelSpec) -> dict[str, str]:
    """xxh3 digest of every file of a local model directory (empty for hub ids)."""
    from .identity import digest_tree

    path = Path(model.path)
    return digest_tree(path) if path.is_dir() else {}
