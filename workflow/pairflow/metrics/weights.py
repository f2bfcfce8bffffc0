"""The offline weight mirror: every weight file a metric needs, fetched once, verified always.

A mirror is a directory laid out the way each library caches its own files, so the
libraries' own loaders find them when the cache variables point at it::

    <mirror>/weights.lock.json                          digests of every file (this module writes it)
    <mirror>/torch/hub/checkpoints/<torchvision file>   TORCH_HOME layout (AlexNet, RAFT, DINO)
    <mirror>/torch/hub/pyiqa/<pyiqa file>               pyiqa's own cache (MUSIQ, LPIPS heads)
    <mirror>/clip/<ViT-*.pt>                            openai-clip's download_root layout
    <mirror>/vbench/aesthetic_model/emb_reader/<file>   VBench's cache layout (LAION linear head)
    <mirror>/hf/                                        HF_HOME (kept offline; nothing here needs it yet)

``pairflow mirror --dest DIR`` runs once on a machine with internet: it downloads every
declared file with torch's own downloader (checking the upstream SHA-256 where the
source publishes one) and writes the lock with each file's ``xxh3_128`` digest.
Scoring jobs never download: before a scorer is built, each file it needs is hashed and
compared with the lock, and a missing or altered file stops the job with a message
naming the file, both digests and the mirror command.

``build_test_mirror`` writes random-initialised weights for every architecture in the
same layout (its lock says ``origin: random-init``), so tests exercise the real loading
path with no network. Imports without torch (the builders import it when called).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..atomic import write_text
from ..errors import WeightDigestError, WeightsError
from ..identity import digest_file, digest_obj

LOCK_NAME = "weights.lock.json"
LOCK_FORMAT = "pairflow-weights-lock/1"


@dataclass(frozen=True)
class WeightFile:
    """One declared weight file. ``path`` is relative to the mirror; ``sha256`` is the
    upstream checksum where the source publishes one (whole digest, or the 8-hex prefix
    torchvision puts in its file names); ``arch`` says what the file loads into."""

    path: str
    url: str
    arch: str
    sha256: str = ""


WEIGHTS: dict[str, WeightFile] = {
    "dino_vitb16": WeightFile(
        "torch/hub/checkpoints/dino_vitbase16_pretrain.pth",
        "https://dl.fbaipublicfiles.com/dino/dino_vitbase16_pretrain/dino_vitbase16_pretrain.pth",
        "DINO ViT-B/16 backbone (facebookresearch/dino, the torch.hub model VBench loads)"),
    "clip_vitb32": WeightFile(
        "clip/ViT-B-32.pt",
        "https://openaipublic.azureedge.net/clip/models/"
        "40d365715913c9da98579312b702a82c18be219cc2a73407c4526f58eba950af/ViT-B-32.pt",
        "OpenAI CLIP ViT-B/32", "40d365715913c9da98579312b702a82c18be219cc2a73407c4526f58eba950af"),
    "clip_vitl14": WeightFile(
        "clip/ViT-L-14.pt",
        "https://openaipublic.azureedge.net/clip/models/"
        "b8cca3fd41ae0c99ba7e8951adf17d267cdb84cd88be6f7c2e0eca1737a03836/ViT-L-14.pt",
        "OpenAI CLIP ViT-L/14", "b8cca3fd41ae0c99ba7e8951adf17d267cdb84cd88be6f7c2e0eca1737a03836"),
    "laion_aes_linear": WeightFile(
        "vbench/aesthetic_model/emb_reader/sa_0_4_vit_l_14_linear.pth",
        "https://raw.githubusercontent.com/LAION-AI/aesthetic-predictor/main/sa_0_4_vit_l_14_linear.pth",
        "LAION aesthetic predictor, linear head on CLIP ViT-L/14 embeddings (the one VBench uses)"),
    "musiq_spaq": WeightFile(
        "torch/hub/pyiqa/musiq_spaq_ckpt-358bb6af.pth",
        "https://huggingface.co/chaofengc/IQA-PyTorch-Weights/resolve/main/musiq_spaq_ckpt-358bb6af.pth",
        "MUSIQ trained on SPAQ (pyiqa's MUSIQ architecture)"),
    "raft_large": WeightFile(
        "torch/hub/checkpoints/raft_large_C_T_V1-22a6c225.pth",
        "https://download.pytorch.org/models/raft_large_C_T_V1-22a6c225.pth",
        "RAFT large, FlyingChairs+FlyingThings (torchvision port of the original raft-things)", "22a6c225"),
    "alexnet": WeightFile(
        "torch/hub/checkpoints/alexnet-owt-7be5be79.pth",
        "https://download.pytorch.org/models/alexnet-owt-7be5be79.pth",
        "torchvision AlexNet IMAGENET1K_V1 (LPIPS backbone)", "7be5be79"),
    "lpips_alex_v01": WeightFile(
        "torch/hub/pyiqa/LPIPS_v0.1_alex-df73285e.pth",
        "https://huggingface.co/chaofengc/IQA-PyTorch-Weights/resolve/main/LPIPS_v0.1_alex-df73285e.pth",
        "LPIPS v0.1 linear heads on AlexNet (pyiqa)"),
}


def mirror_command(mirror: Path | str | None) -> str:
    dest = str(mirror) if mirror else "DIR"
    return f"pairflow mirror --dest {dest}"


@dataclass(frozen=True)
class Lock:
    """A mirror's lock: where it is, how its files came to be, and their digests."""

    root: Path
    origin: str
    files: dict[str, str]

    @property
    def digest(self) -> str:
        """Digest of the lock's content (origin and every file digest)."""
        return digest_obj({"origin": self.origin, "files": self.files})


