"""The study config: YAML → JSON-schema validation with defaults → frozen dataclasses.

The schema (``workflow/schemas/config.schema.yaml``) is the single source of keys,
types and defaults. This module is the one validator: ``common.smk`` calls
``check_config_files`` and ``study_from_raw`` (as ``pairflow check-config`` does) rather
than ``snakemake.utils.validate``, so every entry point refuses a config with the same
one-line messages.
Unknown keys are errors, and so is a key written twice in one mapping (YAML would keep
the last silently). Relative paths (storage, model, sheets, the weight mirror) resolve
against the project root the caller passes: every entry point passes the working
directory Snakemake runs in (``pairflow check-config --directory``, default the current
one), never the config file's own folder.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import json
import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import best_match

from ..arms import registry as arm_registry
from ..arms.base import ParseContext
from ..errors import ConfigError
from ..identity import digest_bytes, digest_obj
from ..layout import Layout
from ..metrics import METRICS
from ..specs import ArmSpec as ArmSpec
from ..specs import GenerationSpec as GenerationSpec
from ..specs import ModelSpec as ModelSpec
from ..specs import SearchSpec as SearchSpec

if TYPE_CHECKING:
    from collections.abc import Iterator

    from jsonschema.exceptions import ValidationError
    from jsonschema.protocols import Validator

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "config.schema.yaml"
MAX_CONFIG_BYTES = 1 << 20
"""A config larger than this (1 MiB) is refused: no study needs it, a YAML bomb does."""
MAX_SHEET_BYTES = 64 << 20
"""A prompt sheet larger than this (64 MiB) is refused before it is read: 100k prompts of
600 bytes, the largest panel benchmarked, take 60 MB."""
MAX_PROMPT_BYTES = 8 << 10
"""A prompt longer than this (8 KiB of UTF-8) is refused: text encoders read a few
hundred tokens (Wan's umT5 512, CogVideoX 226), about 2 KiB of English; beyond 8 KiB a
cell is a paste or export mistake, not a prompt."""
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
_NAME = re.compile(NAME_PATTERN)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
"""Unicode's control characters (category Cc): none belongs in a one-line prompt."""
RESERVED_NAMES = frozenset({"CON", "PRN", "AUX", "NUL", *(f"{d}{i}" for d in ("COM", "LPT") for i in range(10))})
"""Device names Windows reserves as file and folder names, whatever the case and with any
extension (``NUL.json`` is the device too). ``NAME_PATTERN`` already keeps out dots,
spaces and so a trailing dot or space, which Windows strips."""
CASE_INSENSITIVE = "macOS, Windows, SMB shares and some object stores"
"""Where two names that differ only by case are one file."""


def reserved_name(name: str) -> bool:
    """Whether ``name`` (a study, arm or panel name: a file or folder name in the
    results tree) is a device name Windows reserves (``RESERVED_NAMES``), in any case and
    with any extension."""
    return name.split(".", 1)[0].upper() in RESERVED_NAMES


def check_names(raw: dict[str, Any], source: str) -> None:
    """Refuse a study, arm or panel name (each a folder of the results tree) that is a
    reserved device name on Windows, and two arm or panel names that differ only by case
    (one folder on a case-insensitive file system). Raises ConfigError naming the key,
    the value(s), the config and the fix."""
    named = [("study", raw["study"], "study")]
    named += [(f"arms/{a}", a, "arm") for a in raw["arms"]] + [(f"panels/{p}", p, "panel") for p in raw["panels"]]
    for key, name, what in named:
        if reserved_name(name):
            raise ConfigError(f"{source}: key {key!r}: {what} name {name!r} is a device name Windows reserves "
                              "(CON, PRN, AUX, NUL, COM0-9, LPT0-9, in any case), and it names a folder of the "
                              f"results tree, which could then not be copied there; rename the {what}")
    for group, what in (("arms", "arm"), ("panels", "panel")):
        folded: dict[str, str] = {}
        for name in raw[group]:
            other = folded.setdefault(name.lower(), name)
            if other != name:
                raise ConfigError(f"{source}: {what}s {other!r} ({group}/{other}) and {name!r} ({group}/{name}) differ "
                                  f"only by case; each names a folder of the results tree, and on a case-insensitive "
                                  f"file system ({CASE_INSENSITIVE}) the two are one folder; rename one of them")


@dataclass(frozen=True)
class Prompt:
    prompt_id: str
    text: str

    @functools.cached_property
    def digest(self) -> str:
        """The prompt text's digest (computed once per prompt)."""
        return digest_bytes(self.text.encode("utf-8"))


@dataclass(frozen=True)
class PanelSpec:
    """A panel: its sheet, seeds and the prompts the study runs. ``held``: the sheet's
    prompts a group-sequential study has not released (it stopped before them, or has not
    reached their look: ``sequential``); ``planned`` is every prompt of the sheet."""

    name: str
    sheet: Path
    seeds: tuple[int, ...]
    prompts: tuple[Prompt, ...]
    held: tuple[Prompt, ...] = ()

    @property
    def planned(self) -> tuple[Prompt, ...]:
        """The sheet's prompts in release order (the sheet's order): the planned maximum."""
        return self.prompts + self.held

    def released(self, n: int) -> PanelSpec:
        """This panel with only its first ``n`` planned prompts released."""
        every = self.planned
        return PanelSpec(self.name, self.sheet, self.seeds, every[:n], every[n:])


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
    """The ``stats`` keys, as ``stats.analyse`` takes them. ``resamples`` and ``seed``:
    the sign-flip test's Monte Carlo draws beyond exact enumeration (exact while 2^n <=
    resamples); ``level``: the intervals' confidence (the family's error rate is 1 -
    level); ``missing``: ``error`` or ``drop-pair`` for a pair without a partner;
    ``power``: the planning's target power; ``margins``: NR metric name to the largest loss
    that still counts as not worse (metric units, direction from the metric); ``floors``:
    FR metric name to the value it must clear (a minimum, or a maximum for a lower-is-better
    metric); ``multiplicity``: ``holm`` or ``bh`` across every (arm, metric) test."""

    resamples: int
    level: float
    seed: int
    missing: str = "error"
    power: float = 0.8
    margins: dict[str, float] = field(default_factory=dict, hash=False)
    floors: dict[str, float] = field(default_factory=dict, hash=False)
    multiplicity: Literal["holm", "bh"] = "holm"


@dataclass(frozen=True)
class TimingSpec:
    warmup: int
    repeats: int
    pairs: int | str = "auto"  # "auto" (sequential), "all", or pairs timed per panel (a seeded sample)
    seed: int = 0
    precision: float = 0.02
    """``pairs: auto``: the relative half-width each arm's speedup interval is timed to."""
    pilot_prompts: int = 5
    """``pairs: auto``: prompts timed first, whose spread decides how many more are timed."""
    max_prompts: int = 64
    """``pairs: auto``: the most prompts timed for any arm (the ceiling)."""
    max_cv: float = 0.05
    max_temperature_c: float = 78.0
    """A timed run on a GPU above this temperature (C), or while it throttled, is flagged."""


@dataclass(frozen=True)
class RepeatSpec:
    replicates: int
    panels: tuple[str, ...]


@dataclass(frozen=True)
class FleetSpec:
    """How fanned-out tasks run: CPU workers where no accelerator was granted, task
    retries, seconds an idle block waits before it is released, NVML sampling period,
    seconds without a finished task or a worker's progress report after which a job
    fails as stalled (counted from the first worker ready; start-up has its own limit),
    and whether a panel's generation and scoring share one job."""

    cpu_workers: int
    retries: int
    idle_timeout_s: int = 120
    nvml_interval_s: float = 2.0
    stall_timeout_s: float = 600.0
    panel_jobs: str = "combined"
    """``combined``: one job per panel generates and scores; ``per-stage``: one job per stage."""
    startup_timeout_s: float = 1800.0
    """Seconds a job may take to start (worker pool, imports, model load) before its stall
    clock (``stall_timeout_s``) starts; longer fails it as stalled in start-up."""
    site: str = "auto"
    """Where the work runs (``sites``): ``auto`` (Slurm inside a Slurm job, else local),
    ``local`` or ``slurm``."""
    budget_gpu_hours: float | None = None
    """The most slot-hours the study may cost by ``estimate``; None: no budget guard."""
    calibrate: bool = True
    """Make the calibration table (rule ``calibrate``) and the estimate (rule ``estimate``)
    before the fan-out; false: neither, no budget guard, one worker per GPU."""
    packing_headroom: float = 0.2
    """Share of a device's (or host's) memory kept free when packing workers (``calibrate.packing``)."""
    packing: str = "calibrated"
    """``calibrated``: workers per GPU (CPU workers per node) from the calibration table
    where one exists (``calibrate.workers_for``); ``one``: one worker per GPU and
    ``cpu_workers`` on CPU, whatever the table says."""
    allocation: str = "per-panel"
    """``per-panel``: one scheduler job per panel; ``study``: one (multi-node) job
    generates and scores every panel from one queue (rule ``fleet_study``)."""
    worker_start: str = "auto"
    """``forkserver``: a pool's workers are forked from a server that already imported
    torch, diffusers, pyiqa and the model's modules (``workerpool``); ``spawn``: Parsl's
    pool on the spawn context (also through ``workerpool``, so its processes die with the
    pool's manager), each worker a fresh interpreter; ``auto`` (default): forkserver where the job
    has no GPU, spawn where it has (``sites.base.worker_start`` says why)."""


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
    decode: str = "bt709"
    clip_precision: str = "auto"


@dataclass(frozen=True)
class ReportSpec:
    """What follows the study table and gallery: ``tracker`` is ``none`` or ``mlflow``
    (rule ``track``, ``pairflow.report.tracker``); ``tracker_uri`` the MLflow tracking URI, or
    None for MLflow's own (``MLFLOW_TRACKING_URI``)."""

    tracker: Literal["none", "mlflow"] = "none"
    tracker_uri: str | None = None


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
    report: ReportSpec = ReportSpec()

    def __getstate__(self) -> dict[str, Any]:
        # Pickles (job contexts, named by their bytes' digest) never carry the memos below.
        return {k: v for k, v in self.__dict__.items() if k not in ("_panels_by_name", "_candidates_digest")}

    @functools.cached_property
    def _panels_by_name(self) -> dict[str, PanelSpec]:
        # Input functions ask for a panel once per job: a scan would be quadratic in panels.
        return {p.name: p for p in self.panels}

    def panel(self, name: str) -> PanelSpec:
        p = self._panels_by_name.get(name)
        if p is None:
            raise ConfigError(f"panel {name!r} is not in the config; known: {[p.name for p in self.panels]}")
        return p

    @property
    def treatments(self) -> tuple[ArmSpec, ...]:
        """The declared arms other than control: the questions of the study's family (an
        iso-compute control, ``ArmSpec.derived_for``, is read against its arms instead)."""
        return tuple(a for a in self.arms if not a.is_control and not a.derived_for)

    @property
    def iso_compute(self) -> bool:
        """``iso_compute/enabled``: each acceleration arm is also read against plain steps of
        equal compute (``analysis.isocompute``)."""
        return bool(self.raw.get("iso_compute", {}).get("enabled"))

    @property
    def declared_arms(self) -> tuple[ArmSpec, ...]:
        """The arms the config declares, without the ones the study derived (what keys the
        arms' check and the calibration table: a derivation never invalidates them)."""
        return tuple(a for a in self.arms if not a.derived_for)

    @property
    def sequential(self) -> SequentialSpec | None:
        """``sequential``: the group-sequential looks over prompts, None when off."""
        q = self.raw.get("sequential", {})
        if not q.get("enabled"):
            return None
        return SequentialSpec(tuple(float(f) for f in q["looks"]), q["spending"], float(q["gamma"]),
                              q["multiplicity"])

    def panel_digest(self, name: str) -> str:
        """Digest of what defines one panel's candidates: study, model, arms, generation,
        encoder, and this panel's seeds and planned prompts (not other panels; a
        group-sequential release does not change it)."""
        p = self.panel(name)
        return digest_obj({"study": self._candidates_digest,
                           "seeds": list(p.seeds), "prompts": [[q.prompt_id, q.digest] for q in p.planned]})

    def at_look(self, look: int) -> StudySpec:
        """This study with only the prompts released by look ``look`` (1-based) of
        ``sequential``: each panel's first ``look_counts`` prompts."""
        counts = look_counts(self)[look - 1]
        return dataclasses.replace(self, panels=tuple(p.released(counts[p.name]) for p in self.panels))

    @functools.cached_property
    def _candidates_digest(self) -> str:
        # The study-wide part of every panel's digest, computed once (not once per panel).
        return self.subtree_digest("study", "model", "arms", "generation", "encoder")

    def subtree_digest(self, *keys: str) -> str:
        """Digest of the named config subtrees (what produced a record)."""
        return digest_obj({k: self.raw.get(k) for k in keys})


def _schema() -> dict[str, Any]:
    """The config schema: ``config.schema.yaml`` with every arm kind's keys and the
    precision enum filled in from ``pairflow.arms``, and the scorers' enum from
    ``pairflow.metrics`` (the one declaration of each)."""
    schema: dict[str, Any] = arm_registry.config_schema(yaml.safe_load(SCHEMA_PATH.read_text()))
    schema["properties"]["scorers"]["items"]["enum"] = list(METRICS)
    return schema


def _validator() -> Validator:
    # jsonschema's documented recipe for filling defaults while validating
    # (Snakemake's validate(set_default=True) does the same with the same schema).
    base = Draft202012Validator

    def set_defaults(validator: Validator, properties: dict[str, Any], instance: Any,
                     schema: dict[str, Any]) -> Iterator[ValidationError]:
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if "default" in sub and key not in instance:
                    instance[key] = copy.deepcopy(sub["default"])  # plain YAML data: a fresh copy
        yield from base.VALIDATORS["properties"](validator, properties, instance, schema)

    # types-jsonschema leaves validators.extend unannotated; it returns a validator class.
    extended: type[Validator] = validators.extend(  # type: ignore[no-untyped-call]
        base, {"properties": set_defaults})
    return extended(_schema())


def _where(path: Any) -> str:
    return "/".join(str(p) for p in path) or "<top level>"


def _message(e: Any) -> str:
    """One line for one schema error: the key, the value, what is allowed, a close match."""
    if e.validator in ("oneOf", "anyOf") and e.context:  # say why the branch of the right type failed
        typed = [c for c in e.context if c.validator != "type"]
        if typed:
            return _message(best_match(typed))
    where = _where(e.absolute_path)
    if e.validator == "additionalProperties" and isinstance(e.instance, dict):
        allowed = sorted(e.schema.get("properties", {}))
        parts = []
        for key in sorted(set(e.instance) - set(allowed), key=str):
            hint = difflib.get_close_matches(str(key), allowed, n=1)
            parts.append(f"  key {(where + '/' if e.absolute_path else '') + str(key)!r} is not a PairFlow "
                         f"setting" + (f"; did you mean {hint[0]!r}?" if hint else "")
                         + f" Allowed under {where!r}: {allowed}")
        if parts:
            return "\n".join(parts)
    allowed_values = e.schema.get("enum")
    hint = (difflib.get_close_matches(str(e.instance), [str(v) for v in allowed_values], n=1)
            if allowed_values else [])
    allowed = allowed_values or e.schema.get("pattern") or e.schema.get("type")
    desc = e.schema.get("description", "")
    return (f"  key {where!r}: {e.message}" + (f" (allowed: {allowed})" if allowed else "")
            + (f"; did you mean {hint[0]!r}?" if hint else "") + (f" -- {desc}" if desc else ""))


def validate_raw(raw: Any, source: str) -> dict[str, Any]:
    """Validate a parsed config mapping against the schema, filling defaults in place.

    Raises ConfigError naming the key, the offending value and what is allowed, with a
    close match for a misspelt key or value.
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the config must be a YAML mapping, got {type(raw).__name__}")
    errors = sorted(_validator().iter_errors(raw), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        lines = [_message(e) for e in errors[:10]]
        raise ConfigError(f"{source}: invalid config; see docs/configuration.md\n" + "\n".join(lines))
    unknown = set(raw["repeatability"]["panels"]) - set(raw["panels"])
    if unknown:
        raise ConfigError(f"{source}: key 'repeatability/panels' names {sorted(unknown)}, which are not "
                          f"panels; known panels: {sorted(raw['panels'])}")
    gen = raw["generation"]
    if (gen["frames"] - 1) % 4:
        raise ConfigError(f"{source}: key 'generation/frames' is {gen['frames']}; Wan's VAE "
                          "compresses time by 4, so frames must be 4k+1 (e.g. 9, 17, 81)")
    fleet = raw["fleet"]
    if raw["sequential"]["enabled"] and (fleet["allocation"] == "study" or fleet["panel_jobs"] != "combined"):
        raise ConfigError(f"{source}: key 'sequential/enabled' is true with fleet/allocation "
                          f"{fleet['allocation']!r} and fleet/panel_jobs {fleet['panel_jobs']!r}; group-sequential "
                          "looks run one job per panel and look that generates and scores (fleet/allocation: "
                          "per-panel, fleet/panel_jobs: combined); set those, or sequential/enabled: false")
    looks = raw["sequential"]["looks"]
    if any(not a < b for a, b in zip([0.0, *looks], looks, strict=False)) or looks[-1] != 1:
        raise ConfigError(f"{source}: key 'sequential/looks' is {looks}; give increasing fractions of each "
                          "panel's prompts in (0, 1] ending at 1, e.g. [0.5, 1] or [0.25, 0.5, 0.75, 1]")
    if fleet["allocation"] == "study" and fleet["panel_jobs"] != "combined":
        raise ConfigError(f"{source}: key 'fleet/allocation' is 'study' but 'fleet/panel_jobs' is "
                          f"{fleet['panel_jobs']!r}; the study-wide job generates and scores in one pool, so set "
                          "fleet/panel_jobs: combined (or fleet/allocation: per-panel)")
    if raw["model"]["kind"] == "hub-mirror" and not (raw["model"].get("id") and raw["model"].get("revision")):
        raise ConfigError(f"{source}: model kind 'hub-mirror' needs both 'model/id' and "
                          "'model/revision' (a pinned commit), read from the local mirror at 'model/path'")
    return raw


def _clip(text: str, n: int = 60) -> str:
    """``text`` for a message: its repr, cut to about ``n`` characters (a 10 MB cell stays one line)."""
    return repr(text) if len(text) <= n else f"{text[:n]!r}... ({len(text)} characters)"


def _decode(data: bytes, path: Path, fix: str) -> str:
    """``data`` as UTF-8 text, or ConfigError naming the file, the line and column of the
    first NUL byte or invalid byte, and ``fix`` (what to point at the right file)."""
    def at(offset: int) -> str:
        line, column = data.count(b"\n", 0, offset) + 1, offset - data.rfind(b"\n", 0, offset)
        return f"{path}:{line}: byte {column}"

    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ConfigError(f"{path}:1: the file is UTF-16 (it starts with a UTF-16 byte-order mark); save it as "
                          f"UTF-8 (e.g. iconv -f UTF-16 -t UTF-8), or {fix}")
    if data.startswith(b"\xef\xbb\xbf"):
        raise ConfigError(f"{path}:1: the file starts with a UTF-8 byte-order mark (as some spreadsheet "
                          "programs write); save it as UTF-8 without one")
    nul = data.find(b"\x00")
    if nul >= 0:
        raise ConfigError(f"{at(nul)} is a NUL byte: this is a binary file (or UTF-16 text), not UTF-8 text; "
                          f"{fix}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{at(e.start)} (0x{data[e.start]:02x}) is not valid UTF-8; save the file as UTF-8 "
                          f"(e.g. iconv -f latin1 -t UTF-8), or {fix}") from None


def _refuse_duplicate_keys(node: yaml.Node, source: str) -> None:
    """Refuse a mapping, at any depth, that writes one key twice: YAML would keep the last
    silently (an arm defined twice runs once, with the second definition). Names the key
    path and both lines. Each node is visited once, so aliases cost nothing extra."""
    keys = yaml.SafeLoader("")  # constructs scalar keys as the loader will (1 == 1.0, 'a' != 1)
    found: list[str] = []
    stack: list[tuple[yaml.Node, tuple[str, ...]]] = [(node, ())]
    seen: set[int] = set()
    while stack:
        n, where = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, yaml.SequenceNode):
            stack.extend((v, (*where, str(i))) for i, v in enumerate(n.value))
        elif isinstance(n, yaml.MappingNode):
            first: dict[Any, int] = {}
            for k, v in n.value:
                if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:merge":
                    key = keys.construct_object(k)
                    line = k.start_mark.line + 1
                    if key in first:
                        found.append(f"  key {'/'.join((*where, str(k.value)))!r} is written twice, at lines "
                                     f"{first[key]} and {line}")
                    else:
                        first[key] = line
                stack.append((v, (*where, str(k.value))))
    keys.dispose()
    if found:
        raise ConfigError(f"{source}: a key written twice in one mapping; YAML would keep only the last and "
                          "silently drop the first. Keep one (rename one if you meant two arms or panels):\n"
                          + "\n".join(sorted(found)[:10]))


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML ``text`` with ``safe_load``'s rules, refusing duplicate keys at any depth
    (ConfigError naming ``source``, the key path and both lines) and malformed YAML."""
    # libyaml's loader where PyYAML was built with it (same rules, ~10x faster), else Python's
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_duplicate_keys(node, source)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML: {e}") from e
    finally:
        loader.dispose()


def load_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML config safely: size-capped, UTF-8, ``safe_load`` rules, no key written
    twice, a mapping. Raises ConfigError naming the file, the line and the fix."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: config is {size} bytes, over the {MAX_CONFIG_BYTES}-byte limit; "
                              "a study config is a few KiB, check you passed the right file")
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist (relative paths start in {Path.cwd()}); "
                          "check the path") from None
    except OSError as e:
        raise ConfigError(f"config file {path} cannot be read: {e.strerror}; check the path and its "
                          "permissions") from None
    raw = parse_yaml(_decode(data, path, "check you passed the study config"), str(path))
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the config must be a YAML mapping, got {type(raw).__name__}")
    return raw


