"""Seeded, paired generation with a pipeline loaded once per worker process.

The pipeline is loaded with ``DiffusionPipeline.from_pretrained`` (the embedded tiny
model takes the same path as a real checkpoint) and kept in a module-level cache, so a
Parsl worker that runs many candidates loads it once. Each kind of change an arm
declares (``pairflow.arms.kinds``: a cache, a scheduler, an attention backend, ...) is
applied for its video and restored in ``finally``: a failure never leaks an arm's state
into the next candidate of the worker.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import logging
import os
import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import arms, progress
from ..errors import ConfigError, FrameError
from ..fleet.telemetry import PhaseMemory
from ..identity import digest_tree
from ..plan.config import ArmSpec, GenerationSpec, ModelSpec
from .compute import counting

log = logging.getLogger(__name__)

_PIPELINES: dict[tuple[str, str, str], Any] = {}
LOAD_COUNTS: dict[str, int] = {}
"""How many times this process loaded each model (key: model path); goes into records."""


_device = arms.device
"""Where this process generates (``arms.device``): ``cuda`` when torch can use a GPU."""


CUDA_SETTINGS = {"cudnn_benchmark": False, "cudnn_deterministic": True, "matmul_tf32": False, "cudnn_tf32": False}
"""Pinned for bulk and timed runs alike, so both compute the same frames at a stable speed:
no cuDNN autotuning (it picks kernels by timing them, so speed and sometimes results vary
run to run), deterministic cuDNN kernels, and no TF32 in float32 matmuls and convolutions."""


def pin_cuda() -> dict[str, Any] | None:
    """Apply ``CUDA_SETTINGS`` where CUDA is in use and return the settings as torch now
    reports them (for records); None on CPU."""
    import torch  # heavy: workers only

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


@contextlib.contextmanager
def no_load_bars() -> Iterator[None]:
    """diffusers' and transformers' progress bars ("Loading pipeline components...",
    "Loading weights", "Writing model shards") off inside the block and restored after: in
    a job that loads or saves in its driver (the timed pass, the tiny model's build) they
    would reach the console; the job's log says what was loaded and how long it took."""
    from diffusers.utils import logging as d_logging
    from transformers.utils import logging as t_logging

    was = [(m, m.is_progress_bar_enabled()) for m in (d_logging, t_logging)]
    for m, _ in was:
        m.disable_progress_bar()
    try:
        yield
    finally:
        for m, on in was:
            if on:
                m.enable_progress_bar()


def load_pipeline(model: ModelSpec, dtype: str, threads: int) -> Any:
    """Return this process's pipeline for ``model``, loading it on first use.

    Sets torch's intra-op thread count to ``threads`` (outputs depend on it). With
    ``kind: hub-mirror`` the id and revision are resolved from the local mirror at
    ``model.path`` with ``local_files_only``; nothing is downloaded (jobs also run with
    HF_HUB_OFFLINE=1, see ``jobenv.cache_env``).
    """
    import torch  # heavy: workers only, never the planning process
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
                              f"model run '{arms.BUILD_RULE}' in the project (the rule that builds it), "
                              "otherwise point 'model/path' at a diffusers checkpoint directory")
        kwargs, source = {}, str(model.path)
    started = time.perf_counter()
    with no_load_bars():
        pipe = DiffusionPipeline.from_pretrained(source, dtype=arms.torch_dtype(dtype), **kwargs)
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
    return index_imports(model.root)


def index_imports(root: Path) -> float:
    """``pipeline_imports`` for the model in folder ``root`` (``preload`` has no ModelSpec)."""
    index = root / "model_index.json"
    if not index.is_file():
        return 0.0
    started = time.perf_counter()
    spec = json.loads(index.read_text())
    import diffusers  # heavy: workers only

    getattr(diffusers, spec.get("_class_name", ""), None)
    for value in spec.values():
        if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
            try:
                getattr(importlib.import_module(value[0]), value[1], None)
            except ImportError:
                continue  # from_pretrained names the missing library itself
    return time.perf_counter() - started


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
    cpu_seconds: float | None = None  # CPU time of this process (every thread) over the same interval as ``seconds``
    wait_seconds: float | None = None  # of ``seconds``, the calling thread's wait for a CPU (``run_queue_wait``)


_SCHEDSTAT = Path("/proc/thread-self/schedstat")