def read_lock(mirror: Path | None, needed_by: str = "") -> Lock:
    """Read ``<mirror>/weights.lock.json``. Raises WeightsError when no mirror is
    configured, or it has no lock, naming the command that builds one."""
    why = f" ({needed_by})" if needed_by else ""
    if not mirror:
        raise WeightsError(f"no weight mirror is configured{why}; build one on a machine with internet with "
                           f"`{mirror_command(None)}` and set 'weights/mirror: DIR' in the study config. "
                           "Nothing is downloaded at run time.")
    path = Path(mirror) / LOCK_NAME
    if not path.is_file():
        raise WeightsError(f"weight mirror {mirror} has no {LOCK_NAME}{why}; build it with "
                           f"`{mirror_command(mirror)}` (on a machine with internet)")
    lock = json.loads(path.read_text())
    if lock.get("format") != LOCK_FORMAT:
        raise WeightsError(f"{path}: format {lock.get('format')!r} is not {LOCK_FORMAT!r}; "
                           f"rebuild with `{mirror_command(mirror)}`")
    return Lock(Path(mirror), lock["origin"], {k: v["digest"] for k, v in lock["files"].items()})


@functools.lru_cache(maxsize=64)
def _verified(path: str, size: int, mtime_ns: int, expected: str) -> str:
    """Digest of a file, once per process per (size, mtime) - a worker hashes each file once."""
    return digest_file(Path(path))


def verify(mirror: Path | None, keys: list[str] | tuple[str, ...], needed_by: str = "") -> dict[str, str]:
    """Check the declared files ``keys`` (names in WEIGHTS) against the mirror's lock.

    Returns ``{relative path: digest}``. Raises WeightsError naming a missing file or one
    the lock does not list, WeightDigestError naming a file whose bytes differ from the
    lock with both digests; every message names the mirror command."""
    if not keys:
        return {}
    lock = read_lock(mirror, needed_by)
    out = {}
    for key in keys:
        rel = WEIGHTS[key].path
        path = lock.root / rel
        if rel not in lock.files:
            raise WeightsError(f"weight file {rel} ({WEIGHTS[key].arch}) is not in {lock.root / LOCK_NAME}; "
                               f"rebuild the mirror with `{mirror_command(lock.root)}`")
        if not path.is_file():
            raise WeightsError(f"weight file {path} ({WEIGHTS[key].arch}) is missing from the mirror; "
                               f"rebuild it with `{mirror_command(lock.root)}`")
        st = path.stat()
        actual = _verified(str(path), st.st_size, st.st_mtime_ns, lock.files[rel])
        if actual != lock.files[rel]:
            raise WeightDigestError(f"weight file {path} does not match the mirror's lock: expected "
                                    f"{lock.files[rel]}, found {actual}; it was altered or corrupted. "
                                    f"Restore it with `{mirror_command(lock.root)}`")
        out[rel] = actual
    return out