def check_config_files(paths: list[str] | tuple[str, ...]) -> None:
    """Read every config file as ``load_yaml`` does, for an entry point that parsed them
    with a plain YAML loader (Snakemake's ``configfile``), which keeps the last of two
    equal keys. Raises ConfigError for the first file that fails."""
    for p in paths:
        load_yaml(Path(p))


def read_sheet(path: Path, panel: str, written: str | None = None, root: Path | None = None) -> tuple[Prompt, ...]:
    """Read a prompt sheet: UTF-8 text, TSV with header ``prompt_id<TAB>prompt``, one
    prompt per line, at most ``MAX_SHEET_BYTES`` in all and ``MAX_PROMPT_BYTES`` per prompt.

    Raises ConfigError naming the sheet, the line and the fix for a missing or unreadable
    file, a binary file (NUL bytes), invalid UTF-8, a missing header, a row without
    exactly two fields, an unsafe or duplicate prompt id (or two that differ only by
    case), an empty or oversize prompt, or a control character in a prompt. ``written``
    and ``root``: the key's value as written, when relative, and the folder it resolved
    against (the project), which a missing sheet's message names.
    """
    key = f"'panels/{panel}/sheet'"
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"panel {panel!r}: prompt sheet {path} is not a regular file (a directory, device "
                              f"or pipe); point {key} at a TSV file")
        if st.st_size > MAX_SHEET_BYTES:
            raise ConfigError(f"panel {panel!r}: prompt sheet {path} is {st.st_size} bytes, over the "
                              f"{MAX_SHEET_BYTES}-byte limit; split it into several panels, or check {key} "
                              "names the sheet")
        data = path.read_bytes()
    except FileNotFoundError:
        where = (f" ({key} is {written!r}, resolved against {root}, the directory snakemake runs in: run from the "
                 "project folder, or give snakemake and pairflow --directory PROJECT)"
                 if written is not None and root is not None else "")
        raise ConfigError(f"panel {panel!r}: prompt sheet {path} does not exist{where}; create it "
                          f"(TSV with columns prompt_id and prompt) or fix {key}") from None
    except OSError as e:
        raise ConfigError(f"panel {panel!r}: prompt sheet {path} cannot be read: {e.strerror}; check {key} "
                          "and the file's permissions") from None
    lines = _decode(data, path, f"point {key} at the prompt sheet (TSV text)").split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline
    lines = [line[:-1] if line.endswith("\r") else line for line in lines]  # CRLF sheets read as LF ones
    if not lines or lines[0] != "prompt_id\tprompt":
        raise ConfigError(f"{path}:1: the first line must be the header 'prompt_id<TAB>prompt', got "
                          f"{_clip(lines[0]) if lines else 'an empty file'}; add that header line")
    prompts: list[Prompt] = []
    seen: dict[str, tuple[str, int]] = {}  # case-folded id: the id as written, its line
    for lineno, line in enumerate(lines[1:], start=2):
        if not line:
            continue
        row = line.split("\t")
        if len(row) != 2:
            raise ConfigError(f"{path}:{lineno}: expected 2 tab-separated fields (prompt_id, prompt), got "
                              f"{len(row)}; a prompt may not hold a tab, and each row needs both fields")
        pid, text_ = row
        if not _NAME.fullmatch(pid):
            raise ConfigError(f"{path}:{lineno}: prompt_id {_clip(pid)} is not allowed; use 1-64 ASCII "
                              "letters, digits, '-' and '_' (no path separators, dots or spaces)")
        first, first_line = seen.get(pid.lower(), (None, 0))
        if first == pid:
            raise ConfigError(f"{path}:{lineno}: prompt_id {pid!r} appears twice (first on line {first_line}); ids "
                              "must be unique")
        if first is not None:
            raise ConfigError(f"{path}:{lineno}: prompt_id {pid!r} differs from {first!r} (line {first_line}) only by "
                              f"case; each names files of the results tree, and on a case-insensitive file system "
                              f"({CASE_INSENSITIVE}) their files are one file; rename one of them")
        size = len(text_.encode("utf-8"))
        if size > MAX_PROMPT_BYTES:
            raise ConfigError(f"{path}:{lineno}: prompt {pid!r} is {size} bytes, over the {MAX_PROMPT_BYTES}-byte "
                              "limit per prompt (text encoders read a few hundred tokens); shorten it")
        bad = _CONTROL.search(text_)
        if bad is not None:
            raise ConfigError(f"{path}:{lineno}: prompt {pid!r} holds the control character "
                              f"U+{ord(bad.group()):04X} at character {bad.start() + 1}; a prompt is one line of "
                              "printable text, remove it")
        if not text_.strip():
            raise ConfigError(f"{path}:{lineno}: prompt {pid!r} is empty; write the prompt or remove the row")
        seen[pid.lower()] = (pid, lineno)
        prompts.append(Prompt(pid, text_))
    if not prompts:
        raise ConfigError(f"{path}: no prompts; add at least one row under the header")
    return tuple(prompts)


