"""The study config: YAML → JSON-schema validation with defaults → frozen dataclasses.

The schema (``workflow/schemas/config.schema.yaml``) is the single source of keys,
types and defaults; Snakemake validates against the same file in ``common.smk``.
Unknown keys are errors. Relative paths resolve against the project root the caller
passes, never the working directory.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError
from .identity import digest_bytes, digest_obj

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "config.schema.yaml"
MAX_CONFIG_BYTES = 1 << 20
"""A config larger than this (1 MiB) is refused: no study needs it, a YAML bomb does."""
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"


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


@dataclass(frozen=True)
class ArmSpec:
    """One arm: a name and an optional diffusers cache config (class name + parameters)."""

    name: str
    cache_class: str | None
    cache_params: dict[str, Any] = field(default_factory=dict, hash=False)

    @property
    def is_control(self) -> bool:
        return self.name == "control"

    @property
    def digest(self) -> str:
        return digest_obj({"cache_class": self.cache_class, "cache_params": self.cache_params})


@dataclass(frozen=True)
class Prompt:
    prompt_id: str
    text: str

    @property
    def digest(self) -> str:
        return digest_bytes(self.text.encode("utf-8"))


@dataclass(frozen=True)
class PanelSpec:
    name: str
    sheet: Path
    seeds: tuple[int, ...]
    prompts: tuple[Prompt, ...]


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


@dataclass(frozen=True)
class EncoderSpec:
    """The encoder keys as configured. ``ffmpeg`` empty means the binary imageio-ffmpeg
    ships. ``video.recipe`` owns the recipe these keys become (the exact ffmpeg argv)."""

    ffmpeg: str
    codec: str
    crf: int
    preset: str
    pix_fmt: str
    gop: int
    threads: int
    lossless: bool
    fail_on_flat: bool


@dataclass(frozen=True)
class StatsSpec:
    resamples: int
    level: float
    seed: int
    missing: str


@dataclass(frozen=True)
class TimingSpec:
    warmup: int
    repeats: int


@dataclass(frozen=True)
class RepeatSpec:
    replicates: int
    panels: tuple[str, ...]


@dataclass(frozen=True)
class FleetSpec:
    """How fanned-out tasks run: CPU workers where no accelerator was granted, task
    retries, seconds an idle block waits before it is released, NVML sampling period."""

    cpu_workers: int
    retries: int
    idle_timeout_s: int = 120
    nvml_interval_s: float = 30.0


@dataclass(frozen=True)
class WeightsSpec:
    """Where scorer weights come from: an offline mirror (``pairflow mirror --dest DIR``),
    or None when only weight-free scorers run."""

    mirror: Path | None


@dataclass(frozen=True)
class ScoringSpec:
    """How scoring runs: frames per forward pass, torch threads per worker, and the
    static-filter policy for temporal_flickering (``none``: every video of both arms)."""

    batch: int
    threads: int
    static_filter: str


@dataclass(frozen=True)
class StudySpec:
    """A whole validated study. ``raw`` is the defaults-filled config mapping."""

    study: str
    root: Path
    scratch: Path
    work: Path
    model: ModelSpec
    arms: tuple[ArmSpec, ...]
    panels: tuple[PanelSpec, ...]
    generation: GenerationSpec
    encoder: EncoderSpec
    scorers: tuple[str, ...]
    stats: StatsSpec
    timing: TimingSpec
    repeatability: RepeatSpec
    fleet: FleetSpec
    weights: WeightsSpec
    scoring: ScoringSpec
    raw: dict[str, Any] = field(hash=False, compare=False)

    def panel(self, name: str) -> PanelSpec:
        for p in self.panels:
            if p.name == name:
                return p
        raise ConfigError(f"panel {name!r} is not in the config; known: {[p.name for p in self.panels]}")

    @property
    def treatments(self) -> tuple[ArmSpec, ...]:
        return tuple(a for a in self.arms if not a.is_control)

    def panel_digest(self, name: str) -> str:
        """Digest of what defines one panel's candidates: study, model, arms, generation,
        encoder, and this panel's seeds and prompts (not other panels)."""
        p = self.panel(name)
        return digest_obj({"study": self.subtree_digest("study", "model", "arms", "generation", "encoder"),
                           "seeds": list(p.seeds), "prompts": [[q.prompt_id, q.digest] for q in p.prompts]})

    def subtree_digest(self, *keys: str) -> str:
        """Digest of the named config subtrees (what produced a record)."""
        return digest_obj({k: self.raw.get(k) for k in keys})


def _schema() -> dict[str, Any]:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def _validator():  # type: ignore[no-untyped-def]
    # jsonschema's documented recipe for filling defaults while validating
    # (Snakemake's validate(set_default=True) does the same with the same schema).
    from jsonschema import Draft202012Validator, validators

    base = Draft202012Validator

    def set_defaults(validator, properties, instance, schema):  # type: ignore[no-untyped-def]
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if "default" in sub and key not in instance:
                    instance[key] = yaml.safe_load(yaml.safe_dump(sub["default"]))
        yield from base.VALIDATORS["properties"](validator, properties, instance, schema)

    return validators.extend(base, {"properties": set_defaults})(_schema())


def _where(path: Any) -> str:
    return "/".join(str(p) for p in path) or "<top level>"


