"""What a kind of arm is: the one interface every module of ``pairflow.arms`` implements.

A kind of change (a cache, generation overrides, an attention backend, a precision, a
student model, a search, ...) is one ``ArmKind`` object in its own module, registered in
``pairflow.arms.KINDS``. It owns:

- its config keys under ``arms.<arm>`` and their JSON schema (``keys``, ``schema``), which
  ``config`` injects into ``workflow/schemas/config.schema.yaml`` when it loads it;
- how those keys become the arm's values (``parse``) and which ``ArmSpec`` attribute
  holds each (``attrs``; a key with no attribute of its own lives in ``ArmSpec.extra``);
- its digest and record fields (``fields``, ``record_schema``: injected into
  ``record.common``'s ``$defs/arm``), so every key an arm sets enters its digest;
- its check before any model loads (``check``), its change to the generation settings
  (``effective``), its pipeline-load precision (``load_dtype``) and its apply-and-restore
  around one generation (``apply``, a context manager that restores in ``finally``);
- its section of the generation record (``section``), where it has one.

A kind's methods default to "nothing to do", so a module implements only what its change
needs. Nothing here imports torch or diffusers: planning reads the registry.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from ..specs import ArmSpec, GenerationSpec, ModelSpec


@dataclass(frozen=True)
class ParseContext:
    """What ``ArmKind.parse`` may need from the config loader: the arm's name, where the
    config came from (for messages) and ``model``, which turns a model mapping at a
    config key into a checked ``config.ModelSpec`` (paths resolved against the project)."""

    arm: str
    source: str
    model: Any  # Callable[[str, Mapping[str, Any]], ModelSpec]


class ArmKind:
    """One kind of change an arm can declare (see the module docstring). Subclass it,
    set the class attributes, override what the kind needs, and add an instance to
    ``pairflow.arms.KINDS``."""

    name: str = ""
    """The kind's name as records list it (``registry.declared_kinds``)."""
    rank: int = 100
    """Where the kind stands among the others (lowest first): the order of an arm's
    ``kinds``, of its keys in messages and of the checks."""
    keys: tuple[str, ...] = ()
    """Config keys under ``arms.<arm>`` this kind owns, in the order messages name them."""
    attrs: ClassVar[Mapping[str, str]] = {}
    """Config key -> ``ArmSpec`` attribute holding its value (default: the key itself)."""
    schema: ClassVar[Mapping[str, Any]] = {}
    """Config key -> its JSON schema (``config.schema.yaml``'s arm properties)."""
    record_schema: ClassVar[Mapping[str, Any]] = {}
    """Record field -> its JSON schema (``record.common``'s ``$defs/arm`` properties)."""
    docs: str = ""
    """One line for messages and ``docs/arms.md``: what the kind changes."""
    order: int = 5
    """Where ``apply`` enters among the arm's kinds (lowest first; restored in reverse)."""

    def value(self, arm: ArmSpec, key: str) -> Any:
        """The arm's value for one of this kind's config keys (None: as control)."""
        attr = self.attrs.get(key, key)
        return getattr(arm, attr) if hasattr(arm, attr) else arm.extra.get(key)

    def declared_keys(self, arm: ArmSpec) -> tuple[str, ...]:
        """This kind's keys the arm sets."""
        return tuple(k for k in self.keys if self.value(arm, k) is not None)

    def declared(self, arm: ArmSpec) -> bool:
        return bool(self.declared_keys(arm))

    def parse(self, raw: Mapping[str, Any], ctx: ParseContext) -> dict[str, Any]:
        """The arm's values for this kind from its validated config mapping ``raw``:
        ``ArmSpec`` attribute (or, for an ``extra`` key, config key) -> value. By default
        each key's value as written."""
        return {self.attrs.get(k, k): raw.get(k) for k in self.keys}

    def fields(self, arm: ArmSpec) -> dict[str, Any]:
        """What this kind adds to the arm's digest and records (``registry.arm_fields``); empty
        when the arm does not declare it, so arms without the kind keep their identity.
        By default each declared key's value."""
        return {k: self.value(arm, k) for k in self.declared_keys(arm)}

    def check(self, arm: ArmSpec, model: ModelSpec, device: str) -> None:
        """Refuse what can be known wrong before any model loads (ConfigError naming the
        arm, the key, the value and the fix). Runs only for arms that declare the kind."""

    def effective(self, arm: ArmSpec, gen: GenerationSpec) -> GenerationSpec:
        """The generation settings with this kind's overrides (default: unchanged)."""
        return gen

    def load_dtype(self, arm: ArmSpec) -> str | None:
        """The precision the arm's pipeline loads in, where this kind decides it."""
        return None

    @contextlib.contextmanager
    def apply(self, arm: ArmSpec, pipe: Any, device: str) -> Iterator[None]:
        """Change ``pipe`` for one generation of ``arm`` and restore it afterwards, also
        when the generation fails (``pipe`` is shared by every arm of a worker)."""
        yield

    def section(self, arm: ArmSpec, result: Any, model: ModelSpec) -> dict[str, Any]:
        """Top-level fields this kind adds to the arm's generation record (``result``:
        the ``armrun.ArmResult``; ``model``: the study's model). Default: none."""
        return {}


def device() -> str:
    """Where this process generates: ``cuda`` when torch can use a GPU, else ``cpu``."""
    import torch  # heavy: imported only where a device is asked for, never while planning

    return "cuda" if torch.cuda.is_available() else "cpu"