def study_from_raw(raw: dict[str, Any], root: Path, source: str = "config",
                   prompts: dict[str, tuple[Prompt, ...]] | None = None) -> StudySpec:
    """Validate ``raw`` and build the typed StudySpec, resolving paths against ``root``.
    ``prompts`` (panel name → prompts) replaces reading the sheets, for a study rebuilt
    from the config snapshot its manifests record (``provenance.study_from_snapshot``)."""
    raw = validate_raw(raw, source)
    check_names(raw, source)
    root = Path(root).resolve()

    def resolve(p: str) -> Path:
        return (root / p).resolve()

    for key, value in (("storage/scratch", raw["storage"]["scratch"]), ("storage/work", raw["storage"]["work"]),
                       ("model/path", raw["model"]["path"])):
        check_location(key, value, resolve(value), root, source)

    for key in ("margins", "floors"):
        unknown = sorted(set(raw["stats"][key]) - set(raw["scorers"]))
        if unknown:
            raise ConfigError(f"{source}: stats/{key} names {unknown}, which "
                              f"{'is' if len(unknown) == 1 else 'are'} not among scorers {list(raw['scorers'])}; "
                              "add the metric to scorers or remove the entry")
    m = raw["model"]
    model = ModelSpec(kind=m["kind"], path=resolve(m["path"]), id=m.get("id"), revision=m.get("revision"))
    arms = tuple(arm_from_raw(name, a, resolve, root, source) for name, a in raw["arms"].items())
    sheets = {name: resolve(p["sheet"]) for name, p in raw["panels"].items()}  # once a panel: a realpath each
    relative = {name: (p["sheet"], root) for name, p in raw["panels"].items() if not os.path.isabs(p["sheet"])}
    panels = tuple(PanelSpec(name, sheets[name], tuple(p["seeds"]),
                             prompts[name] if prompts is not None else
                             read_sheet(sheets[name], name, *relative.get(name, (None, None))))
                   for name, p in raw["panels"].items())
    if raw["sequential"]["enabled"]:
        _check_looks(panels, raw["sequential"]["looks"], source)
        panels = _release(panels, raw, resolve(raw["storage"]["scratch"]))
    if raw.get("iso_compute", {}).get("enabled"):
        if raw["fleet"].get("calibrate") is False:
            raise ConfigError(f"iso_compute/enabled is true but fleet/calibrate is false in {source}: the "
                              "equal-compute step counts are derived from the calibration's counted FLOPs; set "
                              "fleet/calibrate to true or iso_compute/enabled to false")
        taken = sorted(a.name for a in arms if a.name.startswith(ISO_PREFIX))
        if taken:
            raise ConfigError(f"arm name(s) {taken} in {source} start with {ISO_PREFIX!r}, which names the "
                              "iso-compute controls the study derives; rename them")
        arms = arms + derived_arms(resolve(raw["storage"]["scratch"]), arms)
    if raw["fleet"].get("budget_gpu_hours") is not None and raw["fleet"].get("calibrate") is False:
        raise ConfigError(f"fleet/budget_gpu_hours is {raw['fleet']['budget_gpu_hours']} but fleet/calibrate is false "
                          f"in {source}: the budget guard needs the calibration table's estimate; set fleet/calibrate "
                          "to true or remove fleet/budget_gpu_hours")
    check_storage_disjoint(
        [("storage/scratch", raw["storage"]["scratch"], resolve(raw["storage"]["scratch"])),
         ("storage/work", raw["storage"]["work"], resolve(raw["storage"]["work"])),
         ("model/path", m["path"], model.path),
         *((f"arms/{a.name}/model/path", raw["arms"][a.name]["model"]["path"], a.model.path)
           for a in arms if a.model is not None)], root, source)
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
        scoring=ScoringSpec(**raw["scoring"]), raw=raw, report=ReportSpec(**raw["report"]))


