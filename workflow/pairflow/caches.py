"""Cache discipline: every job names its caches explicitly and keeps the hub offline.

Read-mostly caches (Hugging Face, torch hub, pyiqa weights under TORCH_HOME) are shared
under ``scratch/cache``; compiler caches (Triton, TorchInductor), which jobs write and
compile into, are scoped to node, job and retry so concurrent jobs never share a
mutable tree.
"""

from __future__ import annotations

import socket
from pathlib import Path


def cache_env(scratch: Path, job: str, attempt: int) -> dict[str, str]:
    """Environment variables for one job attempt. ``job`` is a path-safe job name."""
    shared = Path(scratch) / "cache"
    compile_dir = shared / "compile" / socket.gethostname() / job / f"attempt-{attempt}"
    return {
        "HF_HOME": str(shared / "hf"),
        "HF_HUB_CACHE": str(shared / "hf" / "hub"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TORCH_HOME": str(shared / "torch"),
        "TRITON_CACHE_DIR": str(compile_dir / "triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(compile_dir / "inductor"),
    }
