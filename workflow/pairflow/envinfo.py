"""The environment a record was made in: versions, CUDA and driver, code version, package list.

Imports without torch (versions come from package metadata).
"""

from __future__ import annotations

import functools
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from .identity import digest_obj

_PACKAGES = ("torch", "torchvision", "diffusers", "transformers", "pyiqa", "parsl", "snakemake",
             "numpy", "scipy", "av", "xxhash", "imageio-ffmpeg", "ffmpeg-python")


def package_version(name: str) -> str | None:
    """The installed version of distribution ``name``, or None."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=4)
def code_version(root: str) -> dict[str, Any]:
    """Git commit of the project at ``root`` and whether the tree is dirty."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", root, *args], check=True, capture_output=True,
                              text=True, timeout=30).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": dirty}


@functools.lru_cache(maxsize=1)
def environment() -> dict[str, Any]:
    """Python, package versions, CUDA/driver where present, and a digest of every
    installed distribution (name==version, sorted)."""
    dists = sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions())
    env: dict[str, Any] = {
        "python": sys.version.split()[0], "platform": platform.platform(),
        "packages": {p: package_version(p) for p in _PACKAGES},
        "installed_digest": digest_obj(dists),
    }
    try:
        import torch

        env["cuda"] = torch.version.cuda if torch.cuda.is_available() else None
    except ImportError:
        env["cuda"] = None
    env["driver"] = _driver() if env["cuda"] else None
    return env


def _driver() -> str | None:
    """The NVIDIA driver version through NVML (nvidia-ml-py), or None without it."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]