@dataclass(frozen=True)
class SequentialSpec:
    """``sequential``: ``looks`` (fractions of each panel's prompts released at each look,
    the last 1), the alpha-spending function and its ``gamma`` (Hwang-Shih-DeCani), and how
    the questions share alpha (``analysis.groupseq``)."""

    looks: tuple[float, ...]
    spending: Literal["obf", "pocock", "hsd"]
    gamma: float
    multiplicity: Literal["bonferroni", "holm"]


LOOK_FORMAT = "pairflow-look/1"
"""The format of a look's decision file (``Layout.look``; ``stages.steps.decide_look``)."""


def look_counts(study: StudySpec) -> list[dict[str, int]]:
    """Per look, each panel's prompts released by then: ``ceil(fraction * planned)`` of
    its sheet, in the sheet's order (at least 1 prompt a panel from the first look)."""
    seq = study.sequential
    if seq is None:
        return [{p.name: len(p.planned) for p in study.panels}]
    return [{p.name: _released(f, len(p.planned)) for p in study.panels} for f in seq.looks]


def _released(fraction: float, planned: int) -> int:
    """A panel's prompts released at ``fraction``: ``ceil(fraction * planned)``, at least 1."""
    return max(1, math.ceil(fraction * planned - 1e-9))


def planned_digest(panels: tuple[PanelSpec, ...] | list[PanelSpec], looks: list[float]) -> str:
    """What a look's decision file must match to release prompts: every panel's planned
    prompts and seeds, and the looks' fractions (a changed sheet or design ignores it)."""
    panel = {p.name: [list(p.seeds), [[q.prompt_id, q.digest] for q in p.planned]] for p in panels}
    return digest_obj({"looks": [float(f) for f in looks], "panels": panel})


