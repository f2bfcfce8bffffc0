"""Cache discipline: every job names its caches explicitly and keeps the hub offline.

Read-mostly caches (Hugging Face, torch hub, pyiqa weights under TORCH_HOME) are shared
under ``scratch/cache``; compiler caches (Triton, TorchInductor), which jobs write and
compile into, are scoped to node, job and retry so concurrent jobs never share a
mutable tree. When the study has a weight mirror (``weights/mirror``), HF_HOME,
HF_HUB_CACHE and TORCH_HOME (and so pyiqa's cache, ``$TORCH_HOME/hub/pyiqa``) point at
the mirror instead, so a library that looks for a weight finds the verified copy and
nothing is downloaded (the hub is offline either way). openai-clip has no cache
variable; PairFlow loads CLIP by explicit file path from the mirror.
"""

from __future__ import annotations

import socket
from pathlib import Path


def cache_env(scratch: Path, job: str, attempt: int, mirror: Path | None = None) -> dict[str, str]:
    """Environment variables for one job attempt. ``job`` is a path-safe job name;
    ``mirror`` the study's weight mirror, if any."""
    shared = Path(scratch) / "cache"
    weights = Path(mirror) if mirror else shared
    compile_dir = shared / "compile" / socket.gethostname() / job / f"attempt-{attempt}"
    return {
        "HF_HOME": str(weights / "hf"),
        "HF_HUB_CACHE": str(weights / "hf" / "hub"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TORCH_HOME": str(weights / "torch"),
        "TRITON_CACHE_DIR": str(compile_dir / "triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(compile_dir / "inductor"),
    }
