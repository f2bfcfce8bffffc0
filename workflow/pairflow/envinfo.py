"""The environment a record was made in: versions, CUDA and driver, code version, package list.

Imports without torch (versions come from package metadata).
"""

from __future__ import annotations

import ast
import functools
import platform
import re
import subprocess
import sys
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from . import nvml
from .identity import digest_obj

# pynvml (optional, absent on machines without NVIDIA's library) is reached through ``nvml``, the one
# seam to the driver, which imports it on first use and initialises NVML once per process.

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
    installed distribution (name==version, sorted, each once).

    ``metadata.distributions()`` yields a distribution once per ``sys.path`` entry that
    holds its metadata, so the same install listed twice (the project's ``workflow/``
    with its ``pairflow.egg-info`` on the path of a Snakemake job but not of the planner)
    would digest differently: the set makes the digest depend on what is installed, not
    on the path it was found by (the calibration table's key depends on it); the path is
    ``install_paths`` (no package's vendored folder)."""
    dists = sorted({f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions(path=install_paths())})
    env: dict[str, Any] = {
        "python": sys.version.split()[0], "platform": platform.platform(),
        "packages": {p: package_version(p) for p in _PACKAGES},
        "installed_digest": digest_obj(dists),
    }
    # Without importing torch (5 s in a driver that never computes): the CUDA version
    # torch was built for, where an NVIDIA driver is present to run it.
    driver = _driver()
    env["cuda"] = torch_cuda_version() if driver else None
    env["driver"] = driver if env["cuda"] else None
    return env


def install_paths() -> list[str]:
    """``sys.path`` without the folders inside a site-packages folder that is itself on it.

    Those are a package's own vendored libraries, not installs: importing ``pkg_resources``
    (as CLIP does) puts ``setuptools/_vendor`` on the path, whose twelve ``.dist-info``
    folders would otherwise change the installed digest of every process that imported it
    first (a scoring job against a generation job, a test worker against a fresh process)."""
    roots = [Path(q).resolve() for q in sys.path if q and Path(q).name in ("site-packages", "dist-packages")]
    return [p for p in sys.path if not any(r in Path(p or ".").resolve().parents for r in roots)]


def torch_cuda_version() -> str | None:
    """The CUDA version the installed torch was built for (``torch.version.cuda``), read
    from ``torch/version.py`` without importing torch; None for a CPU build or no torch."""
    spec = find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / "version.py"
        if path.is_file():
            for node in ast.parse(path.read_text()).body:
                if (isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant)
                        and any(getattr(t, "id", None) == "cuda"
                                for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))):
                    return None if node.value.value is None else str(node.value.value)
    return None


def _driver() -> str | None:
    """The NVIDIA driver version through NVML (nvidia-ml-py, through ``nvml``: initialised
    once per process, shared with telemetry), else, without nvidia-ml-py, from the kernel
    module's ``/proc/driver/nvidia/version``; None where there is no NVIDIA driver."""
    pynvml, why = nvml.start()
    if pynvml is None:
        return _kernel_driver() if why == nvml.NOT_INSTALLED else None
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
    except pynvml.NVMLError:
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


def _kernel_driver() -> str | None:
    """The loaded NVIDIA kernel module's version, None without one."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    # "... Kernel Module [for x86_64]  550.54.14 ..."
    found = re.search(r"Kernel Module.*?\s(\d+(?:\.\d+)+)\s", text)
    return found.group(1) if found else None