def stop_decision(scratch: Path, panels: tuple[PanelSpec, ...] | list[PanelSpec],
                  looks: list[float]) -> dict[str, Any] | None:
    """The decision file of the look a group-sequential study stopped at (``Layout.look``):
    the first that says it stopped and matches ``panels``' planned prompts and ``looks``
    (one of a changed sheet or design is ignored); None before any stop. Raises
    ConfigError naming an unreadable file and the fix."""
    looks_dir = Layout(scratch).looks
    if not looks_dir.is_dir():
        return None
    want = planned_digest(panels, looks)
    for path in sorted(looks_dir.glob("look-*.json"), key=lambda q: (len(q.name), q.name)):
        data = _read_decision(path)
        if data.get("format") != LOOK_FORMAT or data.get("planned") != want or not data.get("stop"):
            continue
        try:
            bad = [v for v in data["released"].values() if int(v) < 1]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"{path} cannot be read ({e}): {_REDECIDE}") from None
        if bad:
            raise ConfigError(f"{path} releases {data['released']}: counts must be positive; {_REDECIDE}")
        return dict(data)
    return None


def _check_looks(panels: tuple[PanelSpec, ...], looks: list[float], source: str) -> None:
    """Refuse looks the design cannot test: a first look of fewer than 2 prompts over every
    panel, or two looks releasing the same prompts (``look_counts``' rounding)."""
    totals = [sum(_released(f, len(p.planned)) for p in panels) for f in looks]
    if totals[0] < 2:
        raise ConfigError(f"{source}: key 'sequential/looks' is {looks}: its first look releases {totals[0]} prompt "
                          "over every panel, and no test decides on fewer than 2; add prompts or start later "
                          "(e.g. looks: [0.5, 1])")
    same = [(looks[i], looks[i + 1]) for i in range(len(looks) - 1) if totals[i] == totals[i + 1]]
    if same:
        raise ConfigError(f"{source}: key 'sequential/looks' is {looks}: looks {same[0][0]} and {same[0][1]} release "
                          f"the same {totals[looks.index(same[0][0])]} prompts over every panel (each panel releases "
                          "ceil(fraction x its prompts)); space the looks further apart or add prompts")