def write_lock(mirror: Path, origin: str) -> Lock:
    """Hash every declared file present in ``mirror`` and write its lock."""
    mirror = Path(mirror)
    files = {}
    for w in WEIGHTS.values():
        p = mirror / w.path
        if not p.is_file():
            continue
        files[w.path] = {"digest": digest_file(p), "bytes": p.stat().st_size, "url": w.url, "arch": w.arch}
    write_text(mirror / LOCK_NAME, json.dumps({"format": LOCK_FORMAT, "origin": origin, "files": files},
                                              indent=1, sort_keys=True) + "\n")
    return read_lock(mirror)


def fetch(dest: Path, keys: list[str] | None = None) -> Lock:
    """Download every declared file into ``dest`` (needs internet; run once per site) with
    torch's own downloader, check upstream SHA-256 where published, and write the lock."""
    from torch.hub import download_url_to_file

    for key in keys or list(WEIGHTS):
        w = WEIGHTS[key]
        target = Path(dest) / w.path
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            prefix = w.sha256 if len(w.sha256) < 64 else None
            download_url_to_file(w.url, str(target), hash_prefix=prefix, progress=True)
        if len(w.sha256) == 64:
            h = hashlib.sha256(target.read_bytes()).hexdigest()
            if h != w.sha256:
                target.unlink()
                raise WeightDigestError(f"{w.url}: SHA-256 {h} is not the published {w.sha256}; removed "
                                        f"{target}, retry `{mirror_command(dest)}`")
    return write_lock(Path(dest), "download")


def _architecture(key: str) -> Any:
    """``key``'s architecture built on the meta device (shapes and dtypes, no memory, no
    initialisation cost): what the real file's state dict must fit."""
    import torch

    with torch.device("meta"):
        if key == "dino_vitb16":
            import timm

            return timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=0)
        if key in ("clip_vitb32", "clip_vitl14"):
            from clip.model import CLIP, convert_weights

            # (embed_dim, vision_layers, vision_width, patch, text_width, text_heads): OpenAI's published sizes
            e, vl, vw, p, tw, th = (512, 12, 768, 32, 512, 8) if key == "clip_vitb32" else (768, 24, 1024, 14, 768, 12)
            model = CLIP(e, 224, vl, vw, p, 77, 49408, tw, th, 12)
            convert_weights(model)  # the published checkpoints are float16
            return model
        if key == "laion_aes_linear":
            return torch.nn.Linear(768, 1)
        if key == "musiq_spaq":
            from pyiqa.archs.musiq_arch import MUSIQ

            return MUSIQ(pretrained=False)
        if key == "raft_large":
            from torchvision.models.optical_flow import raft_large

            return raft_large(weights=None)
        if key == "alexnet":
            from torchvision.models import alexnet

            return alexnet(weights=None)
    raise WeightsError(f"no architecture is known for weight {key!r} (pairflow.metrics.weights._architecture); add one "
                       "beside the others so its file's state dict can be checked")


def _random_state(key: str, seed: int) -> dict[str, Any]:
    """A random state dict with exactly the keys, shapes and dtypes of ``key``'s
    architecture (what the real file holds): N(0, 0.02) floats, positive variances and
    LPIPS heads, zero counters. Drawn from one seeded generator, so it is reproducible."""
    import torch

    g = torch.Generator().manual_seed(seed)
    if key == "lpips_alex_v01":  # five non-negative 1x1 heads over AlexNet's channels
        chans = (64, 192, 384, 256, 256)
        return {f"lin{i}.model.1.weight": torch.rand(1, c, 1, 1, generator=g) / c for i, c in enumerate(chans)}
    out = {}
    for name, t in _architecture(key).state_dict().items():
        if not t.is_floating_point():
            out[name] = torch.zeros(t.shape, dtype=t.dtype)
        elif name.endswith("running_var"):
            out[name] = torch.ones(t.shape, dtype=t.dtype)
        else:
            out[name] = (torch.randn(t.shape, generator=g) * 0.02).to(t.dtype)
    return out


def build_test_mirror(dest: Path, keys: list[str] | None = None, seed: int = 0) -> Lock:
    """Write random-initialised weights for each declared architecture in the mirror
    layout and lock them (origin ``random-init``): for tests and benchmarks only; the
    numbers they give mean nothing about quality."""
    import torch

    for i, key in enumerate(keys or list(WEIGHTS)):
        target = Path(dest) / WEIGHTS[key].path
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        torch.save(_random_state(key, seed + i), target)
    return write_lock(Path(dest), "random-init")
