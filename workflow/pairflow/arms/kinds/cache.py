"""Kind ``cache``: a training-free transformer cache (a diffusers cache config, e.g.
FirstBlockCache, Pyramid Attention Broadcast), enabled for the arm's video and disabled
in ``finally``.

Config: ``cache: {class, params}``. Checked before any model loads: the class exists in
the installed diffusers, its parameters have the right names and types (``cache_params``)
and the transformer of the model the arm runs takes it (``supported_caches``, probed on
the ``meta`` device). Digest and records: ``cache_class`` and ``cache_params``, present
for every arm (None and {} for an arm without a cache), as they always were.
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import difflib
import functools
import json
import logging
import types
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

from ...errors import ConfigError
from ...specs import ArmSpec, ModelSpec
from ..base import ArmKind, ParseContext


def cache_class(arm: ArmSpec) -> Any:
    """The installed diffusers cache config class an arm names. Raises ConfigError naming
    the arm, the class, the installed diffusers version and the classes it has."""
    import diffusers  # heavy: only checks and workers import it, never planning

    cls = getattr(diffusers, arm.cache_class or "", None)
    if cls is None or not dataclasses.is_dataclass(cls):
        known = _cache_names()
        hint = difflib.get_close_matches(arm.cache_class or "", known, n=1)
        raise ConfigError(f"arm {arm.name!r}: key 'arms/{arm.name}/cache/class' is {arm.cache_class!r}, which "
                          f"diffusers {diffusers.__version__} does not have"
                          + (f"; did you mean {hint[0]!r}?" if hint else ".") + f" Cache configs: {known}")
    return cls


def cache_params(arm: ArmSpec, cls: Any) -> dict[str, Any]:
    """The arm's cache parameters type-checked against ``cls``'s dataclass fields and
    converted where YAML cannot say it (a list for a tuple field). Raises ConfigError
    naming the arm, the key, the expected and the given type; callbacks and private fields
    are PairFlow's to set, never the config's."""
    hints = typing.get_type_hints(cls)
    settable = sorted(f.name for f in dataclasses.fields(cls)
                      if not f.name.startswith("_") and not _is_callable(hints[f.name]))
    out = {}
    for key, value in arm.cache_params.items():
        where = f"arm {arm.name!r}: key 'arms/{arm.name}/cache/params/{key}'"
        if key not in settable:
            hint = difflib.get_close_matches(key, settable, n=1)
            raise ConfigError(f"{where}: {cls.__name__} has no settable parameter {key!r}"
                              + (f"; did you mean {hint[0]!r}?" if hint else ".") + f" Allowed: {settable}")
        converted = _typed(value, hints[key])
        if converted is _BAD:
            raise ConfigError(f"{where} is {value!r} ({type(value).__name__}); {cls.__name__} expects "
                              f"{_type_name(hints[key])}. Fix the value in the config")
        out[key] = converted
    return out


_BAD = object()


def _is_callable(hint: Any) -> bool:
    return any(typing.get_origin(h) is collections.abc.Callable or h is collections.abc.Callable
               for h in (hint, *typing.get_args(hint)))


def _type_name(hint: Any) -> str:
    if getattr(hint, "__args__", None):
        return str(hint).replace("typing.", "")
    # get_type_hints resolves every hint, so one without __args__ is a class with a __name__.
    return str(getattr(hint, "__name__", hint))


def _typed(value: Any, hint: Any) -> Any:
    """``value`` (from YAML) as ``hint`` wants it, or ``_BAD``. Only the shapes diffusers'
    cache configs use: int, float, bool, str, None, unions, tuple[T, T], tuple[T, ...], list[T]."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is type(None):
        return None if value is None else _BAD
    if origin in (typing.Union, types.UnionType):
        for h in args:
            got = _typed(value, h)
            if got is not _BAD:
                return got
        return _BAD
    if hint is bool:
        return value if isinstance(value, bool) else _BAD
    if hint is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _BAD
    if hint is float:
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else _BAD
    if hint is str:
        return value if isinstance(value, str) else _BAD
    if origin in (tuple, list) and isinstance(value, (list, tuple)):
        if origin is tuple and args and args[-1] is not Ellipsis and len(args) != len(value):
            return _BAD
        each = [args[0] if (origin is list or args[-1] is Ellipsis) else a
                for a in (args if origin is tuple and args[-1] is not Ellipsis else [None] * len(value))]
        pairs = zip(value, each, strict=False)
        items = [_typed(v, h) if h is not None else v for v, h in pairs] if args else list(value)
        return _BAD if any(i is _BAD for i in items) else (tuple(items) if origin is tuple else items)
    return _BAD  # tensors, dtypes, modules: not expressible in a config