_REDECIDE = "it is rule look's decision; remove it and rerun, which decides that look again from its records"


def _read_decision(path: str | Path) -> dict[str, Any]:
    """A look's decision file as a JSON object; ConfigError naming the file and the fix."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} cannot be read ({e}): {_REDECIDE}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} cannot be read (a JSON {type(data).__name__}, not an object): {_REDECIDE}")
    return data


def look_stops(path: str | Path) -> bool:
    """Whether a look's decision file says the study stops there."""
    data = _read_decision(path)
    if "stop" not in data:
        raise ConfigError(f"{path} cannot be read (no key 'stop'): {_REDECIDE}")
    return bool(data["stop"])


def _release(panels: tuple[PanelSpec, ...], raw: dict[str, Any], scratch: Path) -> tuple[PanelSpec, ...]:
    """The panels as a stopped group-sequential study released them (``stop_decision``);
    before any stop, every planned prompt (each look's job releases its own,
    ``StudySpec.at_look``)."""
    stop = stop_decision(scratch, panels, list(raw["sequential"]["looks"]))
    if stop is None:
        return panels
    return tuple(p.released(int(stop["released"].get(p.name, len(p.planned)))) for p in panels)


ISO_PREFIX = "iso-steps-"
"""The name of an iso-compute control: ``iso-steps-<k>``, the control's pipeline at k steps."""


