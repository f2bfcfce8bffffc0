"""Which accelerators a job may use, read from every source that can say so.

- ``CUDA_VISIBLE_DEVICES`` (Slurm's gres plugin, a user, a profile): unset means nothing
  was granted; ``""``, ``-1`` or Slurm's ``NoDevFiles`` mean none; otherwise device
  indices, ``GPU-<uuid>`` or ``MIG-<uuid>`` names, comma-separated.
- ``NVIDIA_VISIBLE_DEVICES`` (the NVIDIA container runtime; a Kubernetes GPU pod usually
  sets only this one): unset means no information; ``none``, ``void`` or ``""`` mean no
  GPU in this container; ``all`` means every GPU the container has; otherwise the host's
  indices or UUIDs exposed to the container, which CUDA inside it numbers ``0..n-1``.
- ``torch.cuda.device_count()`` where torch is already imported in the process (see
  ``torch_device_count``); a torch without a usable CUDA driver reports 0.

``discover`` is a pure function of these values; where they disagree it raises
AcceleratorError naming each value and the fix, rather than starting CPU workers or
pinning workers to devices that do not exist.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ...errors import AcceleratorError

log = logging.getLogger(__name__)

CUDA_VAR = "CUDA_VISIBLE_DEVICES"
NVIDIA_VAR = "NVIDIA_VISIBLE_DEVICES"
NONE_VALUES = ("", "-1", "NoDevFiles")
"""``CUDA_VISIBLE_DEVICES`` values meaning no device (``NoDevFiles``: Slurm's gres without device files)."""
NVIDIA_NONE = ("", "none", "void")
ALL = "all"


@dataclass(frozen=True)
class Accelerators:
    """The devices a job's workers are pinned to, one worker each (observed).

    ``visible`` are the names a worker's ``CUDA_VISIBLE_DEVICES`` is set to; ``physical``
    maps each to the device as the host knows it (inside a container: the host's index
    or UUID from ``NVIDIA_VISIBLE_DEVICES``); ``source`` names the variable that decided;
    ``torch_count`` is what torch reported (None: torch not imported)."""

    visible: tuple[str, ...] = ()
    physical: dict[str, str] = field(default_factory=dict)
    source: str = "none granted"
    torch_count: int | None = None

    def asdict(self) -> dict[str, Any]:
        return asdict(self)


def parse_cuda(value: str | None) -> tuple[str, ...] | None:
    """``CUDA_VISIBLE_DEVICES`` as device names; None when unset, () for none."""
    if value is None:
        return None
    if value.strip() in NONE_VALUES:
        return ()
    return tuple(d.strip() for d in value.split(",") if d.strip() and d.strip() != "-1")


def parse_nvidia(value: str | None) -> tuple[str, ...] | str | None:
    """``NVIDIA_VISIBLE_DEVICES`` as the host's device names, ``"all"``, () for none, or
    None when unset."""
    if value is None:
        return None
    if value.strip().lower() in NVIDIA_NONE:
        return ()
    if value.strip().lower() == ALL:
        return ALL
    return tuple(d.strip() for d in value.split(",") if d.strip())


def discover(environ: Mapping[str, str], torch_count: int | None) -> Accelerators:
    """The accelerators ``environ`` grants, checked against what torch reports.

    ``torch_count`` is ``torch.cuda.device_count()`` in this process, or None where torch
    is not imported. Neither variable set: nothing granted (CPU workers), whatever torch
    sees. Raises AcceleratorError when the sources disagree: ``CUDA_VISIBLE_DEVICES``
    names a device the container's ``NVIDIA_VISIBLE_DEVICES`` does not expose (or it
    exposes none); ``NVIDIA_VISIBLE_DEVICES=all`` alone with no torch to count; torch
    counting devices, but not as many as were granted. Torch counting 0 is not a
    mismatch: a torch without CUDA (or gres on devices without a CUDA driver, as in CI)
    runs the granted slots' work on the CPU, which is logged."""
    cuda_raw, nvidia_raw = environ.get(CUDA_VAR), environ.get(NVIDIA_VAR)
    cuda, nvidia = parse_cuda(cuda_raw), parse_nvidia(nvidia_raw)
    if cuda is not None:
        visible, source = cuda, CUDA_VAR
        physical = {v: v for v in cuda}
        if nvidia == ():
            if cuda:
                raise AcceleratorError(
                    f"{CUDA_VAR}={cuda_raw!r} asks for {len(cuda)} GPU(s) but {NVIDIA_VAR}={nvidia_raw!r} gives this "
                    f"container none: request GPUs for the container or pod (e.g. nvidia.com/gpu: {len(cuda)}), or "
                    f"unset {CUDA_VAR} to run on CPU workers")
        elif isinstance(nvidia, tuple):
            physical = {v: _in_container(v, nvidia, cuda_raw, nvidia_raw) for v in cuda}
    elif isinstance(nvidia, tuple):
        visible, source = tuple(str(i) for i in range(len(nvidia))), NVIDIA_VAR
        physical = dict(zip(visible, nvidia, strict=True))
    elif nvidia == ALL:
        if torch_count is None:
            raise AcceleratorError(
                f"{NVIDIA_VAR}=all leaves the number of GPUs to CUDA and torch could not count them here; set "
                f"{CUDA_VAR} to the container's devices (e.g. 0,1 for two GPUs)")
        visible, source = tuple(str(i) for i in range(torch_count)), f"{NVIDIA_VAR}=all and torch"
        physical = {v: v for v in visible}
    else:
        if torch_count:
            log.warning("torch sees %d CUDA device(s) but neither %s nor %s is set: nothing was granted, so the "
                        "work runs on CPU workers; set %s (e.g. 0) to use them", torch_count, CUDA_VAR, NVIDIA_VAR,
                        CUDA_VAR)
        return Accelerators(torch_count=torch_count)
    if torch_count and visible and torch_count != len(visible):
        raise AcceleratorError(
            f"{source} grants {len(visible)} device(s) ({CUDA_VAR}={cuda_raw!r}, {NVIDIA_VAR}={nvidia_raw!r}) but "
            f"torch.cuda.device_count() is {torch_count}: one worker per granted device would pin workers to "
            f"devices torch cannot see, or leave devices idle; make {CUDA_VAR} list exactly the devices this job "
            "holds (or unset it and let the scheduler set it)")
    if visible and torch_count == 0:
        log.warning("%s grants %s but torch sees no CUDA device: each granted slot's work runs on the CPU",
                    source, ",".join(visible))
    return Accelerators(visible, physical, source if visible else "none granted", torch_count)


def _in_container(name: str, exposed: tuple[str, ...], cuda_raw: str | None, nvidia_raw: str | None) -> str:
    """The host's name for ``name`` (a CUDA device inside a container exposing ``exposed``)."""
    if name.isdigit():  # CUDA numbers the container's devices 0..n-1, whatever the host calls them
        if int(name) < len(exposed):
            return exposed[int(name)]
    elif name in exposed:  # a GPU-/MIG- UUID names the same device inside and out
        return name
    raise AcceleratorError(
        f"{CUDA_VAR}={cuda_raw!r} names device {name!r}, which {NVIDIA_VAR}={nvidia_raw!r} does not expose to this "
        f"container (it numbers its {len(exposed)} device(s) 0..{len(exposed) - 1}); list only those in {CUDA_VAR}, "
        "or unset it")


def torch_device_count(import_torch: bool = False) -> int | None:
    """``torch.cuda.device_count()`` where torch is already imported in this process (or
    ``import_torch``: only ``NVIDIA_VISIBLE_DEVICES=all`` needs it, as the count is
    otherwise unknown); None when torch is absent. Counting does not initialise CUDA."""
    torch = sys.modules.get("torch")
    if torch is None and import_torch:
        try:
            import torch  # heavy (seconds): only when nothing else can count the devices
        except ImportError:
            return None
    if torch is None:
        return None
    return int(torch.cuda.device_count())