class _Support(dict[str, bool]):
    """Cache class name -> True for the caches a transformer takes; ``refused`` holds why
    each other one was refused, followed by the list of those that apply."""

    refused: dict[str, str]


@functools.lru_cache(maxsize=8)
def supported_caches(model: ModelSpec) -> _Support:
    """Which of the installed diffusers' cache configs the model's transformer takes:
    each is enabled (with its defaults, and a timestep callback where it needs one) on
    the transformer built from its config on the ``meta`` device (no weights, no
    memory), exactly as ``enable_cache`` would at run time, then disabled. Returns a
    mapping whose keys are the classes that apply, with ``refused`` naming why each other
    class failed (its error, plus the list that applies). Configs whose defaults cannot be
    built (MagCache needs calibrated ratios) count as applying when the transformer's
    blocks are ones diffusers registers; their params are checked at run time."""
    import torch  # heavy: only checks import it

    cls = transformer_class(model)
    config = json.loads(model.root.joinpath("transformer", "config.json").read_text())
    with torch.device("meta"):
        transformer = cls.from_config({k: v for k, v in config.items() if not k.startswith("_")})
    out = _Support()
    refused: dict[str, str] = {}
    quiet = logging.getLogger("diffusers")  # the probe's default-config warnings are not the user's
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        _probe(transformer, out, refused)
    finally:
        quiet.setLevel(level)
    applies = sorted(out)
    out.refused = {k: f"{v}. Caches that apply to {cls.__name__}: {applies}" for k, v in refused.items()}
    return out


def _probe(transformer: Any, out: dict[str, bool], refused: dict[str, str]) -> None:
    """Enable and disable each cache config on ``transformer`` (see ``supported_caches``)."""
    import diffusers  # heavy: only checks import it

    for name in _cache_names():
        ccls = getattr(diffusers, name)
        kwargs: dict[str, Any] = {}
        if "current_timestep_callback" in {f.name for f in dataclasses.fields(ccls)}:
            kwargs["current_timestep_callback"] = lambda: 500
        try:
            cfg = ccls(**kwargs)
        except (ValueError, TypeError):
            out[name] = True  # needs calibrated params; diffusers checks them when enabling
            continue
        try:
            transformer.enable_cache(cfg)
            out[name] = True
        except (ValueError, TypeError, KeyError, AttributeError, NotImplementedError) as e:
            refused[name] = f"{type(e).__name__}: {e}"
        finally:
            if transformer.is_cache_enabled:
                transformer.disable_cache()


def _cache_names() -> list[str]:
    import diffusers  # heavy: only checks import it

    return sorted(n for n in dir(diffusers) if n.endswith("Config") and dataclasses.is_dataclass(
        getattr(diffusers, n)) and ("Cache" in n or "Broadcast" in n))


def transformer_config(model: ModelSpec) -> Path | None:
    """The model's ``transformer/config.json`` (for a hub mirror, in the pinned snapshot
    of the Hugging Face cache layout), or None when it is not on disk yet."""
    config = model.root / "transformer" / "config.json"
    return config if config.is_file() else None


def transformer_class(model: ModelSpec) -> Any:
    """The model's transformer class named in ``transformer/config.json`` (for a hub
    mirror, in the pinned snapshot of the Hugging Face cache layout), or None when the
    model is not on disk yet (the embedded model is built by a rule)."""
    import diffusers  # heavy: only checks import it

    config = transformer_config(model)
    if config is None:
        return None
    name = json.loads(config.read_text()).get("_class_name", "")
    cls = getattr(diffusers, name, None)
    if cls is None:
        raise ConfigError(f"model {model.path}: its transformer class {name!r} is not in diffusers "
                          f"{diffusers.__version__}; install the diffusers version the checkpoint needs")
    return cls