def validate_raw(raw: Any, source: str) -> dict[str, Any]:
    """Validate a parsed config mapping against the schema, filling defaults in place.

    Raises ConfigError naming the key, the offending value and what is allowed.
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the config must be a YAML mapping, got {type(raw).__name__}")
    errors = sorted(_validator().iter_errors(raw), key=lambda e: list(e.absolute_path))
    if errors:
        lines = []
        for e in errors[:10]:
            allowed = e.schema.get("enum") or e.schema.get("pattern") or e.schema.get("type")
            desc = e.schema.get("description", "")
            lines.append(f"  key {_where(e.absolute_path)!r}: {e.message}"
                         + (f" (allowed: {allowed})" if allowed else "")
                         + (f" -- {desc}" if desc else ""))
        raise ConfigError(f"{source}: invalid config; see config/README.md\n" + "\n".join(lines))
    unknown = set(raw["repeatability"]["panels"]) - set(raw["panels"])
    if unknown:
        raise ConfigError(f"{source}: key 'repeatability/panels' names {sorted(unknown)}, which are not "
                          f"panels; known panels: {sorted(raw['panels'])}")
    gen = raw["generation"]
    if (gen["frames"] - 1) % 4:
        raise ConfigError(f"{source}: key 'generation/frames' is {gen['frames']}; Wan's VAE "
                          "compresses time by 4, so frames must be 4k+1 (e.g. 9, 17, 81)")
    if raw["model"]["kind"] == "hub-mirror" and not (raw["model"].get("id") and raw["model"].get("revision")):
        raise ConfigError(f"{source}: model kind 'hub-mirror' needs both 'model/id' and "
                          "'model/revision' (a pinned commit), read from the local mirror at 'model/path'")
    return raw


def load_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML config safely: size-capped, ``safe_load``, must be a mapping."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist; pass --configfile with an existing path") from None
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: config is {size} bytes, over the {MAX_CONFIG_BYTES}-byte limit; "
                          "a study config is a few KiB, check you passed the right file")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the config must be a YAML mapping, got {type(raw).__name__}")
    return raw


def read_sheet(path: Path, panel: str) -> tuple[Prompt, ...]:
    """Read a prompt sheet (TSV, header ``prompt_id<TAB>prompt``).

    Raises ConfigError for a missing file, a bad header, an unsafe or duplicate
    prompt id, or an empty prompt, naming the line.
    """
    import re

    if not path.is_file():
        raise ConfigError(f"panel {panel!r}: prompt sheet {path} does not exist; create it "
                          "(TSV with columns prompt_id and prompt) or fix 'panels/{panel}/sheet'")
    text = path.read_text(encoding="utf-8")
    rows = list(csv.reader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE))
    if not rows or rows[0] != ["prompt_id", "prompt"]:
        raise ConfigError(f"{path}: the first line must be 'prompt_id<TAB>prompt', got {rows[:1]}")
    prompts, seen = [], set()
    for lineno, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != 2:
            raise ConfigError(f"{path}:{lineno}: expected 2 tab-separated fields, got {len(row)}")
        pid, text_ = row
        if not re.fullmatch(NAME_PATTERN, pid):
            raise ConfigError(f"{path}:{lineno}: prompt_id {pid!r} is not allowed; use ASCII "
                              "letters, digits, '-' and '_' (no path separators, dots or spaces)")
        if pid in seen:
            raise ConfigError(f"{path}:{lineno}: prompt_id {pid!r} appears twice; ids must be unique")
        if not text_.strip():
            raise ConfigError(f"{path}:{lineno}: prompt {pid!r} is empty")
        seen.add(pid)
        prompts.append(Prompt(pid, text_))
    if not prompts:
        raise ConfigError(f"{path}: no prompts; add at least one row")
    return tuple(prompts)


def study_from_raw(raw: dict[str, Any], root: Path, source: str = "config",
                   prompts: dict[str, tuple[Prompt, ...]] | None = None) -> StudySpec:
    """Validate ``raw`` and build the typed StudySpec, resolving paths against ``root``.
    ``prompts`` (panel name → prompts) replaces reading the sheets, for a study rebuilt
    from the config snapshot its manifests record (``evidence.study_from_snapshot``)."""
    raw = validate_raw(raw, source)
    root = Path(root).resolve()

    def resolve(p: str) -> Path:
        return (root / p).resolve()

    m = raw["model"]
    model = ModelSpec(kind=m["kind"], path=resolve(m["path"]), id=m.get("id"), revision=m.get("revision"))
    arms = tuple(ArmSpec(name, (a["cache"] or {}).get("class"), dict((a["cache"] or {}).get("params", {})))
                 for name, a in raw["arms"].items())
    panels = tuple(PanelSpec(name, resolve(p["sheet"]), tuple(p["seeds"]),
                             prompts[name] if prompts is not None else read_sheet(resolve(p["sheet"]), name))
                   for name, p in raw["panels"].items())
    return StudySpec(
        study=raw["study"], root=root, scratch=resolve(raw["storage"]["scratch"]),
        work=resolve(raw["storage"]["work"]), model=model, arms=arms, panels=panels,
        generation=GenerationSpec(**raw["generation"]), encoder=EncoderSpec(**raw["encoder"]),
        scorers=tuple(raw["scorers"]), stats=StatsSpec(**raw["stats"]),
        timing=TimingSpec(**raw["timing"]),
        repeatability=RepeatSpec(raw["repeatability"]["replicates"],
                                 tuple(raw["repeatability"]["panels"]) or tuple(p.name for p in panels)),
        fleet=FleetSpec(**raw["fleet"]),
        weights=WeightsSpec(resolve(raw["weights"]["mirror"]) if raw["weights"]["mirror"] else None),
        scoring=ScoringSpec(**raw["scoring"]), raw=raw)


def load_study(path: Path, root: Path | None = None) -> StudySpec:
    """Load, validate and type a study config file. ``root`` defaults to the file's project
    (the parent of its ``config/`` directory)."""
    path = Path(path).resolve()
    if root is None:
        root = path.parent.parent if path.parent.name == "config" else path.parent
    return study_from_raw(load_yaml(path), root, source=str(path))
