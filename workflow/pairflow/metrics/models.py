"""Scorer models, each built once per worker process from verified mirror files.

``load(name, mirror)`` checks every file the model needs against the mirror's lock
(``weights.verify``: missing or altered files stop with a message naming the file, the
digests and the mirror command), builds the architecture from code and loads the
state dict from the explicit file path. Nothing here downloads: CLIP is loaded by file
path (bypassing openai-clip's ~/.cache/clip download), and torchvision's AlexNet inside
pyiqa's LPIPS is found in the mirror's torch hub directory, set for the duration of
that one build. ``LOAD_COUNTS`` counts builds per process (the benchmark and tests read it).
``for_weights`` names the models a study's weight files build and ``LIBRARIES`` what each
imports, so a scoring worker's warm-up imports and builds them before its first task
(``pairflow.metrics.warm``).

Also the frame transforms VBench applies before its feature extractors, on float
tensors as VBench's ``load_video`` produces them (``torch.Tensor`` of 0-255 values).
"""

from __future__ import annotations

import contextlib
import math
import warnings
import weakref
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, WeightsError
from .weights import WEIGHTS, verify

# Lazy on purpose: torch, torchvision, timm, pyiqa and clip are imported inside the loaders: only a scoring
# worker needs them.

LOAD_COUNTS: Counter[str] = Counter()

CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

_NEEDS = {"dino": ("dino_vitb16",), "clip_b32": ("clip_vitb32",), "clip_l14": ("clip_vitl14",),
          "aesthetic_head": ("laion_aes_linear",), "musiq_spaq": ("musiq_spaq",), "raft_large": ("raft_large",),
          "lpips": ("alexnet", "lpips_alex_v01")}


LIBRARIES: dict[str, tuple[str, ...]] = {
    "dino": ("timm",), "clip_b32": ("pyiqa.archs.clip_imports",), "clip_l14": ("pyiqa.archs.clip_imports",),
    "aesthetic_head": (), "musiq_spaq": ("pyiqa.archs.musiq_arch",),
    "raft_large": ("torchvision.models.optical_flow",), "lpips": ("pyiqa",)}
"""The libraries each model's build imports (``load``): a warm-up imports them as imports,
so its model loads time the weights alone."""
CLIP_MODELS = ("clip_b32", "clip_l14")
"""The models ``load`` takes a precision for (``ScoreContext.clip_precision``)."""


def needs(name: str) -> tuple[str, ...]:
    return _NEEDS[name]


def for_weights(keys: list[str] | tuple[str, ...]) -> list[str]:
    """The models built from the weight files ``keys`` (keys of ``weights.WEIGHTS``):
    each model whose every file is among them, sorted."""
    have = set(keys)
    return sorted(m for m, files in _NEEDS.items() if set(files) <= have)


def _path(mirror: str, key: str) -> str:
    return str(Path(mirror) / WEIGHTS[key].path)


@contextlib.contextmanager
def _torch_hub_dir(path: Path) -> Iterator[None]:
    """torch.hub's directory set to ``path`` for one build, then restored (torchvision
    finds ``checkpoints/<file>`` there and, the file being present, downloads nothing)."""
    import torch.hub

    old = torch.hub.get_dir()
    torch.hub.set_dir(str(path))
    try:
        yield
    finally:
        torch.hub.set_dir(old)


_CLIP_META_KEYS = ("input_resolution", "context_length", "vocab_size")


def _check_materialised(model: Any, name: str) -> None:
    """Refuse a model with a parameter or buffer the weight file did not fill."""
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise WeightsError(f"scorer model {name}: {left[:3]} not filled by its weight file; the mirror holds "
                           "another architecture's weights: rebuild it with `pairflow mirror --dest DIR`")


CLIP_PRECISIONS = ("fp32", "fp16")