def run_queue_wait() -> float | None:
    """Seconds the calling thread has so far spent runnable but waiting for a CPU (Linux's
    ``/proc/thread-self/schedstat``, its second field), or None where the kernel does not
    say. Across an interval it tells how much of a wall time other processes on the same
    cores took: a generation's wall time is its CPU time plus this wait (plus any I/O)."""
    try:
        return int(_SCHEDSTAT.read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def _report_step(steps: int) -> Any:
    """A diffusers ``callback_on_step_end`` that reports each finished denoising step as
    progress (``progress.report``: the job's stall check) and changes nothing."""
    def callback(pipe: Any, step: int, timestep: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        progress.report(f"denoising step {step + 1}/{steps}")
        return {}

    return callback


def effective_generation(arm: ArmSpec, gen: GenerationSpec) -> GenerationSpec:
    """The generation settings an arm runs with: the study's, with the overrides of the
    kinds it declares (steps, guidance, dtype, ...; ``arms.effective_generation``)."""
    return arms.effective_generation(arm, gen)


def generate(pipe: Any, prompt: str, seed: int, arm: ArmSpec, gen: GenerationSpec,
             max_sequence_length: int | None = None, count: bool = False, table: Any = None,
             full: bool = True) -> GenerationResult:
    """Generate one video from a fresh ``torch.Generator`` seeded with ``seed``.

    ``gen`` is the study's generation spec; the arm's steps and guidance override it.
    Every kind the arm declares (its scheduler, attention backend, cache, ...) is applied
    for this call only and always restored afterwards (``arms.applied``; ``pipe`` is
    shared by every arm of a worker). ``count``: count the transformer's work
    (``compute.counting``; for the bulk pass, never the timed one): with ``full`` its
    FLOPs are counted by FlopCounterMode (cross-checked against ``table`` when given),
    otherwise derived from ``table`` (a ``FlopTable``);
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
    import torch  # heavy: workers only, never the planning process

    eff = effective_generation(arm, gen)
    kwargs: dict[str, Any] = {}
    if max_sequence_length is not None:
        kwargs["max_sequence_length"] = max_sequence_length
    device = _device()
    with arms.applied(arm, pipe, device):  # each declared kind's change, restored in finally
        generator = torch.Generator(device="cpu").manual_seed(seed)
        counter = counting(pipe.transformer, table, full) if count else contextlib.nullcontext()
        if device == "cuda":
            torch.cuda.synchronize()
        started, cpu_started, wait_started = time.perf_counter(), time.process_time(), run_queue_wait()
        if "callback_on_step_end" in inspect.signature(pipe.__call__).parameters:
            kwargs["callback_on_step_end"] = _report_step(eff.steps)
        memory = PhaseMemory(device == "cuda")
        with torch.inference_mode(), counter as work, memory.track(pipe):
            out = pipe(prompt=prompt, negative_prompt=gen.negative_prompt, height=gen.height,
                       width=gen.width, num_frames=gen.frames, num_inference_steps=eff.steps,
                       guidance_scale=eff.guidance, generator=generator, output_type="np", **kwargs)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
        wait_ended = run_queue_wait()
        waited = wait_ended - wait_started if wait_started is not None and wait_ended is not None else None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    frames = out.frames[0]
    if len(frames) != gen.frames:
        raise FrameError(f"{type(pipe).__name__} returned {len(frames)} frames for generation/frames "
                         f"{gen.frames}; this model family's VAE decodes another count for that length. Pick "
                         "a frame count the family supports (e.g. 9, 17, 49 for 4x temporal compression)")
    return GenerationResult(frames, seconds, peak, device, torch.get_num_threads(),
                            work.asdict() if work is not None else None, work, memory, cpu_seconds, waited)


def text_tokens(pipe: Any, gen: GenerationSpec) -> int | None:
    """Text tokens per prompt (the pipeline's ``max_sequence_length``), or None when the
    pipeline takes no such argument.

    ``generation/max_text_tokens`` when set; otherwise the smallest of the pipeline's
    default, the transformer's configured maximum (``max_text_seq_length``, e.g.
    CogVideoX's) and the tokenizer's ``model_max_length`` (the embedded tiny model's 64).
    Raises ConfigError when the configured value exceeds the transformer's maximum: a
    longer text would fail deep inside diffusers with a tensor-size mismatch.
    """
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
    path = Path(model.path)
    return digest_tree(path) if path.is_dir() else {}