def derived_arms(scratch: Path, declared: tuple[ArmSpec, ...]) -> tuple[ArmSpec, ...]:
    """The iso-compute controls rule calibrate derived (``Layout.iso_compute``), as plain
    arms of ``k`` steps, each naming the declared arms it is the equal-compute control of;
    none before calibration; a control of arms the config no longer declares is left out.
    Raises ConfigError naming the file and the fix when it cannot be read."""
    path = Layout(scratch).iso_compute
    if not path.is_file():
        return ()
    try:
        data = json.loads(path.read_text())
        rows = [(str(a["name"]), int(a["steps"]), tuple(str(f) for f in a["for"])) for a in data["arms"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path} cannot be read ({e}): it is rule calibrate's, and no plan can be made "
                          "while it is there; remove it, then rerun with `snakemake --forcerun calibrate`, which "
                          "writes it again") from None
    names = {a.name for a in declared}
    out = []
    for name, steps, of in rows:
        of = tuple(a for a in of if a in names)
        if of:  # a control of arms no longer declared is dropped (the next calibration rewrites the file)
            out.append(ArmSpec(name, steps=steps, derived_for=of))
    return tuple(out)


SYSTEM_DIRS = ("/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot", "/proc",
               "/sys", "/dev", "/var/lib")
"""Trees a study never writes into or reads a model from (with ``/`` itself)."""
SOURCE_DIRS = ("workflow", "config", "tests")
"""The project's source folders: no storage or model path may lie inside them."""