def dino_pos_embed(pos_embed: Any, rows: int, cols: int) -> Any:
    """DINO's own position-embedding interpolation (``interpolate_pos_encoding`` of
    facebookresearch/dino's ViT, which VBench loads): the (1, 1 + N, D) table, class token
    first, for a grid of ``rows`` x ``cols`` patches. Unchanged for the square grid it was
    trained on; otherwise the sqrt(N) x sqrt(N) grid is resampled bicubically by the scale
    factors ``(rows + 0.1) / sqrt(N)`` and ``(cols + 0.1) / sqrt(N)`` (DINO adds 0.1 so the
    output size does not round down), and PyTorch samples at positions set by those factors,
    not by the output size, so the table differs from timm's size-based, antialiased
    resampling on non-square frames (issue 23 measured 2.5-10% relative L2 on DINO's
    released table; the suite checks the difference on a random one)."""
    import torch
    import torch.nn.functional as F

    n, dim = pos_embed.shape[1] - 1, pos_embed.shape[2]
    side = math.isqrt(n)
    if rows == cols and rows * cols == n:
        return pos_embed
    grid = pos_embed[:, 1:].reshape(1, side, side, dim).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, scale_factor=((rows + 0.1) / side, (cols + 0.1) / side), mode="bicubic")
    if tuple(grid.shape[-2:]) != (rows, cols):
        raise ConfigError(f"DINO position embedding resampled to {tuple(grid.shape[-2:])}, expected ({rows}, {cols})")
    return torch.cat([pos_embed[:, :1], grid.permute(0, 2, 3, 1).reshape(1, rows * cols, dim)], dim=1)


def _use_dino_pos_embed(model: Any) -> None:
    """Make timm's ViT (built with ``dynamic_img_size``: patch tokens arrive as (B, H, W, D))
    add DINO's interpolated position embedding instead of timm's."""
    import torch

    def pos_embed(x: Any) -> Any:
        b, rows, cols, dim = x.shape
        tokens = torch.cat([model.cls_token.expand(b, -1, -1), x.reshape(b, rows * cols, dim)], dim=1)
        return model.pos_drop(tokens + dino_pos_embed(model.pos_embed, rows, cols))

    model._pos_embed = pos_embed  # an instance attribute: this model only


_LOADED: dict[tuple[str, str, str, str], Any] = {}
"""This process's built models, by (name, mirror, precision, device): ``load``'s cache."""


def clear_cache() -> None:
    """Forget every model this process built (the next ``load`` builds again)."""
    _LOADED.clear()


def load(name: str, mirror: str, precision: str = "fp32", device: str = "cpu") -> Any:
    """The model ``name`` (a key of ``_NEEDS``) built from the verified files of
    ``mirror``, in eval mode on ``device`` (the worker's: ``ScoreContext.device``);
    cached per (name, mirror, precision, device) for the life of the process, however
    the arguments are spelt (a warm-up's positional call and a metric's keyword call
    find one model; a failed build is not cached, so the next call raises again). Every model is
    float32 except the CLIP towers under ``precision='fp16'`` (VBench's on GPU: openai-clip's
    ``convert_weights``, so weights and activations are half precision and layer norms
    compute in float32). Raises ConfigError for an unknown precision."""
    key = (name, mirror, precision, device)
    if key not in _LOADED:
        _LOADED[key] = _build(*key)
    return _LOADED[key]


def _build(name: str, mirror: str, precision: str, device: str) -> Any:
    import torch

    if precision not in CLIP_PRECISIONS or (precision != "fp32" and name not in CLIP_MODELS):
        raise ConfigError(f"precision {precision!r} for scorer model {name!r}: only the CLIP towers take "
                          f"{CLIP_PRECISIONS}; set scoring/clip_precision to auto, fp32 or fp16")

    verify(Path(mirror) if mirror else None, _NEEDS[name], needed_by=f"scorer model {name}")
    LOAD_COUNTS[name] += 1
    if name == "dino":
        import timm

        # DINO's ViT-B/16 is timm's ViT-B/16 (same keys); dynamic_img_size lets it take
        # non-square frames, whose position embedding is interpolated the DINO way.
        with torch.device("meta"):
            model = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=0,
                                      dynamic_img_size=True)
        state = torch.load(_path(mirror, "dino_vitb16"), map_location="cpu", weights_only=True)
        model.load_state_dict({k.removeprefix("module."): v.float() for k, v in state.items()}, strict=True,
                              assign=True)
        _check_materialised(model, name)
        _use_dino_pos_embed(model)
    elif name in CLIP_MODELS:
        from pyiqa.archs.clip_imports import clip  # openai-clip, imported with pyiqa's warning filter

        # What clip.load(path, jit=False) does, from an explicit file: OpenAI's files are
        # TorchScript archives, a test mirror's are plain state dicts.
        path = _path(mirror, _NEEDS[name][0])
        try:
            state = torch.jit.load(path, map_location="cpu").state_dict()
        except RuntimeError:
            state = torch.load(path, map_location="cpu", weights_only=True)
        # The architecture is built on the meta device and the file's tensors assigned into
        # it: no seconds spent on a random initialisation every parameter then replaces.
        # Only the image tower is used; the text tower's attention mask stays on meta.
        with torch.device("meta"), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter.*")
            model = clip.model.build_model(dict(state))
        model.load_state_dict({k: v for k, v in state.items() if k not in _CLIP_META_KEYS}, strict=True,
                              assign=True)
        model = model.float()
        _check_materialised(model.visual, name)
        if precision == "fp16":
            clip.model.convert_weights(model)
    elif name == "aesthetic_head":
        model = torch.nn.Linear(768, 1)
        model.load_state_dict(torch.load(_path(mirror, "laion_aes_linear"), map_location="cpu", weights_only=True))
    elif name == "musiq_spaq":
        from pyiqa.archs.musiq_arch import MUSIQ

        model = MUSIQ(pretrained=False, pretrained_model_path=_path(mirror, "musiq_spaq"))
    elif name == "raft_large":
        from torchvision.models.optical_flow import raft_large

        model = raft_large(weights=None)
        model.load_state_dict(torch.load(_path(mirror, "raft_large"), map_location="cpu", weights_only=True))
    elif name == "lpips":
        import pyiqa

        with _torch_hub_dir(Path(mirror) / "torch" / "hub"):
            model = pyiqa.create_metric("lpips", device=device, as_loss=False,
                                        pretrained_model_path=_path(mirror, "lpips_alex_v01"))
    else:
        raise ConfigError(f"scorer model {name!r} is not known to pairflow.metrics.models.load; known: "
                          f"{', '.join(sorted(_NEEDS))}; a metric module must name one of these")
    return model.eval().to(device)


