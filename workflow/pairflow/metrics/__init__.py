"""Metric registry: every metric declares its meaning where it is registered.

A metric is a pure function over decoded uint8 ``(F, H, W, 3)`` RGB frames plus a
declared spec: name, version, kind (``NR`` per video, ``FR`` against the control video
of the same prompt and seed, ``prompt`` against the prompt text), direction, range,
source, and the weight files it needs (keys of ``weights.WEIGHTS``, bound to their
xxh3 digests from the mirror's lock when a score is recorded). pyiqa-backed metrics
take their FR/NR mode, direction and range from pyiqa's own table
(``DEFAULT_CONFIGS``) instead of retyping it.

One module per VBench dimension (VBench's decomposition); models are loaded once per
worker process (``models.load``; a scoring worker's warm-up loads them before its first
task: ``warm``) and frames go through them in batches. A module registers its scorer
with the ``@metric(name, ..., spec=...)`` decorator, and the registry finds it: every
module of this package is imported once, when the package is (as ``arms.registry`` finds
arm kinds). A new metric is its module, its test and its row in docs/metrics-and-verdicts.md; the
config schema's ``scorers`` enum is filled in from ``METRICS``. Metric modules import only
numpy and this package at module level (torch, pyiqa and the models inside the functions
that score), so finding them all costs milliseconds and a driver that only needs specs
never imports torch.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import metadata
from importlib.util import find_spec, module_from_spec, spec_from_file_location
from pathlib import Path
from typing import Any

import numpy as np

from .. import progress
from ..errors import ConfigError, PairingError, ScoringError
from . import models
from .weights import WEIGHTS

# Lazy on purpose: torch and pyiqa are imported inside the functions that score: the registry (names, specs,
# weights) imports without them.



@dataclass(frozen=True)
class MetricSpec:
    """What a score means. ``kind``: 'NR' (per video), 'FR' (against the control video
    of the same prompt and seed) or 'prompt' (against the prompt text). ``needs``: keys
    of ``weights.WEIGHTS``. ``vbench_reader``: how VBench 0.1.5 reads this dimension's
    videos, ``decord`` (follows the stream's tags: BT.709 on PairFlow's videos) or
    ``opencv`` (OpenCV 4.x ``VideoCapture``: BT.601 limited range whatever the tags);
    empty for metrics that are not VBench dimensions. ``scoring/decode: vbench`` decodes
    each metric's frames that way (``stages.scoring.metric_decoding``)."""

    name: str
    version: str
    kind: str
    higher_is_better: bool
    range: str
    source: str
    needs: tuple[str, ...] = ()
    vbench_reader: str = ""

    def asdict(self, digests: dict[str, str] | None = None) -> dict[str, Any]:
        """The spec as written into a score record: ``weights`` lists each needed file
        (path in the mirror) with its verified xxh3 digest (None when not yet verified)."""
        d = asdict(self)
        d.pop("needs")
        d.pop("vbench_reader")  # the record says how its frames were decoded (``decoded_with``)
        d["weights"] = [[WEIGHTS[k].path, (digests or {}).get(WEIGHTS[k].path)] for k in self.needs]
        return d


@dataclass(frozen=True)
class ScoreContext:
    """What a metric may use besides frames: the weight mirror, frames per forward pass,
    the video's frame rate (VBench samples some dimensions by time), the torch device every
    model and tensor of a metric lives on (``cpu``, or ``cuda`` in a worker slot that was
    granted a GPU: ``stages.scoring.scoring_device``; a metric moves its frames there once
    and runs its batches there) and the precision of the CLIP image towers (``fp32``, or
    ``fp16`` as VBench runs CLIP on GPUs: weights and activations in half precision, layer
    norms in float32). Every other model runs in float32. Device and precision are part of
    the scorer build's digest, so both arms of a pair are scored on one kind of device and
    a change of device rescores."""

    mirror: Path | None = None
    batch: int = 16
    fps: int = 8
    device: str = "cpu"
    clip_precision: str = "fp32"


@functools.lru_cache(maxsize=1)
def _pyiqa_table() -> tuple[dict[str, Any], str]:
    """pyiqa's own metric table (``pyiqa/default_model_configs.py``) and pyiqa's version,
    read without importing the pyiqa package (which imports torch: seconds in a driver
    that only needs the table). The table module itself imports nothing but OrderedDict."""
    if "pyiqa" in sys.modules:  # a worker has it already: the same table, no file read
        from pyiqa.default_model_configs import DEFAULT_CONFIGS

        return DEFAULT_CONFIGS, metadata.version("pyiqa")
    pkg = find_spec("pyiqa")
    if pkg is None or not pkg.submodule_search_locations:
        raise ConfigError("pyiqa is not installed; install the environment (envs/pairflow.yaml, or "
                          "`bash workflow/setup.sh` for .venv) before scoring")
    path = Path(next(iter(pkg.submodule_search_locations))) / "default_model_configs.py"
    spec = spec_from_file_location("_pairflow_pyiqa_table", path)
    module = module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.DEFAULT_CONFIGS, metadata.version("pyiqa")


def pyiqa_spec(name: str, version: str, source: str, needs: tuple[str, ...] = ()) -> MetricSpec:
    """A spec whose mode, direction and range come from pyiqa's own metric table."""
    table, pyiqa_version = _pyiqa_table()
    cfg = table[name]
    return MetricSpec(name=name, version=f"{version}+pyiqa-{pyiqa_version}", kind=cfg["metric_mode"],
                      higher_is_better=not cfg.get("lower_better", False), range=str(cfg.get("score_range", "")),
                      source=source, needs=needs)