def check_location(key: str, value: str, path: Path, root: Path, source: str) -> None:
    """Refuse a storage or model path (``value`` as written, ``path`` resolved) that is
    ``/``, a system directory or inside one, inside the project's source folders, or a
    relative path that climbs out of the project. Raises ConfigError naming the key."""
    def inside(p: Path, top: Path) -> bool:
        return p == top or top in p.parents

    bad = None
    if path == Path("/"):
        bad = "the file system root"
    elif any(inside(path, Path(d)) for d in SYSTEM_DIRS):
        bad = f"a system directory (refused: /, {', '.join(SYSTEM_DIRS)})"
    elif any(inside(path, root / d) for d in SOURCE_DIRS):
        bad = f"inside the project's source folders ({', '.join(SOURCE_DIRS)}/)"
    elif not os.path.isabs(value) and os.path.normpath(value).split(os.sep)[0] == "..":
        bad = (f"outside the project {root} by a relative path; write an absolute path if you mean a "
               "place outside the project")
    if bad:
        raise ConfigError(f"{source}: key {key!r} is {value!r}, which resolves to {path}: {bad}. Point it at "
                          "a directory of its own (e.g. results/scratch, or an absolute path on your scratch "
                          "file system)")


def check_storage_disjoint(roots: list[tuple[str, str, Path]], project: Path, source: str) -> None:
    """Refuse storage roots that overlap: ``storage/scratch``, ``storage/work``, the model
    folder and every student model folder (``roots``: key, value as written, resolved
    path) must each be disjoint from the others (neither equal nor nested: a folder
    swapped in or cleaned takes the other's files with it) and from the project root
    (neither the project itself nor a folder holding it). Two model keys may name the
    same folder (one checkpoint used twice). Raises ConfigError naming both keys."""
    def nested(a: Path, b: Path) -> bool:
        return a == b or a in b.parents or b in a.parents

    for key, value, path in roots:
        if path == project or path in project.parents:
            raise ConfigError(f"{source}: key {key!r} is {value!r}, which resolves to {path}: "
                              + ("the project root itself" if path == project else f"a folder holding the project "
                                 f"{project}") + f"; storage and model folders must be disjoint from the project "
                              f"root. Point {key!r} at a folder of its own (e.g. results/scratch)")
    for i, (key_a, value_a, a) in enumerate(roots):
        for key_b, value_b, b in roots[i + 1:]:
            models = key_a.endswith("model/path") and key_b.endswith("model/path")
            if not nested(a, b) or (models and a == b):
                continue
            how = "is the same folder as" if a == b else "lies inside" if b in a.parents else "holds"
            raise ConfigError(f"{source}: key {key_a!r} ({value_a!r}, {a}) {how} key {key_b!r} ({value_b!r}, {b}); "
                              f"storage and model folders must be disjoint (neither equal nor nested). Give "
                              f"{key_a!r} and {key_b!r} folders of their own, side by side (e.g. results/scratch "
                              "and results/work)")


def arm_from_raw(name: str, a: dict[str, Any], resolve: Any, root: Path, source: str) -> ArmSpec:
    """One validated arm mapping as an ArmSpec, each kind parsing its own keys
    (``ArmKind.parse``). Control must declare no change."""
    def model(key: str, m: dict[str, Any]) -> ModelSpec:
        check_location(key, m["path"], resolve(m["path"]), root, source)
        return ModelSpec(kind=m["kind"], path=resolve(m["path"]), id=m.get("id"), revision=m.get("revision"))

    arm = ArmSpec(name, **arm_registry.parse_arm(a, ParseContext(name, source, model)))
    kinds = arm_registry.declared_kinds(arm)
    if arm.is_control and kinds:
        named = ", ".join(repr(f"arms/control/{k}") for k in arm_registry.declared_keys(arm))
        raise ConfigError(f"{source}: arm 'control' sets {named}; control is the reference and "
                          "changes nothing. Move these keys to a treatment arm and leave 'arms/control' as "
                          "{cache: null}")
    if not arm.is_control and not kinds:
        keys = arm_registry.KEYS
        raise ConfigError(f"{source}: arm {name!r} declares no change ({', '.join(keys[:-1])} or {keys[-1]}); it "
                          "would be control again. Declare what it changes or remove it")
    return arm


def load_study(path: Path, root: Path | None = None) -> StudySpec:
    """Load, validate and type a study config file, resolving its relative paths against
    ``root``: the directory Snakemake runs in (every entry point passes its working
    directory). Without ``root``, a file at ``<project>/config/<name>`` resolves against
    ``<project>``; any other file needs ``root`` (ConfigError), since its own folder is
    not where Snakemake would resolve it."""
    path = Path(path).resolve()
    if root is None:
        if path.parent.name != "config":
            raise ConfigError(f"{path}: relative paths in a config resolve against the directory Snakemake runs "
                              "in; for a config outside a project's config/ folder, give that directory "
                              "(load_study(path, root))")
        root = path.parent.parent
    return study_from_raw(load_yaml(path), root, source=str(path))