def cache_config(arm: ArmSpec, pipe: Any) -> Any:
    """Build the diffusers cache config object an arm names, or None for no cache.

    Configs that need the pipeline's current timestep (PAB, FasterCache) get a callback
    bound to ``pipe``; everything else comes from the arm's params (see ``cache_params``).
    """
    if arm.cache_class is None:
        return None
    cls = cache_class(arm)
    params = cache_params(arm, cls)
    if "current_timestep_callback" in {f.name for f in dataclasses.fields(cls)}:
        params["current_timestep_callback"] = lambda: pipe.current_timestep
    return cls(**params)


class Cache(ArmKind):
    name = "cache"
    rank = 10
    keys = ("cache",)
    attrs: ClassVar[Mapping[str, Any]] = {"cache": "cache_class"}
    order = 2  # enabled last, once scheduler and attention backend are in place
    docs = "a diffusers cache config (class and params) enabled on the transformer"
    schema: ClassVar[Mapping[str, Any]] = {"cache": {
        "oneOf": [{"type": "null"}, {
            "type": "object", "additionalProperties": False, "required": ["class"],
            "properties": {
                "class": {"type": "string", "description": (
                    "a cache config class of the installed diffusers (e.g. FirstBlockCacheConfig, "
                    "PyramidAttentionBroadcastConfig, FasterCacheConfig, MagCacheConfig, TaylorSeerCacheConfig); "
                    "checked against diffusers and the model's transformer before any model loads")},
                "params": {"type": "object", "default": {}, "description": (
                    "the class's fields; names and types are checked against the dataclass before any model "
                    "loads (callbacks are set by PairFlow)")}}}]}}
    record_schema: ClassVar[Mapping[str, Any]] = {"cache_class": {"type": ["string", "null"]},
                                                  "cache_params": {"type": "object"}}

    def parse(self, raw: Mapping[str, Any], ctx: ParseContext) -> dict[str, Any]:
        cache = raw.get("cache") or {}
        return {"cache_class": cache.get("class"), "cache_params": dict(cache.get("params", {}))}

    def fields(self, arm: ArmSpec) -> dict[str, Any]:
        # Every arm carries these two (None and {} without a cache): the identity arms always had.
        return {"cache_class": arm.cache_class, "cache_params": arm.cache_params}

    def check(self, arm: ArmSpec, model: ModelSpec, device: str) -> None:
        """The class exists, its parameters fit it, and the transformer of the model the arm
        runs (its own ``model`` or the study's) takes it; skipped for a model not on disk yet
        (the embedded model is built by a rule: checked when it loads)."""
        cache_params(arm, cache_class(arm))
        m = arm.model or model
        transformer = transformer_class(m)
        if transformer is None:
            return
        from diffusers.models.cache_utils import CacheMixin  # heavy: only checks import it

        if not issubclass(transformer, CacheMixin):
            raise ConfigError(f"arm {arm.name!r}: the model's transformer {transformer.__name__} "
                              f"({m.path}) does not support diffusers caches (no enable_cache); use a "
                              "model whose transformer does, or run only the control arm")
        supported = supported_caches(m)
        if arm.cache_class not in supported:
            raise ConfigError(f"arm {arm.name!r}: key 'arms/{arm.name}/cache/class' is {arm.cache_class!r}, which "
                              f"diffusers cannot apply to {transformer.__name__} ({m.path}): "
                              f"{supported.refused.get(arm.cache_class or '', '')}")

    @contextlib.contextmanager
    def apply(self, arm: ArmSpec, pipe: Any, device: str) -> Iterator[None]:
        config = cache_config(arm, pipe)
        pipe.transformer.enable_cache(config)
        try:
            yield
        finally:
            pipe.transformer.disable_cache()


KIND = Cache()