Scorer = Callable[[str, np.ndarray, "np.ndarray | None", ScoreContext], float]
"""A metric's function: (name, frames, reference or None, context) -> score. The
registry has checked the frames and, for FR metrics, that a reference is given."""

_REGISTERED: dict[str, tuple[MetricSpec | Callable[[str], MetricSpec], Scorer]] = {}


def metric(*names: str, spec: MetricSpec | Callable[[str], MetricSpec]) -> Callable[[Scorer], Scorer]:
    """Register the decorated function as the scorer of ``names``. ``spec`` is the
    metric's declared spec, or a function of the name building it (pyiqa-backed specs
    read pyiqa's table, so they are built when first asked for, not at import)."""

    def register(fn: Scorer) -> Scorer:
        for name in names:
            if not fn.__module__.startswith(f"{__name__}."):
                raise ConfigError(f"metric {name!r} is registered in {fn.__module__}, outside {__name__}: the "
                                  f"registry finds only the modules of workflow/pairflow/metrics/; put it in one")
            if name in _REGISTERED and _REGISTERED[name][1] is not fn:
                raise ConfigError(f"metric {name!r} is registered twice: in {_REGISTERED[name][1].__module__} and "
                                  f"in {fn.__module__}; rename one")
            _REGISTERED[name] = (spec, fn)
        return fn

    return register


def _registered(name: str) -> tuple[MetricSpec | Callable[[str], MetricSpec], Scorer]:
    if name not in _REGISTERED:
        raise ConfigError(f"scorer {name!r} is not registered; known: {', '.join(METRICS)}")
    return _REGISTERED[name]


@functools.cache
def metric_spec(name: str) -> MetricSpec:
    """The declared spec of a registered metric. Raises ConfigError for unknown names."""
    spec = _registered(name)[0]
    return spec if isinstance(spec, MetricSpec) else spec(name)


def needed_weights(names: list[str] | tuple[str, ...]) -> list[str]:
    """The weight keys the named metrics need, sorted, each once."""
    return sorted({k for n in names for k in metric_spec(n).needs})


def score(name: str, frames: np.ndarray, reference: np.ndarray | None = None,
          ctx: ScoreContext | None = None) -> float:
    """Score uint8 (F, H, W, 3) ``frames`` (against ``reference`` for FR metrics).

    Raises ConfigError for an FR metric without a reference, ScoringError when the
    frames cannot be scored (too few, too small), WeightsError when a needed weight
    file is not in the mirror or differs from its lock."""
    ctx = ctx or ScoreContext()
    if ctx.device != "cpu":
        check_device(ctx.device)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ConfigError(f"metric {name} takes uint8 (F, H, W, 3) frames, got {frames.dtype} {frames.shape}")
    spec = metric_spec(name)
    if spec.kind == "FR" and reference is None:
        raise ConfigError(f"metric {name} is full-reference and needs the control video")
    if reference is not None and reference.shape != frames.shape:
        raise PairingError(f"metric {name}: cannot compare videos of shapes {frames.shape} and {reference.shape}")
    value = float(_registered(name)[1](name, frames, reference, ctx))
    progress.report(f"scored {name} on {frames.shape[0]} frames")  # the job's stall check sees it
    return value


def check_device(device: str) -> None:
    """Refuse a scoring device torch cannot use here (ScoringError naming it and why)."""
    import torch

    if device.split(":")[0] != "cuda":
        raise ScoringError(f"scoring device {device!r} is not one PairFlow scores on; it scores on 'cpu' or 'cuda'")
    if not torch.cuda.is_available():
        raise ScoringError(f"scoring device {device!r}: this worker's torch {torch.__version__} sees no CUDA device "
                           f"(CUDA_VISIBLE_DEVICES, driver or a CPU-only wheel); its slot was granted a GPU, so "
                           "check the node's driver with benchmarks/gpu_check.sh or run the job without a GPU grant")


def warm(names: list[str] | tuple[str, ...], ctx: ScoreContext,
         weights: list[str] | tuple[str, ...] = ()) -> dict[str, float]:
    """Make this process ready to score ``names``, so its first score task does only
    scoring: import the metrics' modules and the libraries their models are built with
    (``import_s``, seconds), then build every model their weight files make (with
    ``weights``, e.g. RAFT for the static filter: ``models.for_weights``) on
    ``ctx.device``, the CLIP towers at ``ctx.clip_precision``, into the cache the metrics
    read (``models.load``; ``load_s``, seconds). Weight-free metrics load nothing. Raises
    ConfigError for an unknown metric, ScoringError for a device torch cannot use here
    and WeightsError (``models.load``) for a missing or altered weight file, as scoring
    would."""
    started = time.perf_counter()
    if ctx.device != "cpu":
        check_device(ctx.device)
    for name in names:
        _registered(name)  # imports its module
    built = models.for_weights(sorted(set(needed_weights(names)) | set(weights)))
    for m in built:
        for library in models.LIBRARIES[m]:
            importlib.import_module(library)
    imported = time.perf_counter()
    mirror = str(ctx.mirror or "")
    for m in built:
        models.load(m, mirror, ctx.clip_precision if m in models.CLIP_MODELS else "fp32", ctx.device)
    return {"import_s": imported - started, "load_s": time.perf_counter() - imported}


def _discover() -> tuple[str, ...]:
    """Import every module of this package (each registers its metrics with ``@metric``)
    and return the registered names, sorted."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f".{info.name}", __name__)
    return tuple(sorted(_REGISTERED))


METRICS = _discover()
"""Every registered metric name, sorted (the config schema's ``scorers`` enum)."""