def float_frames(frames: np.ndarray, device: str = "cpu") -> Any:
    """uint8 (F, H, W, 3) → float32 (F, 3, H, W) of 0-255 values (VBench's load_video)
    on ``device``: the uint8 frames are moved once (a quarter of the float bytes), then
    converted there; every batch of the metric then slices that one tensor. Off the CPU
    the moved frames are kept for the next metric of the same video (``on_device``), so a
    task's metrics move each video to the device once, not once per metric."""
    import torch

    x = torch.from_numpy(np.ascontiguousarray(frames)) if device == "cpu" else on_device(frames, device)
    return x.permute(0, 3, 1, 2).to(torch.float32)


ON_DEVICE_KEPT = 2
"""Videos whose uint8 frames stay on the device (a pair's treatment and its control)."""
_ON_DEVICE: list[tuple[weakref.ref[np.ndarray], str, Any]] = []


def on_device(frames: np.ndarray, device: str) -> Any:
    """``frames`` as a uint8 tensor on ``device``, moved once while the array lives: the
    last ``ON_DEVICE_KEPT`` arrays moved are kept (by identity, held weakly, so a video
    decoded again is moved again). The arrays scoring passes are the decoded frames,
    which nothing writes to. A freed array's copy goes at the next call, or when the
    task ends (``release_frames``)."""
    import torch

    for ref, dev, tensor in _ON_DEVICE:
        if ref() is frames and dev == device:
            return tensor
    tensor = torch.from_numpy(np.ascontiguousarray(frames)).to(device)
    _ON_DEVICE[:] = [e for e in _ON_DEVICE if e[0]() is not None][-(ON_DEVICE_KEPT - 1):]
    _ON_DEVICE.append((weakref.ref(frames), device, tensor))
    return tensor


def release_frames() -> None:
    """Drop every video kept on the device (``on_device``): a score task calls it when it
    ends, so the next task (a generation, in a combined job) has the memory."""
    _ON_DEVICE.clear()


def clip_input(x: Any, n_px: int = 224) -> Any:
    """VBench ``clip_transform``: shorter side to ``n_px`` (bicubic, no antialias),
    centre crop, /255, CLIP normalisation."""
    import torchvision.transforms.functional as TF

    x = TF.resize(x, [n_px], interpolation=TF.InterpolationMode.BICUBIC, antialias=False)
    x = TF.center_crop(x, [n_px])
    return TF.normalize(x / 255.0, CLIP_MEAN, CLIP_STD)


def dino_input(x: Any, n_px: int = 224) -> Any:
    """VBench ``dino_transform``: shorter side to ``n_px`` (bilinear, no antialias, no
    crop), /255, ImageNet normalisation."""
    import torchvision.transforms.functional as TF

    x = TF.resize(x, [n_px], antialias=False)
    return TF.normalize(x / 255.0, IMAGENET_MEAN, IMAGENET_STD)


def batched(fn: Any, x: Any, batch: int) -> Any:
    """``fn`` over ``x`` in chunks of ``batch`` along dim 0, concatenated, without grad."""
    import torch

    with torch.inference_mode():
        return torch.cat([fn(x[i:i + batch]) for i in range(0, x.shape[0], batch)])
