"""The plain specs an arm is made of: the model, a search, the arm and the generation
settings, as frozen dataclasses (``config`` builds them from the validated config and
re-exports them). Nothing here imports ``pairflow.arms``: the arm kinds are built from these
classes, and what an arm declares, its record fields and its digest come from
``arms.registry`` (``declared_kinds``, ``declared_keys``, ``arm_fields``, ``arm_digest``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelSpec:
    """Which pipeline to load: the embedded tiny model, a local path, or a mirrored hub id."""

    kind: str
    path: Path
    id: str | None = None
    revision: str | None = None

    def identity(self) -> dict[str, Any]:
        """Fields that identify the model in candidate ids (paths are site facts, not identity)."""
        return {"kind": self.kind, "id": self.id or self.path.name, "revision": self.revision}

    @property
    def root(self) -> Path:
        """Where the model's component folders are (for a hub mirror, the pinned snapshot
        of the Hugging Face cache layout)."""
        root = Path(self.path)
        if self.kind == "hub-mirror" and self.id and self.revision:
            repo = root / f"models--{self.id.replace('/', '--')}"
            ref = repo / "refs" / self.revision  # a branch or tag name points at a commit
            commit = ref.read_text().strip() if ref.is_file() else self.revision
            root = repo / "snapshots" / commit
        return root


@dataclass(frozen=True)
class SearchSpec:
    """Test-time search: best of ``n`` candidates under the NR metric ``verifier``
    (candidate seeds: ``arms.search_seeds``)."""

    n: int
    verifier: str


@dataclass(frozen=True)
class ArmSpec:
    """One arm: a declared change to control, of one or more kinds (``docs/arms.md``).

    Each kind of change is one module of ``pairflow.arms.kinds``, which owns its config
    keys, their parsing, check, apply-and-restore and digest fields; this class holds the
    values. ``cache_class``/``cache_params``: a diffusers cache config; ``steps``,
    ``guidance``, ``scheduler_class``/``scheduler_params``: generation overrides;
    ``model``: another checkpoint (a student); ``dtype`` and ``attention_backend``:
    precision and attention kernels; ``search``: best of N under a verifier metric;
    ``extra``: the values of kinds without an attribute here, by config key. None means
    "as control".
    """

    name: str
    cache_class: str | None = None
    cache_params: dict[str, Any] = field(default_factory=dict, hash=False)
    steps: int | None = None
    guidance: float | None = None
    scheduler_class: str | None = None
    scheduler_params: dict[str, Any] = field(default_factory=dict, hash=False)
    model: ModelSpec | None = None
    dtype: str | None = None
    attention_backend: str | None = None
    search: SearchSpec | None = None
    extra: dict[str, Any] = field(default_factory=dict, hash=False)
    derived_for: tuple[str, ...] = ()
    """Non-empty for an arm the study derived rather than declared: an iso-compute control
    (``analysis.isocompute``), naming the arms it is the equal-compute control of. Not an
    output-changing field (its steps are)."""

    @property
    def is_control(self) -> bool:
        return self.name == "control"


@dataclass(frozen=True)
class GenerationSpec:
    frames: int
    height: int
    width: int
    steps: int
    guidance: float
    fps: int
    dtype: str
    threads: int
    negative_prompt: str = ""
    max_text_tokens: int | None = None
